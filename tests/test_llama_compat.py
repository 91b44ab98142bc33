"""farctx.Llama as a drop-in for llama_cpp.Llama, beyond what llama-cpp-python's own tests check
(tests/test_conformance.py): states and prompt caches for every method, past n_local and across Mesa's stair
moves; prompt-prefix reuse equal to a fresh run; a tokenizer-only load; n_ctx as the memory budget of a
fixed-cache method; embeddings; close and context-manager use."""

from __future__ import annotations

import contextlib
import pickle
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest
from helpers import random_tokens

import farctx

# the tiny model's trained context is 32 tokens: streams of 60-110 tokens cross n_local (32 by default) and chunk
# Mesa's prompt; its decoding then moves the stair every C = 32 - 2 * 4 = 24 tokens
METHOD_KWARGS: dict[str, dict[str, int]] = {
    "mesa": {"first_chunk": 4, "stair_width": 2, "last_context": 8, "gen_budget": 2},
    "selfextend": {"group": 4, "neighbor": 8},
}
N_PROMPT, N_MORE = 60, 40
F32_KV = {"type_k": "f32", "type_v": "f32"}


def make(model: Path, method: str, **kwargs: Any) -> farctx.Llama:
    kwargs = {"n_ctx": 256, "n_batch": 16, "n_ubatch": 16, "logits_all": True, **METHOD_KWARGS.get(method, {}),
              **kwargs}
    return farctx.Llama(str(model), method=method, **kwargs)


def caches(tmp_path: Path) -> dict[str, Any]:
    return {"ram": llama_cpp.LlamaRAMCache(capacity_bytes=2 << 30),
            "disk": llama_cpp.LlamaDiskCache(cache_dir=str(tmp_path / "disk-cache"))}


def greedy(llm: farctx.Llama, n: int) -> list[int]:
    """n greedy tokens after the stream, fed one at a time (as generation does)."""
    out = []
    for _ in range(n):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(token)
        llm.eval([token])
    return out


@pytest.mark.parametrize("cache_kind", ["ram", "disk"])
@pytest.mark.parametrize("method", farctx.METHODS)
def test_cached_state_continues_exactly(tiny_model: Path, tmp_path: Path, method: str, cache_kind: str) -> None:
    """A state saved past n_local (Mesa: after a chunked prompt), stored in llama_cpp's RAM or disk cache and
    loaded into another Llama that had read another stream, continues as the Llama it came from (the same tokens
    and counts, logits to float rounding), across Mesa's stair moves."""
    tokens = random_tokens(N_PROMPT + N_MORE, seed=71)
    cache = caches(tmp_path)[cache_kind]
    live = make(tiny_model, method, **F32_KV)
    live.eval(tokens[:N_PROMPT])
    cache[tokens[:N_PROMPT]] = live.save_state()
    state = cache[tokens[:N_PROMPT]]
    assert isinstance(state, farctx.engine.FarctxState) and state.method == live.method_params.describe()

    loaded = make(tiny_model, method, **F32_KV)
    loaded.eval(random_tokens(45, seed=72))  # a stream of its own, then replaced by the state
    loaded.load_state(state)
    assert loaded.n_tokens == N_PROMPT and loaded.stats()["n_past"] == N_PROMPT
    before = live.stats()
    for llm in (live, loaded):
        llm.eval(tokens[N_PROMPT:])
    got_live, got_loaded = greedy(live, 6), greedy(loaded, 6)
    n = live.n_tokens
    assert loaded.n_tokens == n and got_loaded == got_live
    # llama.cpp's state packs a stream's cells together: where eviction left holes, the loaded keys sit in other
    # cells and their attention sums in another order (float rounding; with an F16 cache the graph may also copy
    # the window's keys into one view where the live stream read them in place, rounding them once more)
    diff = np.abs(loaded.scores[:n] - live.scores[:n]).max()
    print(f"{method} {cache_kind}: max diff {diff:.3g}")
    assert diff <= 1e-4, f"{method}: the loaded stream differs by {diff}"
    after_live, after_loaded = live.stats(), loaded.stats()
    for key in ("n_past", "n_cells_used", "n_stair_moves", "n_cache_rotations", "n_local"):
        assert after_loaded[key] == after_live[key], (key, after_loaded, after_live)
    if method == "mesa":
        assert before["n_prompt_planned"] == N_PROMPT
        assert after_live["n_stair_moves"] > before["n_stair_moves"], "the continuation must cross a stair move"
    if method in ("lminf", "window", "streaming", "lambda-only"):
        assert after_live["n_cells_used"] < n, "the stream must have evicted keys"
    # the loaded stream is not just the live one's: the dirty stream it replaced gave other logits
    assert np.abs(loaded.scores[N_PROMPT] - make_scores(tiny_model, method, random_tokens(45, seed=72)
                                                        + tokens[N_PROMPT:N_PROMPT + 1])).max() > 1e-3
    live.close()
    loaded.close()


