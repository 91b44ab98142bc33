"""The command line on the bundled default model: info and deterministic generation."""

from __future__ import annotations

import json

from helpers import run_cli


def test_info_json_reports_trained_context(default_model):
    result = run_cli("info", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["n_ctx_train"] == 8192
    assert info["architecture"] == "llama"
    assert info["path"] == str(default_model)
    assert info["methods"]["vanilla"] == "yes"


def test_info_text_on_tiny_model(tiny_model):
    result = run_cli("info", "-m", str(tiny_model))
    assert result.returncode == 0, result.stderr
    assert "n_ctx_train" in result.stdout and "32" in result.stdout


def test_generate_is_deterministic_with_temp_0():
    args = ("generate", "-p", "The three primary colours are", "-n", "16", "--temp", "0", "--seed", "1", "-c", "256")
    first = run_cli(*args)
    second = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert len(first.stdout.strip()) > 0


def test_generate_fits_the_window_into_c():
    """-c without --n-local on a fixed-cache method: the window is fitted into the cache and said on stderr; -ub
    unset, the ubatch leaves the window most of the cache (a quarter of it), as farctx.Llama's."""
    result = run_cli("generate", "--method", "lminf", "-c", "1024", "-p", "Hello", "-n", "2", "--temp", "0", "--json")
    assert result.returncode == 0, result.stderr
    assert "lminf: the KV cache of 1024 cells holds n_global 10 + n_local 758 + n_ubatch 256" in result.stderr
    report = json.loads(result.stdout)
    assert report["method"]["n_local"] == 758 and report["stats"]["window_fitted"]


def test_generate_json_and_prompt_from_file(tmp_path, tiny_model):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Once upon a time")
    result = run_cli("generate", "-m", str(tiny_model), "-f", str(prompt), "-n", "5", "--temp", "0", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["method"]["method"] == "auto"  # the default
    assert report["method"]["n_ctx_train"] == 32
    assert report["stats"]["n_past"] == report["prompt_tokens"] + 4  # the last sampled token is not fed back
