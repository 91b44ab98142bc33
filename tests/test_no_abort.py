"""Sizes a caller chooses never abort the process: each either runs or fails with an error that says why.

The cases below are what a probe of random sizes (methods, stream counts, batch and ubatch sizes, cache sizes,
windows, prompt lengths, flash attention, quantized caches) on a model of the default model's depth found to abort
or to fail without a reason, plus the reported abort itself; each runs through the Python API in a worker
process (tests/abort_probe.py), so that an abort fails the test with the case that was running.

Also: a window of one token (n_local 1) after a head of globals or sinks matches the numpy oracle (its eviction
once emptied the window, and llama.cpp refused the next position)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import F16, F32, Q8_0, engine_logits, random_tokens, tolerance
from oracle import method_rule

PROBE = Path(__file__).with_name("abort_probe.py")
TRAIN = {"n_ctx_train": 32}


def batch(method: str, n_seq: int, *, fa: bool, n_batch: int = 64, n_ubatch: int = 16, n_ctx_seq: int = 256,
          n_prompt: int = 64, feeding: list[int] | None = None, **params: int) -> dict:
    return {"kind": "batch", "method": method, "n_seq": n_seq, "n_ctx_seq": n_ctx_seq, "n_batch": n_batch,
            "n_ubatch": n_ubatch, "fa": fa, "n_prompt": n_prompt, "n_decode": 2,
            "feeding": feeding if feeding is not None else list(range(n_seq)), "params": {**TRAIN, **params}}


def llama(method: str, *, n_ctx: int, fa: bool, n_batch: int = 512, n_ubatch: int = 64, n_prompt: int = 200,
          **params: int) -> dict:
    return {"kind": "llama", "method": method, "n_ctx": n_ctx, "n_batch": n_batch, "n_ubatch": n_ubatch,
            "fa": fa, "n_prompt": n_prompt, "n_decode": 3, "params": {**TRAIN, **params}}


# (case, what comes of it: "ok" or a part of the error's message)
CASES = [
    # the graph's object budget at 30 layers (GGML_ASSERT(obj_new) before the fix): several streams, one fed
    (batch("lminf", 2, fa=True), "ok"),
    (batch("lminf", 4, fa=False), "ok"),
    (batch("window", 8, fa=False, feeding=[3]), "ok"),
    (batch("mesa", 8, fa=False, n_prompt=70, first_chunk=4, stair_width=2, last_context=8, gen_budget=2), "ok"),
    (batch("streaming", 16, fa=True, n_ctx_seq=64, n_prompt=40, feeding=[0, 15]), "ok"),
    # an output row per sequence in a buffer of n_batch rows (GGML_ASSERT(n_outputs_max <= ...) before)
    (batch("streaming", 4, fa=False, n_batch=1, n_local=1, n_sink=1), "n_batch (1) must be at least n_seq (4)"),
    (batch("lminf", 16, fa=True, n_batch=8, n_ubatch=8), "n_batch (8) must be at least n_seq (16)"),
    (batch("window", 2, fa=False, n_batch=0, n_ubatch=0), "must be at least n_seq"),
    # llama.cpp's own limits, with its reason
    (batch("lminf", 300, fa=True, n_batch=512, n_ctx_seq=64, feeding=[0]), "n_seq_max must be <= 256"),
    (llama("window", n_ctx=0, fa=False, n_batch=0, n_ubatch=0), "n_batch and n_ubatch cannot both be zero"),
    # a window of one token after a head (llama_decode failed with code -1 before: an emptied window)
    (llama("lambda-only", n_ctx=64, fa=False, n_local=1, n_global=10), "ok"),
    (llama("streaming", n_ctx=32, fa=True, n_ubatch=1, n_local=1, n_sink=1), "ok"),
    (batch("streaming", 2, fa=True, n_ubatch=512, n_prompt=31, feeding=[0], n_local=1, n_sink=4), "ok"),
    # sizes that cannot work: the error names them
    (llama("lminf", n_ctx=256, fa=False, n_ubatch=16, n_local=300, n_global=64),
     "lminf needs 380 KV cells: n_global + n_local + n_ubatch = 64 + 300 + 16; the KV cache holds 256"),
    (batch("lminf", 2, fa=False, n_ctx_seq=16, n_local=4, n_global=64), "n_global (64) must be smaller than n_local (4)"),
    (batch("mesa", 2, fa=True, first_chunk=16), "first_chunk (16) must be below half of n_ctx_train (32)"),
    (batch("vanilla", 2, fa=True, n_ctx_seq=64, n_prompt=700), "the stream needs 700 cells"),
]


def test_caller_sizes_run_or_fail_with_a_reason(deep_model, tmp_path):
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([c for c, _ in CASES]))
    run = subprocess.run([sys.executable, str(PROBE), str(deep_model), str(cases)], capture_output=True, text=True,
                         timeout=900)
    started = [line for line in run.stderr.splitlines() if line.startswith("start ")]
    assert run.returncode == 0, f"the worker exited {run.returncode} in {started[-1] if started else '?'}\n" \
                                f"{run.stderr[-3000:]}"
    results = [json.loads(line)["result"] for line in run.stdout.splitlines() if line.startswith('{"case"')]
    assert len(results) == len(CASES)
    for (case, expected), got in zip(CASES, results):
        if expected == "ok":
            assert got == "ok", (case, got)
        else:
            assert expected in got, (case, got)


@pytest.mark.parametrize("kv", [(F32, F32, False), (F16, F16, True), (Q8_0, Q8_0, True)],
                         ids=["f32", "f16-fa", "q8_0-fa"])
@pytest.mark.parametrize("method,params", [("lminf", {"n_local": 1, "n_global": 0}),
                                           ("lambda-only", {"n_local": 1, "n_global": 4}),
                                           ("streaming", {"n_local": 1, "n_sink": 2})])
def test_a_window_of_one_token_matches_the_oracle(tiny_model, oracle, method, params, kv):
    type_k, type_v, fa = kv
    n = 60
    tokens = random_tokens(n, seed=3)
    ref = oracle.logits(tokens, method_rule(method, n, 1, params.get("n_global", 0), n_sink=params.get("n_sink", 0)))
    got = engine_logits(tiny_model, tokens, 40, n_ubatch=8, type_k=type_k, type_v=type_v, flash_attn=fa,
                        method=method, n_ctx=256, **params)
    tolerance(type_k, type_v, fa).check(got, ref, f"{method} n_local 1")
