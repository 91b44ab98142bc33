"""STRING through the patched attention graph equals the numpy oracle, token by token (prefill, then one-token
decodes), for the KV cache types, flash attention on and off and ubatch 1/7/64; a shift or a factor other than
STRING's fails the same check; the parameters resolve and validate as docs/methods.md (1.5) says."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import KV_CONFIGS, engine_logits, kv_id, random_tokens, tolerance
from oracle import STRING_LOGIT_SCALE, AttentionRule, string_rule

import farctx
from farctx.errors import FarctxError

N_TOKENS = 128
N_PREFILL = 90
STRING = dict(shifted_offset=12, local_value=4)  # the tiny model's n_ctx_train is 32: most keys shifted


def test_design_test_vector():
    """docs/methods.md 1.5, S=4, W=2: relpos per key 0..i."""
    rule = string_rule(9, shifted_offset=4, local_value=2)
    rows = {i: [int(rule.relpos[i, j]) for j in range(i + 1)] for i in (3, 4, 8)}
    assert rows[3] == [3, 2, 1, 0]                     # every distance below S: true
    assert rows[4] == [2, 3, 2, 1, 0]                  # d = 4 = S: read at W = 2
    assert rows[8] == [6, 5, 4, 3, 2, 3, 2, 1, 0]      # d >= S: d - S + W
    assert np.allclose(rule.lam, (0.1 * np.log(2) + 1) ** 2) and abs(STRING_LOGIT_SCALE - 1.1434) < 1e-4


@pytest.fixture(scope="module")
def reference(oracle):
    tokens = random_tokens(N_TOKENS, seed=23)
    return tokens, oracle.logits(tokens, string_rule(N_TOKENS, **STRING))


@pytest.mark.parametrize("n_ubatch", [1, 7, 64])
@pytest.mark.parametrize("kv", KV_CONFIGS, ids=kv_id)
def test_string_matches_oracle(tiny_model, reference, kv, n_ubatch):
    tokens, ref = reference
    type_k, type_v, fa = kv
    got = engine_logits(tiny_model, tokens, N_PREFILL, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                        flash_attn=fa, method="string", n_ctx=256, **STRING)
    tolerance(type_k, type_v, fa).check(got, ref, f"string {kv_id(kv)} ubatch {n_ubatch}")


def _rule(n: int, relpos: np.ndarray, lam: float) -> AttentionRule:
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    allowed = j <= i
    return AttentionRule(allowed=allowed, relpos=np.where(allowed, relpos, 0), lam=np.full(n, lam))


def test_a_broken_shift_or_factor_fails(tiny_model, oracle, reference):
    """The engine's logits fail the check against STRING with W + 1, with S + 1 (the boundary moved), and without
    the factor: the suite above can fail."""
    tokens, ref = reference
    got = engine_logits(tiny_model, tokens, N_PREFILL, n_ubatch=7, method="string", n_ctx=256, **STRING)
    tol = tolerance(0, 0, False)
    tol.check(got, ref, "string")
    n = len(tokens)
    d = np.arange(n)[:, None] - np.arange(n)[None, :]
    S, W = STRING["shifted_offset"], STRING["local_value"]
    wrong = {
        "W + 1": _rule(n, np.where(d < S, d, d - S + W + 1), STRING_LOGIT_SCALE),
        "S + 1": _rule(n, np.where(d < S + 1, d, d - S - 1 + W), STRING_LOGIT_SCALE),
        "no factor": _rule(n, np.where(d < S, d, d - S + W), 1.0),
        "vanilla": _rule(n, d, 1.0),
    }
    for name, rule in wrong.items():
        with pytest.raises(AssertionError):
            tol.check(got, oracle.logits(tokens, rule), f"string against {name}")


def test_defaults_and_validation(tiny_model):
    llm = farctx.Llama(str(tiny_model), method="string", n_ctx=64)
    p = llm.method_params
    assert (p.shifted_offset, p.local_value) == (32 * 33 // 100, 32 * 33 // 100 // 2)  # 0.33 L; W at most S / 2
    llm.close()
    assert list(farctx.MethodParams(method="string").relevant()) == ["n_ctx_train", "shifted_offset", "local_value"]
    for bad, message in [({"shifted_offset": 32}, "shifted_offset \\(32\\) must be between 2 and n_ctx_train - 1"),
                         ({"shifted_offset": 12, "local_value": 12}, "local_value \\(12\\) must be between 1 and"),
                         ({"shifted_offset": 1}, "shifted_offset \\(1\\)")]:
        with pytest.raises(FarctxError, match=message):
            farctx.Llama(str(tiny_model), method="string", n_ctx=64, **bad)


def test_an_8k_model_gets_the_reference_defaults(default_model):
    """S = int(0.33 L), W = 128 (the reference's replace_with_string as its RULER scripts call it)."""
    llm = farctx.Llama(str(default_model), method="string", n_ctx=256)
    assert (llm.method_params.shifted_offset, llm.method_params.local_value) == (2703, 128)
    llm.close()
