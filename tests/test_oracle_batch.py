"""Several sequences in one context (farctx.SequenceBatch, patch 0016): streams of different methods and
lengths, joining at different steps, prompts fed in pieces beside other streams' decoding, each get the
logits the numpy oracle gives that stream alone, for every method, with F32/F16/Q8_0 caches and flash
attention on and off."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import F16, F32, Q8_0, gpu_layers, kv_id, random_tokens, tolerance
from oracle import method_rule, rule_for

import farctx
from farctx.batch import SequenceBatch

L_TR = 32
N_LOCAL, N_GLOBAL, N_SINK = 32, 10, 4
MESA = dict(first_chunk=4, stair_width=2, last_context=8, gen_budget=2)
SELFEXTEND = dict(group=4, neighbor=8)
DCA = dict(chunk_size=12, local_window=4)
STRING = dict(shifted_offset=12, local_value=4)
N_DECODE = 12

# groups of four streams: mixed methods, and pairs of one method; each stream: (method, prompt length, step it
# joins at)
GROUPS = {
    "lminf-mesa-streaming-vanilla": [("lminf", 90, 0), ("mesa", 100, 0), ("streaming", 70, 3), ("vanilla", 40, 5)],
    "window-lambda-rerope-selfextend": [("window", 80, 0), ("lambda-only", 60, 2), ("rerope", 75, 0),
                                        ("selfextend", 96, 4)],
    # two streams of one method share each llama_decode (the same graph): each callback fills its own stream
    "lminf2-streaming2": [("lminf", 90, 0), ("lminf", 50, 1), ("streaming", 70, 0), ("streaming", 45, 2)],
    "mesa2-selfextend2": [("mesa", 100, 0), ("mesa", 70, 1), ("selfextend", 96, 0), ("selfextend", 64, 3)],
    "window2-lambda2": [("window", 80, 0), ("window", 60, 2), ("lambda-only", 60, 0), ("lambda-only", 75, 1)],
    "rerope2-vanilla2": [("rerope", 75, 0), ("rerope", 50, 2), ("vanilla", 40, 0), ("vanilla", 64, 3)],
    "dca2-selfextend-lminf": [("dca", 90, 0), ("dca", 60, 2), ("selfextend", 96, 1), ("lminf", 80, 0)],
    "string2-rerope-vanilla": [("string", 90, 0), ("string", 60, 2), ("rerope", 75, 1), ("vanilla", 40, 0)],
    # auto's streams cross the trained context at different decodes, beside a dca stream of the same chunks
    "auto2-dca-vanilla": [("auto", 90, 0), ("auto", 28, 3), ("dca", 80, 1), ("vanilla", 40, 2)],
}
KV = [(F32, F32, False), (F16, F16, False), (F16, F16, True), (Q8_0, Q8_0, True)]


def method_kwargs(method: str) -> dict[str, int]:
    if method == "mesa":
        return {**MESA}
    if method == "selfextend":
        return {**SELFEXTEND}
    if method in ("dca", "auto"):
        return {**DCA}
    if method == "string":
        return {**STRING}
    if method == "streaming":
        return {"n_local": N_LOCAL - N_SINK, "n_sink": N_SINK}
    if method == "vanilla":
        return {}
    return {"n_local": N_LOCAL, "n_global": N_GLOBAL}


def oracle_logits(oracle, method: str, tokens: list[int], n_prompt: int) -> np.ndarray:
    return oracle.logits(tokens, rule_for(method, len(tokens), method_kwargs(method), L_TR, n_prompt))


def run_together(model, streams, kv, n_ubatch: int = 16, piece: int = 24):
    """Drive the streams through one SequenceBatch as a server would: a stream joins at its step, its prompt
    goes in pieces of `piece` tokens beside the others' decoding (Mesa's whole), then N_DECODE tokens one per
    step. Returns
    per stream the logits after the whole prompt and after each decoded token, and the stats."""
    type_k, type_v, fa = kv
    batch = SequenceBatch(str(model), n_seq=len(streams), n_ctx_seq=256, n_batch=64, n_ubatch=n_ubatch,
                          type_k=type_k, type_v=type_v, flash_attn=fa, n_gpu_layers=gpu_layers())
    fed = [0] * len(streams)
    got: list[list[np.ndarray]] = [[] for _ in streams]
    try:
        for step in range(200):
            feeds = {}
            for i, (method, n_prompt, join, tokens) in enumerate(streams):
                if step == join:
                    batch.open(i, method, n_ctx_train=L_TR, **method_kwargs(method))
                if step < join or fed[i] == len(tokens):
                    continue
                # Mesa's chunks follow from the prompt's length: its prompt goes in whole
                whole = method == "mesa"
                n = (n_prompt if whole else min(piece, n_prompt - fed[i])) if fed[i] < n_prompt else 1
                feeds[i] = tokens[fed[i] : fed[i] + n]
            if not feeds:
                break
            out = batch.step(feeds)
            assert sorted(out) == sorted(feeds)
            for i, toks in feeds.items():
                fed[i] += len(toks)
                if fed[i] >= streams[i][1]:
                    got[i].append(out[i].astype(np.float64))
        stats = [batch.stats(i) for i in range(len(streams))]
        assert [batch.n_past(i) for i in range(len(streams))] == [len(s[3]) for s in streams]
    finally:
        batch.close()
    return [np.array(g) for g in got], stats


@pytest.mark.parametrize("kv", KV, ids=kv_id)
@pytest.mark.parametrize("group", list(GROUPS))
def test_sequences_together_match_the_oracle(tiny_model, oracle, group, kv):
    streams = [(m, n, join, random_tokens(n + N_DECODE, seed=100 + 7 * i)) for i, (m, n, join) in enumerate(GROUPS[group])]
    got, stats = run_together(tiny_model, streams, kv)
    tol = tolerance(*kv)
    for (method, n_prompt, _, tokens), logits in zip(streams, got):
        ref = oracle_logits(oracle, method, tokens, n_prompt)[n_prompt - 1 :]
        assert logits.shape == ref.shape, method
        tol.check(logits, ref, f"{method} (n={n_prompt}) among {group} {kv_id(kv)}")
    # the fixed-cache streams stayed within their cells while 90+ tokens passed through
    for (method, _, _, _), st in zip(streams, stats):
        if farctx.methods.fixed_cache(method):
            assert st["n_cells_used"] <= st["n_ctx"] and st["n_cells_used"] < 90, (method, st)


def test_the_batch_decodes_streams_together(tiny_model):
    """Four decoding streams share each llama_decode (one per step, not one per stream): the batching the
    throughput comes from is really there."""
    streams = [(m, 40, 0, random_tokens(40 + N_DECODE, seed=i)) for i, m in enumerate(["lminf", "streaming", "window", "lminf"])]
    _, stats = run_together(tiny_model, streams, (F16, F16, True), n_ubatch=64, piece=64)
    # one prefill decode for the four 40-token prompts together, then one per decoded token
    assert [s["n_decode"] for s in stats] == [1 + N_DECODE] * 4


def test_a_failing_stream_leaves_the_others_untouched(tiny_model, oracle):
    """A stream fed a token outside the vocabulary fails alone: the others keep their tokens and go on to
    the oracle's logits."""
    batch = SequenceBatch(str(tiny_model), n_seq=2, n_ctx_seq=256, n_batch=64, n_ubatch=16, type_k=F32, type_v=F32)
    try:
        tokens = random_tokens(60, seed=3)
        batch.open(0, "lminf", n_ctx_train=L_TR, n_local=N_LOCAL, n_global=N_GLOBAL)
        batch.open(1, "lminf", n_ctx_train=L_TR, n_local=N_LOCAL, n_global=N_GLOBAL)
        batch.step({0: tokens[:40], 1: tokens[:10]})
        with pytest.raises(farctx.FarctxError, match="sequence 1: token"):
            batch.step({0: tokens[40:50], 1: [10**7]})
        assert batch.n_past(1) == 10
        last = batch.step({0: tokens[batch.n_past(0):60]})[0]
        ref = oracle.logits(tokens, method_rule("lminf", 60, N_LOCAL, N_GLOBAL))[59]
        tolerance(F32, F32, False).check(last[None].astype(np.float64), ref[None], "lminf after a neighbour's failure")
    finally:
        batch.close()


def test_one_unified_cache_is_refused(tiny_model):
    """Several sequences sharing one KV stream would share each query's mask row: llama.cpp refuses, with the
    reason."""
    import llama_cpp

    llm = llama_cpp.Llama(str(tiny_model), n_ctx=256, verbose=False)  # the model, loaded by llama-cpp-python
    try:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_seq_max, params.kv_unified = 512, 2, True
        ctx = llama_cpp.llama_init_from_model(llm.model, params)
        from farctx._native import native

        n = native()
        err = n.ffi.new("char[]", 512)
        lminf = farctx.MethodParams.from_kwargs("lminf", {"n_ctx_train": L_TR}).to_c(n.ffi, n.lib)
        session = n.lib.farctx_session_init_seq(n.llama_context_ptr(ctx), lminf, 1, err, 512)
        assert session == n.ffi.NULL
        assert "one unified KV cache" in n.ffi.string(err).decode()
        llama_cpp.llama_free(ctx)
    finally:
        llm.close()
