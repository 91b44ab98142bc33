"""LM-Infinite and its ablations through the patched attention graph equal the numpy oracle,
token by token, over streams several times n_local (prefill, then one-token decodes)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import KV_CONFIGS, engine_logits, kv_id, random_tokens, tolerance
from oracle import OracleModel, method_rule
from tiny_gguf import TinyConfig, write_tiny_gguf

import farctx

N_TOKENS = 160   # 5 x n_local
N_PREFILL = 100
N_LOCAL = 32     # the tiny model's n_ctx_train: the default n_local
N_GLOBAL = 10    # the default n_global
N_SINK = 4       # the default n_sink; streaming's window is then n_ctx_train - n_sink
METHODS = ["lminf", "window", "lambda-only", "rerope", "streaming"]


def rule(method: str, n: int):
    if method == "streaming":
        return method_rule(method, n, N_LOCAL - N_SINK, n_sink=N_SINK)
    return method_rule(method, n, N_LOCAL, N_GLOBAL)


def test_design_test_vector_lminf():
    """docs/methods.md 1.1, L=3, G=2: relpos per key 0..i (`*` global, `-` masked)."""
    rule = method_rule("lminf", 8, n_local=3, n_global=2)

    def row(i: int) -> list[str]:
        return [
            (f"{rule.relpos[i, j]}*" if j < 2 and i - j >= 3 else str(rule.relpos[i, j])) if rule.allowed[i, j] else "-"
            for j in range(i + 1)
        ]

    assert row(3) == ["3*", "2", "1", "0"]
    assert row(5) == ["3*", "3*", "-", "2", "1", "0"]
    assert row(7) == ["3*", "3*", "-", "-", "-", "2", "1", "0"]


def test_streaming_rule_is_cache_index_distance():
    """StreamingLLM with S=2 sinks and a window of R=3: past the cache, every query sees its sinks
    at the distance they would have inside a cache of S + R slots (docs/methods.md 1.3)."""
    r = method_rule("streaming", 9, n_local=3, n_sink=2)
    visible = {i: [(j, int(r.relpos[i, j])) for j in range(i + 1) if r.allowed[i, j]] for i in (4, 8)}
    assert visible[4] == [(0, 4), (1, 3), (2, 2), (3, 1), (4, 0)]   # still inside the cache: vanilla
    assert visible[8] == [(0, 4), (1, 3), (6, 2), (7, 1), (8, 0)]   # slots 0 1 | 2 3 4


@pytest.fixture(scope="module")
def references(oracle):
    tokens = random_tokens(N_TOKENS, seed=11)
    return tokens, {m: oracle.logits(tokens, rule(m, N_TOKENS)) for m in METHODS}


def test_methods_differ_from_vanilla_in_the_oracle(oracle, references):
    """Past n_local every method changes the logits by far more than any tolerance: the checks can fail."""
    tokens, refs = references
    vanilla = oracle.logits(tokens)
    for method, ref in refs.items():
        assert np.abs(ref[:N_LOCAL] - vanilla[:N_LOCAL]).max() < 1e-9, method  # within n_local: vanilla
        assert np.abs(ref[N_LOCAL + 8 :] - vanilla[N_LOCAL + 8 :]).max() > 0.1 * np.abs(vanilla).max(), method


@pytest.mark.parametrize("n_ubatch", [1, 7, 64])
@pytest.mark.parametrize("kv", KV_CONFIGS, ids=kv_id)
@pytest.mark.parametrize("method", METHODS)
def test_method_matches_oracle(tiny_model, references, method, kv, n_ubatch):
    tokens, refs = references
    type_k, type_v, fa = kv
    got = engine_logits(tiny_model, tokens, N_PREFILL, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                        flash_attn=fa, method=method, n_ctx=256)
    tolerance(type_k, type_v, fa).check(got, refs[method], f"{method} {kv_id(kv)} ubatch {n_ubatch}")


def test_lminf_equals_vanilla_within_n_local(tiny_model):
    tokens = random_tokens(N_LOCAL, seed=12)
    vanilla = engine_logits(tiny_model, tokens, N_LOCAL, n_ubatch=7)
    lminf = engine_logits(tiny_model, tokens, N_LOCAL, n_ubatch=7, method="lminf", n_ctx=256)
    assert np.abs(vanilla - lminf).max() <= 1e-5


@pytest.mark.parametrize("method", ["lminf", "window", "lambda-only", "streaming"])
def test_fixed_cache_over_a_long_stream(tiny_model, method):
    """10,000 tokens through a 256-cell cache: never more than n_global + n_local + n_ubatch cells in use."""
    n_ubatch = 64
    llm = farctx.Llama(str(tiny_model), method=method, n_ctx=256, n_batch=1024, n_ubatch=n_ubatch)
    bound = N_GLOBAL + N_LOCAL + n_ubatch
    tokens = random_tokens(10_000, seed=13)
    peak = 0
    llm.progress = lambda done, total: None
    for start in range(0, len(tokens), 1000):
        llm.eval(tokens[start : start + 1000])
        peak = max(peak, llm.stats()["n_cells_used"])
    stats = llm.stats()
    assert stats["n_past"] == 10_000 and llm.n_tokens == 10_000
    assert peak <= bound and stats["n_cells_used"] <= bound
    llm.close()


def test_cache_too_small_is_refused(tiny_model):
    with pytest.raises(farctx.FarctxError, match="lminf needs 298 KV cells: n_global \\+ n_local \\+ n_ubatch = "
                       "10 \\+ 32 \\+ 256; the KV cache holds 256"):
        farctx.Llama(str(tiny_model), method="lminf", n_ctx=256, n_ubatch=256, n_local=32)


def test_rewind_into_evicted_keys_replays_the_stream(tiny_model, oracle):
    """llama_cpp's prompt-prefix reuse rewinds the stream; past evicted keys farctx feeds it again
    from the start, so the logits are still the method's."""
    tokens = random_tokens(120, seed=14)
    llm = farctx.Llama(str(tiny_model), method="lminf", n_ctx=256, n_ubatch=16, n_batch=16, logits_all=True,
                       type_k=0, type_v=0)
    llm.eval(tokens[:100])
    llm.n_tokens = 50  # as llama_cpp's prefix reuse does
    llm.eval(tokens[50:120])
    assert llm.n_tokens == 120 and llm.stats()["n_past"] == 120
    ref = oracle.logits(tokens, method_rule("lminf", 120, N_LOCAL, N_GLOBAL))
    # the suite's F32 bound: 1e-4 on the CPU, the F16 bound where a GPU computes F32 products in TF32
    tolerance(0, 0, False).check(np.array(llm.scores[:120], dtype=np.float64), ref, "lminf after a replayed rewind")
    llm.close()


