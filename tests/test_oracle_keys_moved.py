"""SelfExtend and ReRoPE keep each cached key where the segment that reads it needs it (docs/methods.md, 1.3 and
1.5): at its true position while inside the window, moved once, in place, to its grouped position (selfextend) or
to 0 (rerope) as it leaves the window, so a generated token rotates only its query. A rewind moves keys back, a
saved state carries where they sit, and the stream read on equals the numpy oracle. The oracle comparisons of every
KV type and ubatch size are in test_oracle_mesa.py (selfextend) and test_oracle_methods.py (rerope)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import F16, F32, check_rewinds, random_tokens, tolerance
from oracle import method_rule, selfextend_rule

import farctx

N_TOKENS, N_PREFILL = 120, 90
CASES = {
    "selfextend": (dict(group=4, neighbor=8), lambda n: selfextend_rule(n, group=4, neighbor=8), 8),
    "rerope": (dict(n_local=12), lambda n: method_rule("rerope", n, 12), 12),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request, oracle):
    method = request.param
    params, rule, window = CASES[method]
    tokens = random_tokens(N_TOKENS, seed=37)
    return method, params, window, tokens, oracle.logits(tokens, rule(N_TOKENS))


def streamed(model, method: str, params: dict[str, int], **kwargs: object) -> farctx.Llama:
    kwargs = {"n_ctx": 256, "n_batch": 7, "n_ubatch": 7, "logits_all": True, "type_k": F32, "type_v": F32,
              **kwargs}
    return farctx.Llama(str(model), method=method, **params, **kwargs)


def test_each_key_moves_once_and_back_on_rewind(tiny_model, case):
    """While the stream grows, each batch's own graph moves the keys that left the window since the batch before it
    (n_k_move: one per generated token, a ubatch's worth per prompt ubatch, the last one short), so no K-shift runs
    (n_cache_rotations counts those); a rewind into the moved keys moves them back through the K-shift, and the
    stream read on from there equals the oracle."""
    method, params, window, tokens, ref = case
    llm = streamed(tiny_model, method, params)
    try:
        llm.eval(tokens[:N_PREFILL])
        assert llm.stats()["n_cache_rotations"] == 0
        for token in tokens[N_PREFILL:]:
            llm.eval([token])
        assert llm.stats()["n_cache_rotations"] == 0
        tolerance(F32, F32, False).check(np.array(llm.scores[:N_TOKENS], dtype=np.float64), ref, f"{method} streamed")
        rotations = llm.stats()["n_cache_rotations"]
        check_rewinds(llm, tokens, ref, (window + 3, N_PREFILL, window - 2, 3 * window), method)
        assert llm.stats()["n_cache_rotations"] > rotations
    finally:
        llm.close()


def test_a_saved_state_carries_where_the_keys_sit(tiny_model, case):
    """A state saved with keys moved, loaded into a stream whose keys sit elsewhere (a longer stream of the same
    method), reads on as the oracle does."""
    method, params, window, tokens, ref = case
    with streamed(tiny_model, method, params) as a, streamed(tiny_model, method, params) as b:
        a.eval(tokens[:N_PREFILL])
        state = a.save_state()
        b.eval(tokens[:N_TOKENS - 5])
        b.load_state(state)
        b.eval(tokens[N_PREFILL:])
        got = np.array(b.scores[:N_TOKENS], dtype=np.float64)
        tolerance(F32, F32, False).check(got[N_PREFILL:], ref[N_PREFILL:], f"{method} after load_state")


def test_prompt_in_whole_ubatches_f16_flash_attention(tiny_model, case):
    """A prompt of 64-token ubatches: each reads the keys its later queries see beyond the window through a rotated
    copy; generated tokens then read the moved keys as they are. F16 cache, flash attention."""
    method, params, window, tokens, ref = case
    with streamed(tiny_model, method, params, n_batch=64, n_ubatch=64, type_k=F16, type_v=F16,
                  flash_attn=True) as llm:
        llm.eval(tokens[:N_PREFILL])
        assert llm.stats()["n_decode"] == 2
        for token in tokens[N_PREFILL:]:
            llm.eval([token])
        tolerance(F16, F16, True).check(np.array(llm.scores[:N_TOKENS], dtype=np.float64), ref,
                                        f"{method} whole ubatches")


def test_keys_left_unmoved_are_read_wrong(tiny_model, case, oracle):
    """The comparison can fail: the rule with the far keys read at their true positions under the moved query (what
    a decode reads if the keys did not move) is far from the engine's logits."""
    method, params, window, tokens, ref = case
    rule = CASES[method][1](N_TOKENS)
    i = np.arange(N_TOKENS)[:, None]
    j = np.arange(N_TOKENS)[None, :]
    far = (i - j >= window) & rule.allowed
    k2 = j // params["group"] if method == "selfextend" else np.zeros_like(j)
    unmoved = type(rule)(allowed=rule.allowed, relpos=np.where(far, rule.relpos + k2 - j, rule.relpos), lam=rule.lam)
    wrong = oracle.logits(tokens, unmoved)
    with streamed(tiny_model, method, params) as llm:
        llm.eval(tokens[:N_PREFILL])
        for token in tokens[N_PREFILL:]:
            llm.eval([token])
        got = np.array(llm.scores[:N_TOKENS], dtype=np.float64)
    err = np.abs(got - ref).max()
    assert np.abs(got[N_PREFILL:] - wrong[N_PREFILL:]).max() > 100 * err
