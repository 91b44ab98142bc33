"""Patches 0002-0005 and 0011: the K-shift is a pure rotation for every cache type (YaRN, BF16), and
llama_memory_seq_rotate_k rotates cached keys in place without moving their positions."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np
import pytest
from helpers import BF16, F16, F32, Q8_0, next_token_logits, random_tokens, tolerance

N = 48
YARN = dict(rope_scaling_type=2, rope_freq_scale=0.5, yarn_ext_factor=1.0, yarn_orig_ctx=32)  # 2 = YaRN

Shift = Callable[[object, object], None]


def _rotate_k(llama_cpp: object) -> Callable[..., bool]:
    """llama_memory_seq_rotate_k from the patched library (llama-cpp-python has no binding for it)."""
    fn = llama_cpp.llama_cpp._lib.llama_memory_seq_rotate_k
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32)]
    fn.restype = ctypes.c_bool
    return fn


def _next_logits(tiny_model, tokens: list[int], shift: Shift | None, *, next_pos: int = N, type_k: int = F32,
                 type_v: int = F32, **kwargs: object) -> np.ndarray:
    """Feed tokens[:N], change the cache with `shift(llama_cpp, mem)`, decode tokens[N]; it lands at next_pos
    (after the last cached position: a seq_add moves positions, a rotation does not)."""
    logits, pos = next_token_logits(tiny_model, tokens, N, shift, n_ctx=128, n_batch=128, type_k=type_k,
                                    type_v=type_v, flash_attn=type_v == Q8_0, **kwargs)
    assert pos == next_pos
    return logits


SHIFT = 12


def _shift_forward(llama_cpp, mem) -> None:
    llama_cpp.llama_memory_seq_add(mem, 0, 0, N, SHIFT)


def test_kshift_keeps_yarn_magnitude(tiny_model):
    """With YaRN, shifting the whole cache and the next token by the same amount leaves every distance,
    so the logits, as they were (the stock shift scaled the keys by YaRN's magnitude factor again)."""
    tokens = random_tokens(N + 1, seed=31)
    plain = _next_logits(tiny_model, tokens, None, **YARN)
    shifted = _next_logits(tiny_model, tokens, _shift_forward, next_pos=N + SHIFT, **YARN)
    tolerance(F32, F32, False).check(shifted[None], plain[None], "K-shift with YaRN")


@pytest.mark.parametrize("type_k, type_v", [(F16, F16), (BF16, BF16), (Q8_0, Q8_0)], ids=["f16", "bf16", "q8_0"])
def test_kshift_any_cache_type(tiny_model, type_k, type_v):
    """A K-shift of an F16, BF16 (no RoPE kernel: the F32 round trip) or quantized cache works and
    keeps the logits within the cache type's rounding."""
    tokens = random_tokens(N + 1, seed=32)
    plain = _next_logits(tiny_model, tokens, None, type_k=type_k, type_v=type_v)
    shifted = _next_logits(tiny_model, tokens, _shift_forward, next_pos=N + SHIFT, type_k=type_k, type_v=type_v)
    # one more rounding of K (to the cache type) than the plain run: twice the error at most
    tolerance(type_k, type_v, type_v == Q8_0).widened(np.sqrt(2)).check(shifted[None], plain[None],
                                                                       f"K-shift k{type_k}")


def test_rotate_k_equals_the_oracle_at_rotated_positions(tiny_model, oracle):
    """Rotating each cached key by its own delta (positions unchanged) scores the next token as if
    key p sat at p + delta[p]: the oracle with those key positions."""
    import llama_cpp

    tokens = random_tokens(N + 1, seed=33)
    delta = np.array([-(p // 3) for p in range(N)], dtype=np.int32)  # several keys share a position

    def rotate(llama_cpp, mem):
        arr = (ctypes.c_int32 * N)(*delta.tolist())
        assert _rotate_k(llama_cpp)(mem, 0, 0, N, arr)
        # cell positions are unchanged: the next token still goes to position N
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == N - 1

    got = _next_logits(tiny_model, tokens, rotate)
    key_pos = np.arange(N + 1) + np.append(delta, 0)
    ref = oracle.logits(tokens, last_row_rule(key_pos))[N]
    tolerance(F32, F32, False).check(got[None], ref[None], "rotate_k")
    assert np.abs(got - oracle.logits(tokens)[N]).max() > 1e-2  # the rotation mattered


def last_row_rule(key_pos: np.ndarray):
    """Vanilla for every row but the last (the cached tokens were computed at their true positions); the
    last query, at its index, sees key j at key_pos[j]."""
    from oracle import AttentionRule

    n = len(key_pos)
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    relpos = np.where(i == n - 1, i - key_pos[None, :], i - j)
    return AttentionRule(allowed=j <= i, relpos=np.where(j <= i, relpos, 0), lam=np.ones(n))


def test_rotate_k_refuses_bad_input(tiny_model):
    import farctx
    import llama_cpp

    llm = farctx.Llama(str(tiny_model), n_ctx=64)
    try:
        mem = llama_cpp.llama_get_memory(llm.ctx)
        fn = _rotate_k(llama_cpp)
        one = (ctypes.c_int32 * 1)(1)
        assert not fn(mem, -1, 0, 1, one)     # no such sequence
        assert not fn(mem, 0, 3, 1, one)      # p1 < p0
        assert not fn(mem, 0, 0, 1, None)     # no deltas
        assert fn(mem, 0, 0, 0, None)         # empty range: nothing to do
    finally:
        llm.close()
