"""Mesa-Extrapolation and SelfExtend through the patched attention graph equal the numpy oracle,
token by token: prompts of 2x-6x the trained context (several chunk counts and remainders), then
generated tokens across at least one stair wrap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import KV_CONFIGS, Q8_0, Tolerance, engine_logits, kv_id, random_tokens, tolerance
from oracle import mesa_rule, mesa_schedule, selfextend_rule, stair_pos

import farctx

L_TR = 32  # the tiny model's trained context
# the authors' defaults scaled to L_tr = 32 (C0 = L_tr - 2F = 24)
MESA = dict(first_chunk=4, stair_width=2, last_context=8, gen_budget=2)
N_DECODE = 30  # > C: the stair boundary moves at least once while generating


def test_design_test_vector_stair():
    """docs/methods.md 1.2: n=10, C=5, E=2."""
    keys = stair_pos(np.arange(10), 10 - (9 % 5), 2)
    assert keys.tolist() == [3, 3, 4, 4, 5, 5, 6, 7, 8, 9]
    assert (9 - keys).tolist() == [6, 6, 5, 5, 4, 4, 3, 2, 1, 0]


@pytest.mark.parametrize("n, chunk, n_middle", [(4096, 1767, 2), (8192, 1526, 5), (16384, 1758, 9), (32768, 1789, 18),
                                                (2100, 1538, 1), (2000, 1438, 1)])
def test_chunk_geometry_authors_defaults(n, chunk, n_middle):
    """The authors' split at their default train length 2048 (F=100, last 512, budget 50)."""
    assert mesa_schedule(n, 2048) == (True, chunk, n_middle)
    n_native = farctx.native_mesa_schedule(n, n_ctx_train=2048)
    assert n_native == (True, chunk, n_middle)


def test_short_prompts_are_not_chunked():
    assert mesa_schedule(1997, 2048)[0] is False
    assert farctx.native_mesa_schedule(1997, n_ctx_train=2048)[0] is False


PROMPTS = [64, 100, 150, 192]  # 2x-6x L_tr: 2, 3, 5, 7 middle chunks with remainders 6, 18, 20, 14


@pytest.fixture(scope="module")
def mesa_refs(oracle):
    refs = {}
    for n_prompt in PROMPTS:
        tokens = random_tokens(n_prompt + N_DECODE, seed=n_prompt)
        rule = mesa_rule(len(tokens), n_prompt, L_TR, **MESA)
        refs[n_prompt] = tokens, oracle.logits(tokens, rule)
    return refs


def test_mesa_differs_from_vanilla_in_the_oracle(oracle, mesa_refs):
    tokens, ref = mesa_refs[100]
    assert np.abs(ref - oracle.logits(tokens)).max() > 0.1 * np.abs(ref).max()


@pytest.mark.parametrize("n_ubatch", [1, 7, 64])
@pytest.mark.parametrize("kv", KV_CONFIGS, ids=kv_id)
def test_mesa_matches_oracle(tiny_model, mesa_refs, kv, n_ubatch):
    type_k, type_v, fa = kv
    prompts = PROMPTS if n_ubatch == 7 else [100]
    for n_prompt in prompts:
        tokens, ref = mesa_refs[n_prompt]
        stats: dict[str, int] = {}
        got = engine_logits(tiny_model, tokens, n_prompt, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                            flash_attn=fa, method="mesa", n_ctx=256, stats=stats, **MESA)
        what = f"mesa n={n_prompt} {kv_id(kv)} ubatch {n_ubatch}"
        _, chunk, n_middle = mesa_schedule(n_prompt, L_TR, MESA["first_chunk"], MESA["last_context"],
                                           MESA["gen_budget"])
        last = MESA["first_chunk"] + n_middle * chunk  # the last chunk: the cache may be rotated in place
        tol = tolerance(type_k, type_v, fa)
        tol.check(got[:last], ref[:last], f"{what} first and middle chunks")
        tol_gen = decode_tolerance(tol, type_k, stats["n_cache_rotations"])
        tol_gen.check(got[last:], ref[last:], f"{what} last chunk, generated ({stats['n_cache_rotations']} rotations)")


def decode_tolerance(tol: Tolerance, type_k: int, n_rotations: int) -> Tolerance:
    """From the last chunk on, mesa reads the cache rotated in place (once to the stair, again per
    boundary move); a quantized K cache is rounded again at each rotation: n + 1 independent roundings
    of K, so the bound grows as their root sum of squares."""
    return tol.widened(math.sqrt(1 + n_rotations)) if type_k == Q8_0 else tol


def test_mesa_short_prompt_is_vanilla(tiny_model):
    tokens = random_tokens(L_TR - MESA["gen_budget"] - 1, seed=3)
    mesa = engine_logits(tiny_model, tokens, len(tokens), n_ubatch=7, method="mesa", n_ctx=256, **MESA)
    vanilla = engine_logits(tiny_model, tokens, len(tokens), n_ubatch=7, n_ctx=256)
    assert np.abs(mesa - vanilla).max() <= 1e-5


def test_mesa_reports_stair_moves(tiny_model):
    llm = farctx.Llama(str(tiny_model), method="mesa", n_ctx=256, **MESA)
    tokens = random_tokens(100 + N_DECODE, seed=5)
    llm.eval(tokens[:100])
    for t in tokens[100:]:
        llm.eval([t])
    stats = llm.stats()
    assert stats["n_stair_moves"] >= 1
    # generated tokens read the cache rotated in place: once to the stair, once more per boundary move
    assert stats["n_cache_rotations"] >= 2
    llm.close()


