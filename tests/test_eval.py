"""farctx eval: the NLL equals the oracle's, passkey samples are deterministic and parsed, plots are PNGs."""

from __future__ import annotations

import json
import math
import random
import struct

import numpy as np
import pytest
from helpers import random_tokens
from oracle import method_rule
from helpers import run_cli

import farctx
from farctx.eval.passkey import make_sample, parse_answer
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


@pytest.mark.parametrize("answer, key", [(" The pass key is 4821.", 4821), ("4821", 4821), (" 4821 is it", 4821),
                                         (" I don't know.", None), ("", None), (" 12, no 34", 12)])
def test_passkey_answer_parser(answer, key):
    assert parse_answer(answer) == key


def test_passkey_samples_are_deterministic_and_fit():
    def count(text: str) -> int:
        return len(text.split())

    a = make_sample(300, 0.5, random.Random(7), count)
    b = make_sample(300, 0.5, random.Random(7), count)
    c = make_sample(300, 0.5, random.Random(8), count)
    assert a == b and a.key != c.key
    assert 1 <= a.key < 10**7 and count(a.text) <= 300
    assert a.text.index(str(a.key)) > len(a.text) // 3  # near the middle
    assert a.text.endswith("What is the pass key? The pass key is")


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_cli_eval_ppl_and_passkey_write_json_and_png(tmp_path, tiny_model):
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

    pk = run_cli("eval", "passkey", "-m", str(tiny_model), "--methods", "vanilla,streaming", "--lengths", "64",
                 "--depths", "0,1", "--samples", "2", "--json", "-", "--plot", str(tmp_path / "pk.png"))
    assert pk.returncode == 0, pk.stderr
    report = json.loads(pk.stdout)  # stdout holds the JSON alone
    assert {(r["method"], r["depth"]) for r in report["results"]} == {
        ("vanilla", 0.0), ("vanilla", 1.0), ("streaming", 0.0), ("streaming", 1.0)}
    assert all(r["samples"] == 2 and 0.0 <= r["accuracy"] <= 1.0 for r in report["results"])
    assert _png_size(tmp_path / "pk.png")[0] > 0


def test_eval_bad_lengths(tiny_model):
    result = run_cli("eval", "ppl", "-m", str(tiny_model), "--lengths", "10", "--window", "16")
    assert result.returncode == 1 and "larger than the scored window" in result.stderr
