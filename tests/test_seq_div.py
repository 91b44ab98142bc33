"""Patch 0001: llama_memory_seq_div moves cached keys onto their new positions (as seq_add does)."""

from __future__ import annotations

import numpy as np
from helpers import next_token_logits, random_tokens

N = 64


def _next_logits(tiny_model, tokens, shift, next_pos: int) -> np.ndarray:
    """Feed tokens, re-position the cache with `shift(mem)`, then decode one more token."""
    logits, pos = next_token_logits(tiny_model, tokens, N, shift, n_ctx=128, n_batch=128, type_k=0, type_v=0)
    assert pos == next_pos
    return logits


def test_seq_div_equals_per_cell_seq_add(tiny_model):
    tokens = random_tokens(N + 1, seed=7)

    def divide(llama_cpp, mem):
        llama_cpp.llama_memory_seq_div(mem, 0, 0, N, 2)

    def add_per_cell(llama_cpp, mem):
        for p in range(1, N):  # ascending: a moved cell never lands in a later range
            llama_cpp.llama_memory_seq_add(mem, 0, p, p + 1, p // 2 - p)

    by_div = _next_logits(tiny_model, tokens, divide, N // 2)
    by_add = _next_logits(tiny_model, tokens, add_per_cell, N // 2)
    assert np.abs(by_div - by_add).max() <= 1e-4, np.abs(by_div - by_add).max()


def test_seq_add_round_trip_is_exact(tiny_model, oracle):
    """Two K-shifts that add up to +5 give the oracle's logits (only distances matter)."""
    tokens = random_tokens(N + 1, seed=8)

    def there_and_back(llama_cpp, mem):
        llama_cpp.llama_memory_seq_add(mem, 0, 0, N, 12)
        llama_cpp.llama_memory_seq_add(mem, 0, 0, N + 12, -7)

    got = _next_logits(tiny_model, tokens, there_and_back, N + 5)
    ref = oracle.logits(tokens)[N]
    assert np.abs(got - ref).max() <= 1e-4
