"""farctx eval ppl: the NLL equals the oracle's, streams pool, the JSON and the plot (niah: test_eval_niah.py)."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
from helpers import random_tokens
from oracle import method_rule
from helpers import run_cli

import farctx
from farctx.eval.ppl import PplResult, nll, perplexity_of_method, pool


def test_ppl_nll_equals_the_oracle(tiny_model, oracle):
    tokens = random_tokens(200, seed=31)
    lengths, window = [64, 128, 200], 24
    llm = farctx.Llama(str(tiny_model), method="lminf", n_ctx=256, n_ubatch=16, n_batch=16, type_k=0, type_v=0)
    results = perplexity_of_method(llm, tokens, lengths, window)
    llm.close()
    ref_logits = oracle.logits(tokens, method_rule("lminf", len(tokens), 32, 10))
    for result, length in zip(results, lengths):
        start = length - window
        ref = nll(ref_logits[start - 1 : length - 1], tokens[start:length])
        assert result.tokens_scored == window
        assert abs(np.log(result.ppl) - ref.mean()) <= 1e-5


def test_nll_by_hand():
    logits = np.array([[0.0, np.log(3.0)], [2.0, 2.0]])
    assert np.allclose(nll(logits, [1, 0]), [-np.log(0.75), np.log(2.0)])


def test_pooled_streams_weigh_every_scored_token_alike():
    a = [PplResult("lminf", 512, math.exp(2.0), 10), PplResult("lminf", 1024, math.exp(1.0), 10)]
    b = [PplResult("lminf", 512, math.exp(4.0), 30), PplResult("lminf", 1024, math.exp(3.0), 10)]
    pooled = pool([a, b])
    assert [r.length for r in pooled] == [512, 1024]
    assert pooled[0].ppl == pytest.approx(math.exp((2.0 * 10 + 4.0 * 30) / 40))
    assert pooled[1].ppl == pytest.approx(math.exp(2.0)) and pooled[1].tokens_scored == 20


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_cli_eval_ppl_writes_json_and_png(tmp_path, tiny_model):
    text = tmp_path / "doc.txt"
    text.write_text(" ".join(f"sentence number {k} is here." for k in range(400)))
    ppl = run_cli("eval", "ppl", "-m", str(tiny_model), "-f", str(text), "--methods", "vanilla,lminf,mesa",
                  "--lengths", "64,128", "--window", "16", "--first-chunk", "4", "--stair-width", "2",
                  "--last-context", "8", "--gen-budget", "2",
                  "--json", str(tmp_path / "ppl.json"), "--plot", str(tmp_path / "ppl.png"))
    assert ppl.returncode == 0, ppl.stderr
    report = json.loads((tmp_path / "ppl.json").read_text())
    assert report["n_ctx_train"] == 32 and "protocol" in report
    assert [(r["method"], r["length"]) for r in report["results"]] == [
        ("vanilla", 64), ("vanilla", 128), ("lminf", 64), ("lminf", 128), ("mesa", 64), ("mesa", 128)]
    assert all(r["tokens_scored"] == 16 and r["ppl"] > 1 for r in report["results"])
    assert _png_size(tmp_path / "ppl.png") == (800, 500)
    assert "| vanilla" in ppl.stdout



def test_eval_bad_lengths(tiny_model):
    result = run_cli("eval", "ppl", "-m", str(tiny_model), "--lengths", "10", "--window", "16")
    assert result.returncode == 1 and "larger than the scored window" in result.stderr
