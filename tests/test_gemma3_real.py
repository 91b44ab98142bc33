"""The real Gemma 3 270M (gemma3, interleaved sliding-window layers, 32k trained context), installed by
farctx.models.gemma3_model_path on first use: every method runs on it, and lminf streams past the
(assumed) trained context in a fixed cache. Its exactness is the tiny gemma3 family's (the oracle matrix)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import farctx
from farctx.eval.data import austen
from farctx.models import gemma3_model_path


@pytest.fixture(scope="module")
def gemma3_path() -> Path:
    return gemma3_model_path()


def test_info_lists_every_method_runnable(gemma3_path):
    done = subprocess.run([sys.executable, "-m", "farctx.cli.main", "info", "-m", "gemma3-270m", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["architecture"] == "gemma3" and info["n_ctx_train"] == 32768 and info["sliding_window"] == 512
    assert set(info["methods"]) == set(farctx.METHODS)
    assert set(info["methods"].values()) == {"yes"}


def test_lminf_streams_past_the_trained_context_in_a_fixed_cache(gemma3_path):
    """--n-ctx-train 256: a 700-token prompt is ~3x past it; the base cache never holds more than
    n_global + n_local + n_ubatch cells, and the model still writes words."""
    n_ubatch = 64
    llm = farctx.Llama(str(gemma3_path), method="lminf", n_ctx_train=256, n_batch=n_ubatch, n_ubatch=n_ubatch,
                       n_threads=2)
    prompt = llm.tokenize(austen("emma")[:4000].encode())[:700]
    assert len(prompt) == 700
    out = llm.create_completion(prompt, max_tokens=12, temperature=0)
    stats = llm.stats()
    assert stats["n_past"] >= 700 and 0 < stats["n_cells_used"] <= 10 + 256 + n_ubatch
    assert len(out["choices"][0]["text"].split()) >= 3
    llm.close()


def test_lminf_is_vanilla_inside_n_local(gemma3_path):
    tokens = [2] + list(range(1000, 1100))
    got = {}
    for method in ("vanilla", "lminf"):
        llm = farctx.Llama(str(gemma3_path), method=method, n_ctx_train=256, n_ctx=1024, logits_all=True,
                           n_threads=2)
        llm.eval(tokens)
        got[method] = np.array(llm.scores[: len(tokens)])
        llm.close()
    assert np.abs(got["lminf"] - got["vanilla"]).max() <= 1e-4
