"""farctx.Llama is a drop-in for llama_cpp.Llama: completions, chat, streaming, eval with scores."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest
from helpers import random_tokens

import farctx


def test_vanilla_past_the_trained_context_says_so_once(tiny_model, capfd):
    """As llama.cpp warns of a context past the trained one: once per stream, naming the default that reads past it."""
    llm = farctx.Llama(str(tiny_model), method="vanilla", n_ctx=256)
    try:
        llm.eval(random_tokens(30, seed=3))
        assert "warning" not in capfd.readouterr().err
        llm.eval(random_tokens(10, seed=4))
        llm.eval(random_tokens(10, seed=5))
        err = capfd.readouterr().err
        assert err.count("farctx: warning: vanilla read 40 tokens, past the model's trained context (32)") == 1, err
        assert "--method auto (the default) reads past it" in err
    finally:
        llm.close()


def test_is_a_llama_cpp_llama(tiny_model):
    llm = farctx.Llama(str(tiny_model), n_ctx=128)
    assert isinstance(llm, llama_cpp.Llama)
    assert llm.method_params.method == "auto"  # the default: stock inside the trained context
    assert llm.method_params.n_ctx_train == 32  # resolved from the GGUF
    assert llm.method_params.n_local == 32
    llm.close()


def test_completion_chat_and_stream_agree(tiny_model):
    llm = farctx.Llama(str(tiny_model), n_ctx=256, seed=3)
    plain = llm.create_completion("Hello there", max_tokens=8, temperature=0)
    streamed = "".join(c["choices"][0]["text"] for c in llm("Hello there", max_tokens=8, temperature=0, stream=True))
    assert plain["object"] == "text_completion"
    assert plain["choices"][0]["text"] == streamed
    chat = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0)
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert chat["usage"]["completion_tokens"] <= 4
    llm.close()


def test_eval_fills_scores_and_stats(tiny_model):
    llm = farctx.Llama(str(tiny_model), n_ctx=128, logits_all=True, progress=None)
    tokens = random_tokens(50)
    seen = []
    llm.progress = lambda done, total: seen.append((done, total))
    llm.eval(tokens)
    assert llm.n_tokens == 50 and list(llm.input_ids[:50]) == tokens
    assert np.isfinite(llm.scores[:50]).all() and np.abs(llm.scores[:50]).max() > 0
    assert seen and seen[-1] == (50, 50)
    stats = llm.stats()
    assert stats["n_past"] == 50 and stats["n_cells_used"] == 50 and stats["kv_bytes"] > 0
    llm.reset()
    llm.eval(tokens[:10])  # a reset stream starts again at position 0
    assert llm.stats()["n_cells_used"] == 10
    llm.close()


def test_progress_callback_can_cancel_without_losing_the_stream(tiny_model):
    llm = farctx.Llama(str(tiny_model), n_ctx=256, n_batch=16, n_ubatch=16)
    llm.eval(random_tokens(20))

    def stop(done: int, total: int) -> None:
        raise KeyboardInterrupt

    llm.progress = stop
    try:
        llm.eval(random_tokens(100, seed=2))
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the cancel did not propagate")
    assert llm.n_tokens == 20 and llm.stats()["n_cells_used"] == 20
    llm.close()


def test_default_model_loads_without_a_path():
    llm = farctx.Llama(n_ctx=64)
    assert llm.model_path == str(farctx.default_model_path())
    llm.close()


def test_sliding_window_models_run_every_method(tmp_path, default_model):
    """Gemma 3 style (interleaved sliding-window layers): every method runs (on the full-attention layers)."""
    from tiny_gguf import TinyConfig, write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "gemma3.gguf", default_model, TinyConfig(arch="gemma3"))
    info = farctx.model_info(path)
    assert info.sliding_window == 8
    assert set(farctx.method_support(info).values()) == {"yes"}
    for method in ("vanilla", "lminf", "streaming"):
        llm = farctx.Llama(str(path), method=method, n_ctx=256)
        assert llm.create_completion("Hello", max_tokens=2, temperature=0)["usage"]["completion_tokens"] <= 2
        llm.close()


@pytest.mark.parametrize("arch", ["gpt2", "mamba"])
def test_models_without_rope_or_attention_run_vanilla_and_refuse_the_methods(tmp_path, default_model, arch):
    """No RoPE (GPT-2) or no attention (Mamba): vanilla runs, and so does auto (the default), which says why; every
    other method is refused with the reason."""
    from refused_gguf import write_gpt2_gguf, write_mamba_gguf

    writer = {"gpt2": write_gpt2_gguf, "mamba": write_mamba_gguf}[arch]
    path = writer(tmp_path / f"{arch}.gguf", default_model)
    reason = {"gpt2": "no RoPE", "mamba": "recurrent layers"}[arch]
    support = farctx.method_support(farctx.model_info(path))
    assert support.pop("vanilla") == "yes"
    assert support.pop("auto") == f"as vanilla: {reason}"
    assert set(support.values()) == {f"no: {reason}"}
    llm = farctx.Llama(str(path), n_ctx=64)
    assert llm.method_params.method == "vanilla"
    assert llm.create_completion("Hello", max_tokens=2, temperature=0)["usage"]["completion_tokens"] <= 2
    llm.close()
    for method in support:
        with pytest.raises(farctx.FarctxError, match=f"{method} cannot run on this model \\({reason}\\)"):
            farctx.Llama(str(path), method=method)


def test_progress_line_counts_each_prompt_from_its_own_start(tiny_model):
    """One Progress serves every prompt an engine reads (eval niah, chat): each prompt's rate and ETA count from its
    own start, not from the engine's first prompt."""
    import io
    import time

    from farctx.progress import Progress

    out = io.StringIO()
    line = Progress("prefill", stream=out, interval=0.0)
    line.start -= 1000.0  # as if the engine had read another prompt for 1000 s
    llm = farctx.Llama(str(tiny_model), n_ctx=256, n_batch=16, n_ubatch=16, progress=line)
    t0 = time.monotonic()
    llm.eval(random_tokens(64, seed=4))
    took = time.monotonic() - t0
    rates = [float(x.split(" tok/s")[0].rsplit(", ", 1)[1].replace(",", "")) for x in out.getvalue().splitlines()]
    assert rates and min(rates) >= 16 / max(took, 1e-3) * 0.5, (rates, took)  # not 64 tokens over 1000 s
    llm.close()
