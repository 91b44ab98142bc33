"""Interleaved sliding-window models (Gemma 3): what the method matrix does not reach.

The methods act on the full-attention layers and their base cache; the sliding-window layers keep
llama.cpp's window and true positions. Here: a local window shorter than the sliding window (the
base cache evicts keys the sliding layers still read), a long stream through a fixed cache (both
caches stay bounded), and a rewind past what the sliding-window cache still holds (replayed).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import F16, engine_logits, random_tokens, tolerance
from oracle import OracleModel, method_rule
from tiny_gguf import FAMILIES_ISWA, write_tiny_gguf

import farctx

CFG = FAMILIES_ISWA["gemma3"]


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory, default_model) -> tuple[Path, OracleModel]:
    path = write_tiny_gguf(tmp_path_factory.mktemp("iswa") / "gemma3.gguf", default_model, CFG)
    return path, OracleModel(path)


@pytest.mark.parametrize("fa", [False, True], ids=["faoff", "faon"])
@pytest.mark.parametrize("method, n_local, n_global", [("lminf", 4, 2), ("window", 5, 0)])
def test_local_window_shorter_than_the_sliding_window(gemma3, method, n_local, n_global, fa):
    """n_local < n_swa: the base cache evicts keys the sliding-window layers still attend to (they
    must keep them: eviction leaves their cache alone)."""
    assert n_local < CFG.sliding_window
    path, oracle = gemma3
    tokens = random_tokens(160, seed=21)
    ref = oracle.logits(tokens, method_rule(method, len(tokens), n_local, n_global))
    extra = {"n_global": n_global} if method == "lminf" else {}
    got = engine_logits(path, tokens, 100, n_ubatch=7, type_k=F16, type_v=F16, flash_attn=fa, method=method,
                        n_ctx=64, n_local=n_local, **extra)
    tolerance(F16, F16, fa).check(got, ref, f"{method} n_local {n_local} < window {CFG.sliding_window}")


def test_fixed_cache_over_a_long_stream(gemma3):
    """3,000 tokens: the base cache holds at most n_global + n_local + n_ubatch cells, the memory stays flat."""
    path, _ = gemma3
    n_ubatch = 32
    llm = farctx.Llama(str(path), method="lminf", n_ctx=128, n_batch=n_ubatch, n_ubatch=n_ubatch)
    llm.progress = lambda done, total: None
    bound = 10 + CFG.n_ctx_train + n_ubatch
    tokens = random_tokens(3000, seed=22)
    peak, sizes = 0, set()
    for start in range(0, len(tokens), 500):
        llm.eval(tokens[start : start + 500])
        stats = llm.stats()
        peak = max(peak, stats["n_cells_used"])
        sizes.add(stats["kv_bytes"])
    assert llm.stats()["n_past"] == 3000
    assert 0 < peak <= bound
    assert len(sizes) == 1  # both caches allocated once
    llm.close()


def test_rewind_past_the_sliding_window_cache_replays(gemma3):
    """The sliding-window cache reuses the cells its window passed: a rewind to a point whose window
    is gone cannot be served from the cache, and the stream is fed again (still the method's logits)."""
    path, oracle = gemma3
    tokens = random_tokens(320, seed=23)
    llm = farctx.Llama(str(path), method="lminf", n_ctx=128, n_ubatch=16, n_batch=16, logits_all=True,
                       type_k=0, type_v=0)
    llm.eval(tokens[:300])  # the sliding-window cache (256 cells) no longer holds positions below ~44
    llm.n_tokens = 20       # as llama_cpp's prefix reuse does
    n_decode = llm.stats()["n_decode"]
    llm.eval(tokens[20:24])
    assert llm.stats()["n_decode"] - n_decode == 2  # 24 tokens fed again from the start: 2 ubatches, not 1
    llm.eval(tokens[24:320])
    assert llm.n_tokens == 320 and llm.stats()["n_past"] == 320
    ref = oracle.logits(tokens, method_rule("lminf", 320, CFG.n_ctx_train, 10))
    got = np.array(llm.scores[:320], dtype=np.float64)
    tolerance(F16, F16, False).check(got, ref, "lminf on gemma3 after a rewind past the window cache")
    llm.close()


def test_fixed_cache_smaller_than_window_plus_ubatch_is_refused(gemma3):
    """llama.cpp caps the sliding-window cache at the context size: a fixed cache below window + n_ubatch
    would run out of room for a ubatch there once the stream is longer than the cache."""
    path, _ = gemma3
    # (llama.cpp pads the context to 256 cells) the base cache is large enough: 2 + 4 + 250 = 256 cells
    with pytest.raises(farctx.FarctxError, match="sliding-window layers need their window \\+ n_ubatch = 8 \\+ 250"):
        farctx.Llama(str(path), method="lminf", n_ctx=256, n_ubatch=250, n_batch=250, n_local=4, n_global=2)
    farctx.Llama(str(path), method="lminf", n_ctx=256, n_ubatch=248, n_batch=248, n_local=4, n_global=2).close()
