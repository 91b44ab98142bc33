"""vanilla through farctx equals the numpy oracle, token by token, prefill then decode."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import KV_CONFIGS, engine_logits, kv_id, random_tokens, tolerance

N_TOKENS = 96
N_PREFILL = 61


@pytest.fixture(scope="module")
def reference(oracle):
    tokens = random_tokens(N_TOKENS)
    return tokens, oracle.logits(tokens)


@pytest.mark.parametrize("n_ubatch", [1, 7, 64])
@pytest.mark.parametrize("kv", KV_CONFIGS, ids=kv_id)
def test_vanilla_matches_oracle(tiny_model, reference, kv, n_ubatch):
    tokens, ref = reference
    type_k, type_v, fa = kv
    got = engine_logits(tiny_model, tokens, N_PREFILL, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                        flash_attn=fa)
    tolerance(type_k, type_v, fa).check(got, ref, f"vanilla {kv_id(kv)} ubatch {n_ubatch}")


def test_oracle_is_sensitive_to_positions(oracle, reference):
    """The fixture model's logits move well past every tolerance when relative positions change,
    so a wrong mask or position in the engine cannot pass unnoticed."""
    from oracle import vanilla_rule

    tokens, ref = reference
    rule = vanilla_rule(len(tokens))
    rule.relpos = np.minimum(rule.relpos, 8)  # bounded distance, as rerope with L=8 would do
    moved = oracle.logits(tokens, rule)
    assert np.abs(moved - ref)[9:].max() > 0.2 * np.abs(ref).max()
