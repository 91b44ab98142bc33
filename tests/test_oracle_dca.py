"""Dual Chunk Attention through the patched attention graph equals the numpy oracle (docs/methods.md, 1.4):
prompts of several chunks, then generated tokens, prefill in ubatches of 1, 7 and 64, F32/F16/Q8_0 caches, flash
attention off and on; with the previous chunk's query clamped, and with the earlier chunks' query at 2s - 1 where
that binds. A rule with any one of its three query positions changed is far from what the engine computes."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import F16, F32, KV_CONFIGS, check_rewinds, engine_logits, kv_id, random_tokens, tolerance
from oracle import AttentionRule, dca_rule

import farctx

L_TR = 32  # the tiny model's trained context
# s = 8, 2s - 1 = 15 > chunk_size: the earlier chunks' query at chunk_size (the defaults' case)
DCA = dict(chunk_size=12, local_window=4)
# s = 5, 2s - 1 = 9 < chunk_size: the earlier chunks' query at 2s - 1
DCA_BINDING = dict(chunk_size=12, local_window=7)
N_TOKENS, N_PREFILL = 120, 90


def test_design_test_vectors():
    """docs/methods.md 1.4."""
    def row(n: int, **params: int) -> list[int]:
        return dca_rule(n + 1, **params).relpos[n].tolist()

    assert row(9, chunk_size=6, local_window=2) == [6, 5, 4, 3, 5, 4, 3, 2, 1, 0]
    assert row(13, chunk_size=6, local_window=2) == [6, 5, 4, 3, 6, 5, 4, 3, 5, 4, 3, 2, 1, 0]
    assert row(13, chunk_size=10, local_window=6) == [7, 6, 5, 4, 7, 6, 5, 4, 5, 4, 3, 2, 1, 0]


@pytest.fixture(scope="module", params=[DCA, DCA_BINDING], ids=["clamped", "inter-2s-1"])
def dca_ref(request, oracle):
    tokens = random_tokens(N_TOKENS, seed=23)
    return request.param, tokens, oracle.logits(tokens, dca_rule(len(tokens), **request.param))


@pytest.mark.parametrize("n_ubatch", [1, 7, 64])
@pytest.mark.parametrize("kv", KV_CONFIGS, ids=kv_id)
def test_dca_matches_oracle(tiny_model, dca_ref, kv, n_ubatch):
    params, tokens, ref = dca_ref
    type_k, type_v, fa = kv
    got = engine_logits(tiny_model, tokens, N_PREFILL, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                        flash_attn=fa, method="dca", n_ctx=256, **params)
    tolerance(type_k, type_v, fa).check(got, ref, f"dca {params} {kv_id(kv)} ubatch {n_ubatch}")


def _broken(n: int, chunk_size: int, local_window: int, part: str) -> AttentionRule:
    """dca_rule with one of its three query positions moved by one."""
    rule = dca_rule(n, chunk_size, local_window)
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    s = chunk_size - local_window
    part_of = np.where(j // s == i // s, 0, np.where(j // s == i // s - 1, 1, 2))
    which = {"same": 0, "previous": 1, "earlier": 2}[part]
    moved = np.where(rule.allowed & (part_of == which), rule.relpos + 1, rule.relpos)
    return AttentionRule(allowed=rule.allowed, relpos=moved, lam=rule.lam)


@pytest.mark.parametrize("part", ["same", "previous", "earlier"])
def test_each_of_the_three_positions_is_checked(tiny_model, oracle, part):
    """The comparison above can fail: moving any one part's query by one position puts the oracle far outside the
    tolerance from the engine's logits."""
    tokens = random_tokens(N_TOKENS, seed=23)
    got = engine_logits(tiny_model, tokens, N_PREFILL, n_ubatch=7, method="dca", n_ctx=256, **DCA)
    ref = oracle.logits(tokens, dca_rule(len(tokens), **DCA))
    broken = oracle.logits(tokens, _broken(len(tokens), **DCA, part=part))
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() < 1e-4 * scale
    assert np.abs(got - broken).max() > 100 * np.abs(got - ref).max(), part


def test_defaults_and_checks(tiny_model):
    llm = farctx.Llama(str(tiny_model), method="dca", n_ctx=256)
    try:  # ChunkLlama's replace_with_chunkllama: 3/4 and 1/8 of the trained context
        assert llm.method_params.chunk_size == 24 and llm.method_params.local_window == 4
    finally:
        llm.close()
    for bad in (dict(chunk_size=12, local_window=12), dict(chunk_size=40, local_window=4)):
        with pytest.raises(farctx.FarctxError, match="dca needs local_window < chunk_size <= n_ctx_train"):
            farctx.Llama(str(tiny_model), method="dca", n_ctx=256, **bad)


