"""Prompts and generations longer than the cache: methods with a fixed-size cache stream through it,
vanilla refuses clearly (llama-cpp-python's behaviour)."""

from __future__ import annotations

import json

import pytest
from helpers import run_cli

import farctx

TEXT = " ".join(f"Line {k}: the quick brown fox jumps over the lazy dog." for k in range(120))


@pytest.mark.parametrize("method", ["lminf", "streaming", "window"])
def test_completion_past_the_cache(tiny_model, method):
    llm = farctx.Llama(str(tiny_model), method=method, n_batch=64, n_ubatch=64)  # cache: auto-sized
    n_prompt = len(llm.tokenize(TEXT.encode()))
    assert n_prompt > 4 * llm.n_ctx()
    out = llm.create_completion(TEXT, max_tokens=8, temperature=0)
    assert out["usage"]["prompt_tokens"] == n_prompt
    assert out["usage"]["completion_tokens"] == 8  # not cut to what the cache holds
    stats = llm.stats()
    assert stats["n_past"] == n_prompt + 7
    assert stats["n_cells_used"] <= llm.n_ctx() == 256  # 10 + 32 + 64, rounded up by llama.cpp
    llm.close()


def test_vanilla_prompt_past_the_cache_is_a_clear_error(tiny_model):
    llm = farctx.Llama(str(tiny_model), n_ctx=256)
    with pytest.raises(ValueError, match="exceed context window"):
        llm.create_completion(TEXT, max_tokens=4)
    llm.close()


def test_cli_streams_a_long_prompt_file(tmp_path, tiny_model):
    prompt = tmp_path / "long.txt"
    prompt.write_text(TEXT)
    result = run_cli("generate", "-m", str(tiny_model), "-f", str(prompt), "-n", "6", "--temp", "0",
                     "--method", "lminf", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["prompt_tokens"] > 1000
    assert report["stats"]["n_cells_used"] <= report["stats"]["n_ctx"] < report["prompt_tokens"]
    vanilla = run_cli("generate", "-m", str(tiny_model), "-f", str(prompt), "-n", "6", "-c", "256")
    assert vanilla.returncode == 1 and "exceed context window" in vanilla.stderr


@pytest.mark.parametrize("method, extra", [
    ("mesa", ["--first-chunk", "4", "--stair-width", "2", "--last-context", "8", "--gen-budget", "2"]),
    ("selfextend", []),
    ("dca", []),
    ("rerope", []),
])
def test_cli_sizes_the_cache_for_whole_stream_methods(tmp_path, tiny_model, method, extra):
    prompt = tmp_path / "long.txt"
    prompt.write_text(TEXT[:3000])
    result = run_cli("generate", "-m", str(tiny_model), "-f", str(prompt), "-n", "5", "--temp", "0",
                     "--method", method, "--json", *extra)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["stats"]["n_ctx"] >= report["prompt_tokens"] + 5 > 4 * 32
    assert report["stats"]["n_past"] == report["prompt_tokens"] + 4


def test_whole_stream_method_with_a_small_cache_is_refused(tiny_model):
    llm = farctx.Llama(str(tiny_model), method="mesa", n_ctx=256, first_chunk=4, stair_width=2, last_context=8,
                       gen_budget=2)
    with pytest.raises(farctx.NoSpaceError, match="enlarge the cache"):
        llm.eval(list(range(1000, 1300)))
    llm.close()
