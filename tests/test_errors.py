"""Bad input: one clear line from the CLI (no traceback, non-zero exit), a FarctxError from Python."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import random_tokens, run_cli

import farctx


@pytest.fixture(scope="module")
def broken_files(tmp_path_factory, tiny_model) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("broken")
    truncated = folder / "truncated.gguf"
    truncated.write_bytes(tiny_model.read_bytes()[: tiny_model.stat().st_size // 2])
    not_gguf = folder / "notes.gguf"
    not_gguf.write_text("this is not a model\n")
    empty = folder / "empty.gguf"
    empty.write_bytes(b"")
    return {"truncated": truncated, "not_gguf": not_gguf, "empty": empty, "missing": folder / "missing.gguf"}


CASES = {
    "missing": "model file not found",
    "truncated": "not within the file bounds",
    "not_gguf": "not a GGUF file",
    "empty": "not a GGUF file",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_bad_model_file(broken_files, case):
    result = run_cli("generate", "-m", str(broken_files[case]), "-p", "hello", "-n", "1")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("farctx: error: ") and CASES[case] in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_python_bad_model_file(broken_files, case):
    with pytest.raises(farctx.FarctxError, match=CASES[case]):
        farctx.Llama(str(broken_files[case]))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--method", "nonsense"], "Invalid value for '--method'"),
        (["--n-global", "-3"], "Invalid value for '--n-global'"),
        (["-ngl", "lots"], "'lots' is not a number or 'all'"),
        (["-ctv", "q8_0"], "needs flash attention"),
    ],
)
def test_cli_bad_parameters(tiny_model, args, message):
    result = run_cli("generate", "-m", str(tiny_model), "-p", "hello", "-n", "1", *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_cli_no_prompt(tiny_model):
    result = run_cli("generate", "-m", str(tiny_model))
    assert result.returncode == 2
    assert result.stderr.strip() == "farctx: error: no prompt: give -p TEXT or -f FILE (- for stdin)"


def test_empty_prompt_is_an_error_not_an_assert(tiny_model):
    """The bundled tokenizer adds no BOS: an empty prompt has no token to continue (llama_cpp asserts)."""
    result = run_cli("generate", "-m", str(tiny_model), "-p", "", "-n", "2")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == \
        "farctx: error: the prompt is empty: it has no tokens to continue (this model adds no BOS token)"
    with farctx.Llama(str(tiny_model), method="lminf", n_ctx=256, n_ubatch=16) as llm:
        with pytest.raises(farctx.FarctxError, match="the prompt is empty"):
            llm.create_completion("", max_tokens=2)
        assert llm.create_completion("Hi", max_tokens=2)["usage"]["completion_tokens"] == 2


def test_python_bad_parameters_past_32_bits(tiny_model):
    with pytest.raises(farctx.FarctxError, match="n_local must fit in 32 bits"):
        farctx.Llama(str(tiny_model), method="lminf", n_local=2**40)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"method": "nonsense"}, "unknown method 'nonsense'"),
        ({"n_global": -1}, "n_global must be >= 0"),
        ({"stair_width": 0}, "stair_width must be >= 1"),
        ({"n_local": "big"}, "n_local must be an integer"),
        ({"n_window": 3}, "unexpected keyword"),
    ],
)
def test_python_bad_parameters(tiny_model, kwargs, message):
    with pytest.raises((farctx.FarctxError, TypeError), match=message):
        farctx.Llama(str(tiny_model), **kwargs)


def test_vanilla_prompt_past_the_cache_is_refused_and_loses_nothing(tiny_model):
    llm = farctx.Llama(str(tiny_model), n_ctx=64, n_batch=64)
    n_ctx = llm.n_ctx()  # llama.cpp rounds the cache up to 256 cells
    tokens = random_tokens(n_ctx + 10)
    llm.eval(tokens[:40])
    with pytest.raises(farctx.NoSpaceError, match=f"needs {n_ctx + 10} cells"):
        llm.eval(tokens[40:])
    assert llm.n_tokens == 40
    assert llm.stats()["n_cells_used"] == 40
    llm.eval(tokens[40:50])  # the stream goes on from where it was
    assert llm.n_tokens == 50
    llm.close()


def test_out_of_vocabulary_token(tiny_model):
    llm = farctx.Llama(str(tiny_model), n_ctx=64)
    with pytest.raises(farctx.FarctxError, match="outside the vocabulary"):
        llm.eval([1, 2, 10**7])
    assert llm.n_tokens == 0
    llm.close()