def test_vanilla_up_to_chunk_size(tiny_model, oracle):
    """Up to position chunk_size (and below 2s) every key is at its true distance: the stock graph runs."""
    tokens = random_tokens(13, seed=24)  # up to position 12 = chunk_size (s = 8: ubatches of 4 end where chunks do)
    got = engine_logits(tiny_model, tokens, 13, n_ubatch=4, method="dca", n_ctx=256, **DCA)
    vanilla = engine_logits(tiny_model, tokens, 13, n_ubatch=4, n_ctx=256)
    assert np.array_equal(got, vanilla)
    past = random_tokens(14, seed=24)  # position 13: the previous chunk's query clamped
    assert not np.array_equal(engine_logits(tiny_model, past, 14, n_ubatch=4, method="dca", n_ctx=256, **DCA)[13],
                              engine_logits(tiny_model, past, 14, n_ubatch=4, n_ctx=256)[13])


@pytest.mark.parametrize("params", [DCA, DCA_BINDING], ids=["clamped", "inter-2s-1"])
def test_keys_rotated_in_place_per_phase_and_back_on_rewind(tiny_model, oracle, params):
    """The cached keys sit where the segment that reads them needs them: rotated in place when the previous
    chunk's query becomes clamped, or (where 2s - 1 binds) when a chunk becomes an earlier one: at most twice per
    chunk, not per token or per ubatch. A rewind into an earlier phase puts them back, and the stream read on
    from there equals the oracle."""
    tokens = random_tokens(N_TOKENS, seed=23)
    ref = oracle.logits(tokens, dca_rule(len(tokens), **params))
    s = params["chunk_size"] - params["local_window"]
    n_chunks = (N_TOKENS - 1) // s + 1
    llm = farctx.Llama(str(tiny_model), method="dca", n_ctx=256, n_batch=7, n_ubatch=7, logits_all=True,
                       type_k=F32, type_v=F32, **params)
    try:
        llm.eval(tokens[:N_PREFILL])
        for token in tokens[N_PREFILL:]:
            llm.eval([token])
        rotations = llm.stats()["n_cache_rotations"]
        assert n_chunks - 3 <= rotations <= 2 * n_chunks, rotations
        tolerance(F32, F32, False).check(np.array(llm.scores[:N_TOKENS], dtype=np.float64), ref, "dca streamed")
        check_rewinds(llm, tokens[:N_TOKENS], ref, (3 * s + 1, 2 * s - 1, s + 2), "dca")  # an earlier chunk and phase
        assert llm.stats()["n_cache_rotations"] > rotations
    finally:
        llm.close()


def test_decode_over_more_than_512_cells(tiny_model, oracle):
    """Generated tokens over more than 512 cells take the CPU's split-KV flash attention: each of the two calls
    over every cell has a long masked run at one end (the main segment reads the last chunks, the second segment
    the rest), and each thread's share starts and ends at unmasked cells (patch 0008). Equal to the oracle."""
    tokens = random_tokens(600, seed=29)
    got = engine_logits(tiny_model, tokens, 560, n_ubatch=64, type_k=F16, type_v=F16, flash_attn=True,
                        method="dca", n_ctx=1024, **DCA)
    ref = oracle.logits(tokens, dca_rule(len(tokens), **DCA))
    tolerance(F16, F16, True).check(got[540:], ref[540:], "dca decode over 600 cells")


def test_prompt_runs_in_whole_ubatches_across_phases(tiny_model, oracle):
    """A feed of 64 tokens or more crosses phase boundaries inside one llama_decode (the queries past the first
    one's phase read a rotated copy of the keys); a shorter one, and every generated token, stays within a phase.
    90 prompt tokens in ubatches of 64 (s = 8, phases of 5 and 3 tokens): one decode of 64, then the 26 left cut at
    their 6 phase boundaries, 8 decodes where cuts from the start would take 22. The stream equals the oracle."""
    tokens = random_tokens(N_TOKENS, seed=23)
    ref = oracle.logits(tokens, dca_rule(len(tokens), **DCA))
    llm = farctx.Llama(str(tiny_model), method="dca", n_ctx=256, n_batch=64, n_ubatch=64, logits_all=True,
                       type_k=F32, type_v=F32, **DCA)
    try:
        llm.eval(tokens[:N_PREFILL])
        assert llm.stats()["n_decode"] == 8
        for token in tokens[N_PREFILL:]:
            llm.eval([token])
        assert llm.stats()["n_decode"] == 8 + N_TOKENS - N_PREFILL
        tolerance(F32, F32, False).check(np.array(llm.scores[:N_TOKENS], dtype=np.float64), ref, "dca whole ubatches")
    finally:
        llm.close()
