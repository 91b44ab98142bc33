"""Shared test helpers: running the engine over a token stream and the tolerances of the oracle checks."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def gpu_layers() -> int:
    """FARCTX_TEST_NGL: layers every farctx.Llama of the tests offloads (`all` or -1: all of them;
    unset or 0: none, the CPU-only default). scripts/gpu-check sets `all`."""
    value = os.environ.get("FARCTX_TEST_NGL", "0").strip().lower()
    return -1 if value in ("all", "-1") else int(value)


# ggml type ids of the KV caches under test
F32, F16, Q8_0, BF16 = 0, 1, 8, 30
KV_NAMES = {F32: "f32", F16: "f16", Q8_0: "q8_0", BF16: "bf16"}


@dataclass(frozen=True)
class Tolerance:
    """max |engine - oracle| and mean |engine - oracle|, relative to max |oracle| (abs for F32)."""

    max_abs: float | None = None
    max_rel: float | None = None
    mean_rel: float | None = None

    def check(self, got: np.ndarray, ref: np.ndarray, what: str) -> None:
        diff = np.abs(got - ref)
        scale = float(np.abs(ref).max())
        detail = f"{what}: max diff {diff.max():.3g}, mean {diff.mean():.3g}, logit scale {scale:.3g}"
        print(detail)  # shown with pytest -rP: the measured error of each configuration
        if self.max_abs is not None:
            assert diff.max() <= self.max_abs, detail
        if self.max_rel is not None:
            assert diff.max() <= self.max_rel * scale, detail
        if self.mean_rel is not None:
            assert diff.mean() <= self.mean_rel * scale, detail

    def widened(self, factor: float) -> Tolerance:
        """The same bounds times factor."""
        return Tolerance(*(None if b is None else b * factor for b in (self.max_abs, self.max_rel, self.mean_rel)))


def tolerance(type_k: int, type_v: int, flash_attn: bool) -> Tolerance:
    if Q8_0 in (type_k, type_v):
        # llama.cpp also quantizes the queries to Q8_0 for the K.Q product: measured 2.7% max, 0.2% mean
        return Tolerance(max_rel=6e-2, mean_rel=5e-3)
    if type_k == F32 and type_v == F32 and not flash_attn:
        if gpu_layers():
            # offloaded: CUDA's cuBLAS computes F32 products in TF32 (10-bit mantissa, as F16;
            # ggml-cuda/common.cuh:1535), so the F16 bound applies
            return Tolerance(max_rel=2e-2)
        return Tolerance(max_abs=1e-4)
    if BF16 in (type_k, type_v):
        return Tolerance(max_rel=3e-2)  # 8-bit mantissa: measured 0.9%
    return Tolerance(max_rel=2e-2)


# (type_k, type_v, flash_attn): llama.cpp needs flash attention for a quantized V cache
KV_CONFIGS = [
    (F32, F32, False),
    (F32, F32, True),
    (F16, F16, False),
    (F16, F16, True),
    (Q8_0, F16, False),
    (Q8_0, Q8_0, True),
    (BF16, BF16, False),  # no RoPE kernel for BF16: rotated keys go through an F32 copy
]


def kv_id(config: tuple[int, int, bool]) -> str:
    k, v, fa = config
    return f"k{KV_NAMES[k]}-v{KV_NAMES[v]}-fa{'on' if fa else 'off'}"


def random_tokens(n: int, seed: int = 1, n_vocab: int = 49152) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, n).tolist()


def next_token_logits(model: Path, tokens: list[int], n_fed: int, change=None, **kwargs: object
                      ) -> tuple[np.ndarray, int]:
    """Feed tokens[:n_fed], change the cache with `change(llama_cpp, mem)` (a K-shift it records is applied
    at the start of the next llama_decode), then decode tokens[n_fed] right after the last position in the
    cache. Returns its logits and the position it went to."""
    import ctypes

    import farctx
    import llama_cpp

    llm = farctx.Llama(str(model), **kwargs)
    try:
        llm.eval(tokens[:n_fed])
        mem = llama_cpp.llama_get_memory(llm.ctx)
        if change is not None:
            change(llama_cpp, mem)
        next_token = (ctypes.c_int32 * 1)(tokens[n_fed])
        batch = llama_cpp.llama_batch_get_one(next_token, 1)  # position: after the last one in the cache
        assert llama_cpp.llama_decode(llm.ctx, batch) == 0
        pos = llama_cpp.llama_memory_seq_pos_max(mem, 0)
        logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).astype(np.float64).copy(), pos
    finally:
        llm.close()


def engine_logits(model: Path, tokens: list[int], n_prefill: int, *, n_ubatch: int, type_k: int = F32,
                  type_v: int = F32, flash_attn: bool = False, n_ctx: int = 0, stats: dict[str, int] | None = None,
                  **kwargs: object) -> np.ndarray:
    """Logits for every token: the first n_prefill in one eval (split in ubatches), then one token at a time.
    `stats`, if given, receives the session's counters at the end."""
    import farctx

    llm = farctx.Llama(str(model), n_ctx=n_ctx or len(tokens), n_batch=max(n_prefill, 1), n_ubatch=n_ubatch,
                       logits_all=True, type_k=type_k, type_v=type_v, flash_attn=flash_attn, **kwargs)
    try:
        llm.eval(tokens[:n_prefill])
        for token in tokens[n_prefill:]:
            llm.eval([token])
        if stats is not None:
            stats.update(llm.stats())
        return np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()