def make_scores(model: Path, method: str, tokens: list[int]) -> np.ndarray:
    with make(model, method) as llm:
        llm.eval(tokens)
        return np.array(llm.scores[len(tokens) - 1])


def completion(llm: farctx.Llama, prompt: list[int], n: int = 6) -> tuple[str, list[float]]:
    out = llm.create_completion(prompt, max_tokens=n, temperature=0.0, logprobs=1)
    choice = out["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


@pytest.mark.parametrize("method", farctx.METHODS)
def test_prompt_cache_hit_matches_a_fresh_run(tiny_model: Path, tmp_path: Path, method: str) -> None:
    """set_cache: a second Llama finds the first one's state for a shared prefix, loads it once, and completes a
    longer prompt as a Llama with no cache does (F32 cache: the same tokens, log-probabilities within 1e-4)."""
    tokens = random_tokens(N_PROMPT + 20, seed=73)
    kv = {"type_k": "f32", "type_v": "f32"}
    cache = llama_cpp.LlamaRAMCache(capacity_bytes=2 << 30)
    writer = make(tiny_model, method, **kv)
    writer.set_cache(cache)
    completion(writer, tokens[:N_PROMPT])

    reader = make(tiny_model, method, **kv)
    reader.set_cache(cache)
    loads = []
    original = reader.load_state
    reader.load_state = lambda state: (loads.append(state.n_tokens), original(state))[1]  # type: ignore[method-assign]
    text, logprobs = completion(reader, tokens)
    fresh_text, fresh_logprobs = completion(make(tiny_model, method, **kv), tokens)
    assert len(loads) == 1 and loads[0] > N_PROMPT  # the prompt and the first completion's tokens
    assert text == fresh_text
    assert np.abs(np.array(logprobs) - np.array(fresh_logprobs)).max() <= 1e-4, (logprobs, fresh_logprobs)


@pytest.mark.parametrize("method", ["vanilla", "lminf", "mesa", "dca"])
def test_prefix_reuse_matches_a_fresh_run(tiny_model: Path, method: str) -> None:
    """create_completion after another completion: the shared prefix is kept where that equals a fresh run (a
    stream read past n_local rewinds by replaying it); Mesa reads a prompt of another chunk plan from its start;
    dca's cache goes back to the layout of the phase it rewinds to."""
    tokens = random_tokens(N_PROMPT + 30, seed=74)
    kv = {"type_k": "f32", "type_v": "f32"}
    llm = make(tiny_model, method, **kv)
    for prompt in (tokens[:N_PROMPT], tokens[:N_PROMPT], tokens[: N_PROMPT + 30], tokens[: N_PROMPT - 10]):
        text, logprobs = completion(llm, prompt)
        fresh_text, fresh_logprobs = completion(make(tiny_model, method, **kv), prompt)
        assert text == fresh_text, (method, len(prompt))
        assert np.abs(np.array(logprobs) - np.array(fresh_logprobs)).max() <= 1e-4, (method, len(prompt))
        if method == "mesa":
            assert llm.stats()["n_prompt_planned"] == len(prompt)


def test_mesa_keeps_an_unchunked_prefix(tiny_model: Path) -> None:
    """Prompts Mesa does not chunk run as vanilla whatever their length: a longer one reuses the stream."""
    tokens = random_tokens(24, seed=75)
    llm = make(tiny_model, "mesa")
    completion(llm, tokens[:12], n=2)
    n_decode = llm.stats()["n_decode"]
    completion(llm, tokens, n=2)
    assert llm.stats()["n_prompt_planned"] == 12  # the stream was kept: not read again from its start
    assert llm.stats()["n_decode"] - n_decode <= 3  # the 12 new prompt tokens (one ubatch) and the generated


def test_stock_state_is_read_again_under_the_method(tiny_model: Path) -> None:
    """A state of llama_cpp.Llama carries no stream: farctx.Llama reads its tokens again under its method."""
    tokens = random_tokens(N_PROMPT + 10, seed=76)
    stock = llama_cpp.Llama(str(tiny_model), n_ctx=256, n_batch=16, n_ubatch=16, logits_all=True, verbose=False)
    stock.eval(tokens[:N_PROMPT])
    state = stock.save_state()
    stock.close()
    llm = make(tiny_model, "lminf")
    llm.load_state(state)
    assert llm.stats()["n_past"] == N_PROMPT
    llm.eval(tokens[N_PROMPT:])
    with make(tiny_model, "lminf") as fresh:
        fresh.eval(tokens[:N_PROMPT])
        fresh.eval(tokens[N_PROMPT:])
        assert np.array_equal(llm.scores[: len(tokens)], fresh.scores[: len(tokens)])


def test_state_of_another_method_is_refused(tiny_model: Path) -> None:
    tokens = random_tokens(20, seed=77)
    with make(tiny_model, "lminf") as a, make(tiny_model, "window") as b:
        a.eval(tokens)
        with pytest.raises(farctx.FarctxError, match="cannot load the state"):
            b.load_state(a.save_state())
    with make(tiny_model, "lminf", n_local=16) as c, make(tiny_model, "lminf", n_local=20) as d:
        c.eval(tokens)
        with pytest.raises(farctx.FarctxError, match="cannot load the state"):
            d.load_state(c.save_state())


def test_state_pickles(tiny_model: Path) -> None:
    """LlamaDiskCache pickles states: a FarctxState survives it whole."""
    with make(tiny_model, "mesa") as llm:
        llm.eval(random_tokens(N_PROMPT, seed=78))
        state = llm.save_state()
    again = pickle.loads(pickle.dumps(state))
    assert again.farctx_state == state.farctx_state and again.method == state.method
    assert again.n_tokens == state.n_tokens and bytes(again.llama_state) == bytes(state.llama_state)


@pytest.mark.parametrize("method", ["vanilla", "lminf", "mesa"])
def test_vocab_only_tokenizes(default_model: Path, method: str) -> None:
    """vocab_only=True: a tokenizer, whatever the method; evaluating is refused with the reason."""
    text = b"Hello, world! <|im_start|>user"
    with farctx.Llama(str(default_model), method=method) as full:
        want = full.tokenize(text, add_bos=True, special=True)
        want_plain = full.tokenize(text, special=False)
    with farctx.Llama(str(default_model), method=method, vocab_only=True) as vocab:
        assert vocab.tokenize(text, add_bos=True, special=True) == want
        assert vocab.tokenize(text, special=False) == want_plain != want
        assert vocab.detokenize(want) == full_detokenized(default_model, want)
        with pytest.raises(farctx.FarctxError, match="vocab_only"):
            vocab.eval(want)


def full_detokenized(model: Path, tokens: list[int]) -> bytes:
    with farctx.Llama(str(model), vocab_only=True) as llm:
        return llm.detokenize(tokens)


def test_n_ctx_is_a_memory_budget(default_model: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """lminf with n_ctx 4096 and no n_local on a model trained on 8192: the window is fitted into the cache and
    said once on stderr and in stats()."""
    with farctx.Llama(str(default_model), method="lminf", n_ctx=4096) as llm:
        stats = llm.stats()
        assert stats["window_fitted"] and stats["n_ctx"] == 4096
        assert stats["n_local"] == 4096 - 10 - 512  # cells - n_global - n_ubatch
        assert llm.method_params.n_local == stats["n_local"]
        llm.eval(llm.tokenize(b"The quick brown fox"))
    err = capfd.readouterr().err
    assert err.count("farctx: lminf: the KV cache of 4096 cells holds n_global 10 + n_local 3574 + n_ubatch 512") == 1
    with farctx.Llama(str(default_model), method="lminf") as default:  # no budget: the trained window
        assert default.stats()["n_local"] == 8192 and not default.stats()["window_fitted"]


def test_n_ctx_budget_below_the_minimum_is_refused(default_model: Path) -> None:
    """The context plan's refusal names every size: the least an unset window is fitted down to, or the n_local
    given; the ubatch the caller set is kept."""
    with pytest.raises(farctx.FarctxError, match="lminf needs 330 KV cells: n_global \\+ n_local \\+ n_ubatch = "
                       "10 \\+ 64 \\(the smallest window fitted to a cache; the default is 8192\\) \\+ 256; the KV "
                       "cache holds 256"):
        farctx.Llama(str(default_model), method="lminf", n_ctx=256, n_ubatch=256)
    with pytest.raises(farctx.FarctxError, match="lminf needs 8714 KV cells: n_global \\+ n_local \\+ n_ubatch = "
                       "10 \\+ 8192 \\+ 512; the KV cache holds 4096"):
        farctx.Llama(str(default_model), method="lminf", n_ctx=4096, n_local=8192, n_ubatch=512)


def test_embeddings(default_model: Path) -> None:
    """embed() is llama_cpp.Llama's (several sequences in one shared cache): vanilla embeds as stock does and the
    stream reads on afterwards; a farctx method is refused with the reason."""
    kwargs = {"n_ctx": 256, "n_batch": 64, "n_ubatch": 64, "embedding": True}
    with contextlib.closing(llama_cpp.Llama(str(default_model), verbose=False, **kwargs)) as stock:
        want = np.array(stock.embed("Hello World"))
    with farctx.Llama(str(default_model), **kwargs) as llm:
        tokens = llm.tokenize(b"The quick brown fox")
        llm.eval(tokens)
        assert np.array_equal(np.array(llm.embed("Hello World")), want)
        llm.eval(tokens)
        assert llm.n_tokens == llm.stats()["n_past"] == len(tokens)
    with pytest.raises(farctx.FarctxError, match="embed with method='vanilla'"):
        farctx.Llama(str(default_model), method="lminf", **kwargs)


def test_close_and_context_manager(tiny_model: Path) -> None:
    """close() frees the stream, context and model (a second call does nothing; using it after is refused);
    farctx.Llama is also a context manager (llama_cpp.Llama is not: contextlib.closing works for both)."""
    with make(tiny_model, "lminf") as llm:
        llm.eval(random_tokens(8, seed=79))
    assert llm._stream is None
    llm.close()
    with pytest.raises(farctx.FarctxError, match="closed"):
        llm.eval([1, 2])
    with contextlib.closing(make(tiny_model, "mesa")) as other:
        other.eval(random_tokens(8, seed=79))
    assert other._stream is None


def test_a_grammar_llama_cpp_refuses_is_an_error_not_a_crash(tiny_model: Path) -> None:
    """llama.cpp's grammar sampler is NULL for a grammar it cannot parse; stock llama_cpp.Llama puts that NULL in
    its sampler chain and the process dies at the first sample. farctx.Llama refuses the grammar and goes on."""
    with make(tiny_model, "lminf") as llm:
        with pytest.raises(farctx.FarctxError, match="GBNF parser refused"):
            llm.create_completion("Hello", max_tokens=2, grammar=llama_cpp.LlamaGrammar.from_string("root ::= [a-"))
        good = llama_cpp.LlamaGrammar.from_string('root ::= "yes" | "no"')
        assert llm.create_completion("Hello", max_tokens=4, temperature=0, grammar=good)["choices"][0]["text"] in \
            ("yes", "no")


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
PERSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                 "required": ["name", "age"]}


def chat_answers(llm: Any) -> dict[str, Any]:
    """What create_chat_completion gives for a JSON schema, a forced tool call and a streamed answer."""
    ask = [{"role": "user", "content": "Describe a person called Ann, aged 31."}]
    schema = llm.create_chat_completion(ask, max_tokens=32, temperature=0.0,
                                        response_format={"type": "json_object", "schema": PERSON_SCHEMA})
    tool = llm.create_chat_completion([{"role": "user", "content": "What is the weather in Paris?"}],
                                      tools=[WEATHER_TOOL], max_tokens=24, temperature=0.0,
                                      tool_choice={"type": "function", "function": {"name": "get_weather"}})
    hello = [{"role": "user", "content": "Say hello."}]
    whole = llm.create_chat_completion(hello, max_tokens=12, temperature=0.0)["choices"][0]["message"]["content"]
    pieces = "".join(chunk["choices"][0]["delta"].get("content") or ""
                     for chunk in llm.create_chat_completion(hello, max_tokens=12, temperature=0.0, stream=True))
    return {"schema": schema["choices"][0]["message"]["content"],
            "tool": tool["choices"][0]["message"]["tool_calls"][0]["function"],
            "whole": whole, "streamed": pieces}


@pytest.fixture(scope="module")
def stock_chat(default_model: Path) -> dict[str, Any]:
    with contextlib.closing(llama_cpp.Llama(str(default_model), n_ctx=1024, n_batch=64, n_ubatch=64,
                                            verbose=False)) as stock:
        return chat_answers(stock)


@pytest.mark.parametrize("method", ["vanilla", "lminf", "mesa"])
def test_chat_schema_tools_and_streaming_as_stock(default_model: Path, stock_chat: dict[str, Any],
                                                  method: str) -> None:
    """create_chat_completion with a JSON schema, a forced tool call and stream=True: inside the trained context
    every method answers as stock llama_cpp.Llama (lminf with its window fitted into n_ctx 1024)."""
    import json

    with farctx.Llama(str(default_model), method=method, n_ctx=1024, n_batch=64, n_ubatch=64) as llm:
        got = chat_answers(llm)
    assert got == stock_chat
    person = json.loads(got["schema"])
    assert set(person) >= {"name", "age"} and isinstance(person["age"], int)
    assert got["tool"]["name"] == "get_weather" and "city" in json.loads(got["tool"]["arguments"])
    assert got["streamed"] == got["whole"] != ""


@pytest.mark.parametrize("method", ["lminf", "mesa"])
def test_n_ctx_0_is_the_methods_own_size(default_model: Path, method: str) -> None:
    """n_ctx=0 (llama_cpp: the trained context) is the context plan's cache: a fixed-cache method's own size (head +
    the trained window + n_ubatch); an extrapolating whole-stream one 4 x the trained context, or the stream it is
    told of (n_prompt + n_predict)."""
    with farctx.Llama(str(default_model), method=method, n_ctx=0, n_prompt=1000, n_predict=24) as llm:
        assert llm.n_ctx() == (1024 if method == "mesa" else (10 + 8192 + 512 + 255) // 256 * 256)
    with farctx.Llama(str(default_model), method=method, n_ctx=0, n_ubatch=64, n_batch=64) as llm:
        assert llm.n_ctx() == (4 * 8192 if method == "mesa" else (10 + 8192 + 64 + 255) // 256 * 256)
        assert llm.plan.n_ctx_seq == llm.n_ctx() and llm.plan.n_ubatch == 64
        assert not llm.stats()["window_fitted"]
        assert llm.create_completion("Hello", max_tokens=2, temperature=0.0)["usage"]["completion_tokens"] == 2
