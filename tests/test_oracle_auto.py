"""auto through the patched attention graph equals the numpy oracle (docs/methods.md, 1.6): stock attention for the
queries before the trained context, Dual Chunk Attention from there on. Prompts that cross the trained context, then
generated tokens, prefill in ubatches of 1, 7 and 64, F32/F16/Q8_0 caches, flash attention off and on. Inside the
trained context auto is stock llama.cpp: the same graph, bitwise the same logits as vanilla."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import F16, F32, KV_CONFIGS, check_rewinds, engine_logits, kv_id, random_tokens, tolerance
from oracle import auto_rule, dca_rule

import farctx
from farctx.batch import SequenceBatch
from farctx.methods import method_infos

L_TR = 32  # the tiny model's trained context
DEFAULTS = dict(chunk_size=32, local_window=4)  # auto's defaults for L_TR: chunk_size L_TR, s = 28
DCA_DEFAULTS = dict(chunk_size=24, local_window=4)  # dca's: 3/4 and 1/8 of L_TR, s = 20
N_TOKENS, N_PREFILL = 120, 90


def test_design_test_vectors():
    """docs/methods.md 1.6: the last query inside the trained context reads true distances, the first past it dca's;
    with auto's default chunk (the trained context) that is dca's rule with that chunk at every query."""
    rule = auto_rule(34, 32, **DCA_DEFAULTS)
    assert rule.relpos[31].tolist()[:4] == [31, 30, 29, 28]
    assert rule.relpos[32].tolist() == dca_rule(34, **DCA_DEFAULTS).relpos[32].tolist()
    assert rule.relpos[32].tolist()[:3] == [24, 23, 22]  # the first chunk read from chunk_size
    rule = auto_rule(120, 32, **DEFAULTS)
    assert rule.relpos[32].tolist()[:3] == [32, 31, 30]  # the first query past it: still true distances
    assert rule.relpos[33].tolist()[:3] == [32, 31, 30]  # the next: the first chunk read from chunk_size
    assert np.array_equal(rule.relpos, dca_rule(120, **DEFAULTS).relpos)
    assert not np.array_equal(rule.relpos, auto_rule(120, 32, **DCA_DEFAULTS).relpos)


@pytest.fixture(scope="module")
def auto_ref(oracle):
    tokens = random_tokens(N_TOKENS, seed=31)
    return tokens, oracle.logits(tokens, auto_rule(len(tokens), L_TR, **DEFAULTS))


@pytest.mark.parametrize("n_ubatch", [1, 7, 64])
@pytest.mark.parametrize("kv", KV_CONFIGS, ids=kv_id)
def test_auto_matches_oracle(tiny_model, auto_ref, kv, n_ubatch):
    tokens, ref = auto_ref
    type_k, type_v, fa = kv
    got = engine_logits(tiny_model, tokens, N_PREFILL, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                        flash_attn=fa, method="auto", n_ctx=256)
    tolerance(type_k, type_v, fa).check(got, ref, f"auto {kv_id(kv)} ubatch {n_ubatch}")


def test_oracle_tells_auto_from_dca_and_vanilla(tiny_model, oracle, auto_ref):
    """The comparison above can fail: dca's rule at dca's defaults (which differs from auto's from chunk_size on,
    and so in every later hidden state) and vanilla's are far outside the tolerance."""
    tokens, ref = auto_ref
    got = engine_logits(tiny_model, tokens, N_PREFILL, n_ubatch=7, method="auto", n_ctx=256)
    dca = oracle.logits(tokens, dca_rule(len(tokens), **DCA_DEFAULTS))
    vanilla = oracle.logits(tokens, None)
    err = np.abs(got - ref).max()
    assert err < 1e-4 * np.abs(ref).max()
    assert np.abs(got - dca).max() > 100 * err
    assert np.abs(got - vanilla).max() > 100 * err