@pytest.fixture(scope="module")
def gqa_model(tmp_path_factory, default_model):
    """4 query heads on 2 KV heads (head_dim 32): the head grouping of the few-query value product."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("gqa") / "gqa.gguf", default_model,
                           TinyConfig(n_head=4, n_head_kv=2, seed=3))
    tokens = random_tokens(N_TOKENS, seed=15)
    return path, tokens, OracleModel(path).logits(tokens, rule("lminf", N_TOKENS))


@pytest.mark.parametrize("n_ubatch", [1, 7, 64])
@pytest.mark.parametrize("kv", [c for c in KV_CONFIGS if c[2]], ids=kv_id)
def test_lminf_with_several_kv_heads(gqa_model, kv, n_ubatch):
    path, tokens, ref = gqa_model
    type_k, type_v, fa = kv
    got = engine_logits(path, tokens, N_PREFILL, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                        flash_attn=fa, method="lminf", n_ctx=256)
    tolerance(type_k, type_v, fa).check(got, ref, f"gqa lminf {kv_id(kv)} ubatch {n_ubatch}")


def _fixed_cache_f16_fa(model, method: str, tokens: list[int], n_prefill: int, n_local: int, *, n_ctx: int,
                        n_threads: int):
    """lminf (default globals) or streaming (default sinks) with n_local over an F16 cache with flash attention,
    ubatch 64: the engine's logits, the oracle's rule, and the flash-attention nodes it computed."""
    from helpers import F16

    from farctx.eval.tensor_probe import FlashAttnLayouts, eval_callback_installed

    n = len(tokens)
    if method == "streaming":
        kwargs, ref_rule = dict(n_local=n_local, n_sink=N_SINK), method_rule(method, n, n_local, n_sink=N_SINK)
    else:
        kwargs, ref_rule = dict(n_local=n_local, n_global=N_GLOBAL), method_rule(method, n, n_local, N_GLOBAL)
    probe = FlashAttnLayouts()
    with eval_callback_installed(probe):
        got = engine_logits(model, tokens, n_prefill, n_ubatch=64, type_k=F16, type_v=F16, flash_attn=True,
                            method=method, n_ctx=n_ctx, n_threads=n_threads, **kwargs)
    probe.check()
    return got, ref_rule, probe.nodes


@pytest.mark.parametrize("method", ["lminf", "streaming"])
def test_decode_over_free_cells_split_across_threads_matches_oracle(tiny_model, oracle, method):
    """Patch 0008: one query over a view of at least 512 cells takes the CPU's split-KV flash attention, whose
    threads now start at equal counts of unmasked cells instead of equal cell counts. A fixed cache past a long
    prompt has free cells in its view (evicted keys, the room for a ubatch), so the ranges move; every cell
    must still be read exactly once: the decoded tokens' logits equal the oracle's with 4 threads."""
    from helpers import F16

    n, n_prefill, n_local = 1400, 1360, 600
    tokens = random_tokens(n, seed=17)
    got, ref_rule, fa_nodes = _fixed_cache_f16_fa(tiny_model, method, tokens, n_prefill, n_local,
                                             n_ctx=2048, n_threads=4)
    decode_views = [node.ops["k"].ne[1] for node in fa_nodes if node.ops["q"].ne[1] == 1]
    assert decode_views and min(decode_views) >= 512, f"decode views {sorted(set(decode_views))}: no split-KV path"
    assert max(decode_views) > n_local + N_GLOBAL + 1, "no free cell in view"
    tolerance(F16, F16, True).check(got[n_prefill:], oracle.logits(tokens, ref_rule)[n_prefill:],
                                    f"{method} decode over {sorted(set(decode_views))} cells")


@pytest.mark.parametrize("method", ["lminf", "streaming"])
def test_decode_over_a_full_view_merges_two_flash_attentions(tiny_model, oracle, method):
    """A fixed cache whose live cells are a whole number of 256-cell blocks (streaming's default 4 + 2044 = 2048)
    has, after a prompt of that length, every cell in view in use, and each decoded token takes the cell that
    its eviction just freed: no free cell in view, ever. One query there goes through two flash-attention calls
    over views of the cache, merged by log-sum-exp in the kernel (patch 0009, native/llama), not through a copy of
    every cell per token (the concatenation of both cell ranges, which ran streaming's decode at about half of
    window's). The decoded tokens equal the oracle's and the flash-attention nodes show the path: decode nodes with
    lse over cache views whose cells are all live."""
    from helpers import F16, gpu_layers

    head = N_SINK if method == "streaming" else N_GLOBAL
    n_local = 256 - head
    n_prefill, n = 256, 296
    tokens = random_tokens(n, seed=23)
    got, ref_rule, fa_nodes = _fixed_cache_f16_fa(tiny_model, method, tokens, n_prefill, n_local,
                                             n_ctx=256 + 64, n_threads=2)
    tolerance(F16, F16, True).check(got[n_prefill:], oracle.logits(tokens, ref_rule)[n_prefill:],
                                    f"{method} decode over a full view")
    if gpu_layers():
        return  # a GPU cache has no log-sum-exp path: the concatenation (exact, checked above)
    decode = [node for node in fa_nodes if node.ops["q"].ne[1] == 1]
    seen = [(n.lse, n.ops["k"].origin, n.ops["k"].ne[1]) for n in decode]
    # the first decoded token may still find free cells in view (native/llama's free-cell path); from then on the
    # main segment's view is every cell after the head ones, 256 in view, all live
    # (a node per graph computed: a decoded token each)
    main = [node for node in decode if node.ops["k"].ne[1] != head]
    full = [node for node in main if node.lse]
    assert full and main[-1].lse and all(node.ops["k"].origin == "cache" for node in full), f"decode nodes {seen}"
    assert {node.ops["k"].ne[1] for node in full} == {256 - head}, f"decode nodes {seen}"
    assert not any(node.ops["k"].origin == "CONCAT" for node in decode), f"decode nodes {seen}"