@pytest.mark.parametrize("kv", KV_CONFIGS, ids=kv_id)
def test_mesa_rewind_rotates_the_cache_back(tiny_model, oracle, kv):
    """An unchunked prompt, generation past L_tr (the cache rotated in place to the stair, and again at
    each boundary move), a rewind to inside the trained context (the cache goes back to true positions
    for the stock graph), then the same tokens again: every row equals the oracle."""
    type_k, type_v, fa = kv
    n_prompt, n_keep = 24, 27
    tokens = random_tokens(n_prompt + N_DECODE, seed=11)
    ref = oracle.logits(tokens, mesa_rule(len(tokens), n_prompt, L_TR, **MESA))
    llm = farctx.Llama(str(tiny_model), method="mesa", n_ctx=256, n_ubatch=7, logits_all=True,
                       type_k=type_k, type_v=type_v, flash_attn=fa, **MESA)
    try:
        llm.eval(tokens[:n_prompt])
        for t in tokens[n_prompt:]:
            llm.eval([t])
        first = np.array(llm.scores[: len(tokens)], dtype=np.float64)
        rotations = llm.stats()["n_cache_rotations"]
        assert rotations >= 2
        llm.n_tokens = n_keep
        for t in tokens[n_keep:]:
            llm.eval([t])
        again = np.array(llm.scores[: len(tokens)], dtype=np.float64)
        total = llm.stats()["n_cache_rotations"]
        assert total >= rotations + 2  # back to true positions, then the stair
    finally:
        llm.close()
    tol = tolerance(type_k, type_v, fa)
    decode_tolerance(tol, type_k, rotations).check(first, ref, f"mesa first pass {kv_id(kv)}")
    decode_tolerance(tol, type_k, total).check(again, ref, f"mesa after the rewind {kv_id(kv)}")


@pytest.mark.parametrize("kv", KV_CONFIGS, ids=kv_id)
def test_mesa_second_prompt_reads_the_rotated_cache_through_deltas(tiny_model, oracle, kv):
    """A chunked prompt, generated tokens (the cache rotated in place to the stair), then a second prompt of 53
    tokens in one feed: [110, 120) reads the cache as is (10 tokens, the same stair), [120, 144) and [144, 163)
    (past two stair moves; C = 24) rotate a copy of the keys from where the cache holds them, and the cache is
    not rotated; then generated tokens again (rotated in place): every row equals the oracle."""
    type_k, type_v, fa = kv
    n_prompt, n_gen, n_second = 100, 10, 53
    tokens = random_tokens(n_prompt + 2 * n_gen + n_second, seed=13)
    ref = oracle.logits(tokens, mesa_rule(len(tokens), n_prompt, L_TR, **MESA))
    llm = farctx.Llama(str(tiny_model), method="mesa", n_ctx=256, n_batch=64, n_ubatch=64, logits_all=True,
                       type_k=type_k, type_v=type_v, flash_attn=fa, **MESA)
    try:
        llm.eval(tokens[:n_prompt])
        assert llm.stats()["n_cache_rotations"] == 0  # the last chunk's batches read through key deltas
        for t in tokens[n_prompt:n_prompt + n_gen]:
            llm.eval([t])
        rotated = llm.stats()["n_cache_rotations"]
        assert rotated >= 1
        moves = llm.stats()["n_stair_moves"]
        llm.eval(tokens[n_prompt + n_gen:n_prompt + n_gen + n_second])
        assert llm.stats()["n_stair_moves"] > moves and llm.stats()["n_cache_rotations"] == rotated
        for t in tokens[n_prompt + n_gen + n_second:]:
            llm.eval([t])
        total = llm.stats()["n_cache_rotations"]
        assert total > rotated
        got = np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()
    decode_tolerance(tolerance(type_k, type_v, fa), type_k, total).check(got, ref, f"mesa second prompt {kv_id(kv)}")


SELFEXTEND = dict(group=4, neighbor=8)


@pytest.fixture(scope="module")
def selfextend_ref(oracle):
    tokens = random_tokens(128, seed=21)
    return tokens, oracle.logits(tokens, selfextend_rule(len(tokens), **SELFEXTEND))


@pytest.mark.parametrize("n_ubatch", [1, 7, 64])
@pytest.mark.parametrize("kv", KV_CONFIGS, ids=kv_id)
def test_selfextend_matches_oracle(tiny_model, selfextend_ref, kv, n_ubatch):
    tokens, ref = selfextend_ref
    type_k, type_v, fa = kv
    got = engine_logits(tiny_model, tokens, 96, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v, flash_attn=fa,
                        method="selfextend", n_ctx=256, **SELFEXTEND)
    tolerance(type_k, type_v, fa).check(got, ref, f"selfextend {kv_id(kv)} ubatch {n_ubatch}")


def test_selfextend_auto_group(tiny_model):
    llm = farctx.Llama(str(tiny_model), method="selfextend", n_ctx=512)
    # W = L_tr / 2 = 16; G = ceil((512 - 16) / (32 - 16)) = 31
    assert llm.method_params.neighbor == 16 and llm.method_params.group == 31
    llm.close()
