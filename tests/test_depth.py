"""Every method at the default model's depth: graphs as large as the real model's.

A 2-layer model hides faults of the graph's size (its node budget, per-stream graphs): a random-weight model with
SmolLM2-135M's 30 layers and head layout (GQA 3:1, head_dim 64), narrow so that it runs in seconds, takes every
method x n_seq {1, 2, 4, 8} x flash attention on/off x F16/Q8_0 caches, with prompts past n_local and the
trained context (Mesa: several chunks, stair moves while decoding) and decoded tokens after them. Each stream must
get the logits it gets alone. Each (method, cache) case runs in its own process (tests/depth_worker.py), so that
an abort fails that case and not the suite.

Exactness beyond two layers: every method against the numpy oracle on a 6-layer model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import F16, F32, Q8_0, engine_logits, kv_id, random_tokens, tolerance
from oracle import OracleModel, rule_for
from tiny_gguf import NARROW6, write_tiny_gguf

from farctx.methods import method_names

METHODS = list(method_names())  # every method of libfarctx's table (tests/depth_worker.py: its parameters)
# flash attention off and on, F16 and Q8_0 caches (a quantized V needs flash attention)
DEPTH_KV = [(F16, F16, False), (F16, F16, True), (Q8_0, F16, False), (Q8_0, Q8_0, True)]
WORKER = Path(__file__).with_name("depth_worker.py")


def _worker(model, method: str, kv, *extra: str) -> dict:
    type_k, type_v, fa = kv
    run = subprocess.run([sys.executable, str(WORKER), str(model), method, str(type_k), str(type_v), str(int(fa)),
                          *extra], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{method} {kv_id(kv)}: worker exited {run.returncode}\n{run.stderr[-3000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def cases(kvs: list[tuple[int, int, bool]], per_method: list[list[int]]) -> list[Any]:
    """(method, kv): with FARCTX_FULL_MATRIX=1 (scripts/family-matrix) every method in every configuration; else
    method i in the configurations per_method[i % len(per_method)] (indices into kvs), a covering design that
    gives every configuration to several methods (the suite's time)."""
    return [pytest.param(m, kv, id=f"{m}-{kv_id(kv)}") for i, m in enumerate(METHODS) for k, kv in enumerate(kvs)
            if FULL_MATRIX or k in per_method[i % len(per_method)]]


FULL_MATRIX = os.environ.get("FARCTX_FULL_MATRIX", "") not in ("", "0")


# one configuration per method, in turn; with the deterministic test's, each method runs at this depth with flash
# attention off and on, and most with an F16 and a Q8_0 K cache (test_each_method_at_depth_with_fa_off_and_on)
STREAMS_CASES = cases(DEPTH_KV, [[2], [3], [0], [1]])


@pytest.mark.parametrize("method, kv", STREAMS_CASES)
def test_streams_at_depth_match_each_stream_alone(deep_model, method, kv):
    type_k, type_v, fa = kv
    report = _worker(deep_model, method, kv)
    # the batch oracle's bounds: beside other streams a stream's ubatches split otherwise (llama.cpp gives each
    # stream an equal share of a ubatch), so its cells go through other graph paths, with their own roundings
    bound = tolerance(type_k, type_v, fa).max_rel
    for n_seq in ("1", "2", "4", "8"):
        for i, row in enumerate(report[n_seq]):
            print(f"{method} {kv_id(kv)} n_seq {n_seq} stream {i}: max diff {row['max_diff']:.3g}, "
                  f"scale {row['scale']:.3g}")
            assert row["spread"] > 0.1, f"stream {i}: flat logits, the check could not fail"
            assert row["max_diff"] <= bound * row["scale"], f"{method} {kv_id(kv)} n_seq {n_seq} stream {i}: {row}"
    # a stream given another's logits would fail: the streams' own logits are far apart
    assert report["distinct"] > 5 * bound * max(r["scale"] for r in report["8"]), report["distinct"]


# batch-invariant kernels (farctx serve --deterministic): flash attention on and off, F16 and quantized caches
DETERMINISTIC_KV = [(F16, F16, False), (F16, F16, True), (Q8_0, Q8_0, True)]


# one configuration per method, in turn, the other flash-attention setting than its streams case (vanilla: flash
# attention on, where the check can fail)
DETERMINISTIC_CASES = cases(DETERMINISTIC_KV, [[1], [0], [2], [0]])


@pytest.mark.parametrize("method, kv", DETERMINISTIC_CASES)
def test_deterministic_streams_bitwise_equal_alone(deep_model, method, kv):
    """With batch-invariant kernels every stream's logits are bitwise those it gets alone, whatever its
    neighbours, its ubatch pieces and the paths the graph takes for them."""
    report = _worker(deep_model, method, kv, "deterministic")
    for n_seq in ("2", "4", "8"):
        for i, row in enumerate(report[n_seq]):
            assert row["spread"] > 0.1, f"stream {i}: flat logits, the check could not fail"
            assert row["max_diff"] == 0.0, f"{method} {kv_id(kv)} n_seq {n_seq} stream {i}: {row}"
    if method == "vanilla" and kv == (F16, F16, True):
        # the check can fail: the default kernels give this stream other logits beside others (llama.cpp's own
        # graph; if a newer ggml is batch-invariant by itself, --deterministic's cost buys nothing: say so)
        default = _worker(deep_model, method, kv)
        assert max(row["max_diff"] for n in ("2", "4", "8") for row in default[n]) > 0


def test_each_method_at_depth_with_fa_off_and_on():
    """The covering design of the two tests above: every method at 30 layers with several streams, flash attention
    off and on between them, a quantized K cache for most."""
    got: dict[str, set] = {m: set() for m in METHODS}
    for case in STREAMS_CASES + DETERMINISTIC_CASES:
        method, kv = case.values
        got[method].add(kv)
    for method, kvs in got.items():
        assert {fa for _, _, fa in kvs} == {False, True}, (method, kvs)
    assert sum(any(k == Q8_0 for k, _, _ in kvs) for kvs in got.values()) >= 0.7 * len(METHODS)
    assert ("vanilla", (F16, F16, True)) in [c.values for c in DETERMINISTIC_CASES]


# -- exactness beyond two layers --------------------------------------------------------------------------

L_TR = 32
N_TOKENS, N_PREFILL = 130, 90
MESA = dict(first_chunk=4, stair_width=2, last_context=8, gen_budget=2)
SELFEXTEND = dict(group=4, neighbor=8)
DCA = dict(chunk_size=24, local_window=4)  # chunks of 20: the previous chunk's query clamped from position 25
STRING = dict(shifted_offset=12, local_value=4)
NARROW_KV = [(F32, F32, False), (F16, F16, True), (Q8_0, Q8_0, True)]


def method_kwargs(method: str) -> dict[str, int]:
    return {"mesa": MESA, "selfextend": SELFEXTEND, "dca": DCA, "auto": DCA, "string": STRING, "vanilla": {},
            "streaming": {"n_local": 28, "n_sink": 4}}.get(method, {"n_local": 32, "n_global": 10})


def reference_rule(method: str, n: int, n_prompt: int):
    return rule_for(method, n, method_kwargs(method), L_TR, n_prompt)


@pytest.fixture(scope="module")
def narrow(tmp_path_factory: pytest.TempPathFactory, default_model: Path):
    path = write_tiny_gguf(tmp_path_factory.mktemp("narrow") / "narrow6.gguf", default_model, NARROW6)
    tokens = random_tokens(N_TOKENS, seed=61)
    oracle = OracleModel(path)
    refs = {m: oracle.logits(tokens, reference_rule(m, N_TOKENS, N_PREFILL)) for m in METHODS}
    return path, tokens, refs


def test_methods_differ_at_six_layers(narrow):
    """Past n_local the methods' oracle logits differ from vanilla's by far more than any tolerance."""
    _, _, refs = narrow
    for method in METHODS[1:]:
        scale = np.abs(refs["vanilla"]).max()
        assert np.abs(refs[method][60:] - refs["vanilla"][60:]).max() > 0.05 * scale, method


@pytest.mark.parametrize("kv", NARROW_KV, ids=kv_id)
@pytest.mark.parametrize("method", METHODS)
def test_methods_match_the_oracle_at_six_layers(narrow, method, kv):
    path, tokens, refs = narrow
    type_k, type_v, fa = kv
    # Mesa's prompt goes in whole (its chunks follow from the prompt's length)
    n_prefill = N_PREFILL
    got = engine_logits(path, tokens, n_prefill, n_ubatch=16, type_k=type_k, type_v=type_v, flash_attn=fa,
                        method=method, n_ctx=256, **method_kwargs(method))
    tolerance(type_k, type_v, fa).check(got, refs[method], f"{method} {kv_id(kv)} at 6 layers")