@pytest.mark.parametrize("kv", KV_CONFIGS, ids=kv_id)
@pytest.mark.parametrize("n_ubatch", [1, 7, 32])
def test_inside_the_trained_context_bitwise_vanilla(tiny_model, kv, n_ubatch):
    """Up to the trained context auto runs the stock graph: the logits equal vanilla's bit for bit."""
    tokens = random_tokens(L_TR, seed=32)
    type_k, type_v, fa = kv
    kw = dict(n_ubatch=n_ubatch, type_k=type_k, type_v=type_v, flash_attn=fa, n_ctx=256)
    assert np.array_equal(engine_logits(tiny_model, tokens, L_TR - 3, method="auto", **kw),
                          engine_logits(tiny_model, tokens, L_TR - 3, method="vanilla", **kw))


def test_streams_inside_the_trained_context_bitwise_vanilla(tiny_model):
    """SequenceBatch (the server's slots): auto's streams beside each other equal vanilla's bit for bit while every
    stream stays inside the trained context."""
    feeds = [random_tokens(L_TR - 2, seed=33 + i) for i in range(3)]

    def run(method: str) -> list[np.ndarray]:
        with SequenceBatch(str(tiny_model), n_seq=3, n_ctx_seq=256, n_batch=64, n_ubatch=16) as batch:
            for seq in range(3):
                batch.open(seq, method)
            outs = [batch.step({seq: feeds[seq][:20] for seq in range(3)})]
            for t in range(20, L_TR - 2):
                outs.append(batch.step({seq: feeds[seq][t : t + 1] for seq in range(3)}))
            return [np.stack([out[seq] for seq in range(3)]) for out in outs]

    assert all(np.array_equal(a, v) for a, v in zip(run("auto"), run("vanilla")))


def test_defaults_checks_and_info(tiny_model):
    llm = farctx.Llama(str(tiny_model), method="auto", n_ctx=256)
    try:  # chunk_size the trained context, local_window 1/8 of it
        assert llm.method_params.chunk_size == 32 and llm.method_params.local_window == 4
        assert llm.method_params.method == "auto"
    finally:
        llm.close()
    with pytest.raises(farctx.FarctxError, match="auto needs local_window < chunk_size <= n_ctx_train"):
        farctx.Llama(str(tiny_model), method="auto", n_ctx=256, chunk_size=40)
    info = method_infos()["auto"]
    assert info.stock_inside and not info.fixed_cache and info.whole_stream


def test_rewind_across_the_trained_context(tiny_model, oracle, auto_ref):
    """Keys moved to dca's layout at the first query past the trained context move back on a rewind inside it, and
    the stream read on from there equals the oracle; generated tokens each stay in one phase."""
    tokens, ref = auto_ref
    llm = farctx.Llama(str(tiny_model), method="auto", n_ctx=256, n_batch=7, n_ubatch=7, logits_all=True,
                       type_k=F32, type_v=F32)
    try:
        llm.eval(tokens[:N_PREFILL])
        for token in tokens[N_PREFILL:]:
            llm.eval([token])
        rotations = llm.stats()["n_cache_rotations"]
        assert rotations >= 1
        tolerance(F32, F32, False).check(np.array(llm.scores[:N_TOKENS], dtype=np.float64), ref, "auto streamed")
        check_rewinds(llm, tokens[:N_TOKENS], ref, (L_TR + 5, L_TR - 5, 7), "auto")
        assert llm.stats()["n_cache_rotations"] > rotations
    finally:
        llm.close()


def test_prompt_crosses_the_trained_context_in_whole_ubatches(tiny_model, oracle, auto_ref):
    """A prompt of 64 tokens or more crosses the trained context inside one llama_decode (its later queries read
    a rotated copy of the keys): 90 tokens in ubatches of 64, decoded as dca's are; F16 with flash attention."""
    tokens, ref = auto_ref
    llm = farctx.Llama(str(tiny_model), method="auto", n_ctx=256, n_batch=64, n_ubatch=64, logits_all=True,
                       type_k=F16, type_v=F16, flash_attn=True)
    try:
        llm.eval(tokens[:N_PREFILL])
        first = llm.stats()["n_decode"]
        assert first < 10, first
        for token in tokens[N_PREFILL:]:
            llm.eval([token])
        got = np.array(llm.scores[:N_TOKENS], dtype=np.float64)
        tolerance(F16, F16, True).check(got, ref, "auto whole ubatches")
    finally:
        llm.close()
