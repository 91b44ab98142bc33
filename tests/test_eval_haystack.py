"""farctx eval passkey --haystack: real prose as the filler; the needle sits at its depth, the prompt fits its
length, the samples are the same for the same seed."""

from __future__ import annotations

import json
import random

import pytest
from helpers import run_cli

import farctx
from farctx.eval.passkey import NEEDLE, PREFIX, QUESTION, haystack_paragraphs, make_haystack_sample

DOC = "\n\n".join(
    f"Paragraph {p} begins here. " + " ".join(f"Sentence {p}.{s} tells of the {['garden', 'letter', 'ball', 'visit'][s % 4]}"
                                              f" and of Mr. Knightley's opinion number {s}." for s in range(6))
    for p in range(300)
)


@pytest.fixture(scope="module")
def count(default_model):
    llm = farctx.Llama(str(default_model), n_ctx=256, n_batch=256)
    yield lambda text: len(llm.tokenize(text.encode("utf-8")))
    llm.close()


def test_paragraphs():
    assert haystack_paragraphs("a b\n\n\n c\n d \n\n  \n") == ["a b", "c d"]
    assert len(haystack_paragraphs(DOC)) == 300


@pytest.mark.parametrize("length", [300, 2000])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_needle_at_its_depth_and_the_length_fits(count, length, depth):
    sample = make_haystack_sample(length, depth, random.Random(3), count, haystack_paragraphs(DOC))
    n = count(sample.text)
    assert length - 60 <= n <= length  # cut at a sentence end: at most a sentence short
    assert sample.text.startswith(PREFIX) and sample.text.endswith(QUESTION)
    needle = NEEDLE.format(key=sample.key).strip()
    assert sample.text.count(needle) == 1
    filler_before, filler_after = sample.text[len(PREFIX):-len(QUESTION)].split(needle)
    before, after = count(filler_before), count(filler_after)
    measured = before / (before + after)
    assert abs(measured - depth) <= (0.08 if length == 300 else 0.03), (measured, depth)
    assert "Paragraph" in filler_before + filler_after and "grass is green" not in sample.text
    if 0 < depth < 1:
        assert filler_before.rstrip().endswith("."), filler_before[-40:]  # at a sentence boundary


def test_deterministic_per_seed(count):
    paragraphs = haystack_paragraphs(DOC)
    a = make_haystack_sample(800, 0.5, random.Random("1-800-0.5"), count, paragraphs)
    b = make_haystack_sample(800, 0.5, random.Random("1-800-0.5"), count, paragraphs)
    c = make_haystack_sample(800, 0.5, random.Random("2-800-0.5"), count, paragraphs)
    assert a == b
    assert a.key != c.key and a.text != c.text


def test_a_short_document_wraps_round(count):
    sample = make_haystack_sample(1500, 0.5, random.Random(1), count, ["One short paragraph of a story."])
    assert 1440 <= count(sample.text) <= 1500 and sample.text.count("One short paragraph") > 50


def test_cli_passkey_haystack(tmp_path, tiny_model):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    args = ("eval", "passkey", "-m", str(tiny_model), "--methods", "vanilla", "--lengths", "96,160",
            "--depths", "0,1", "--samples", "1", "--haystack", str(doc), "-c", "256")
    out = run_cli(*args, "--json", str(tmp_path / "a.json"))
    assert out.returncode == 0, out.stderr
    payload = json.loads((tmp_path / "a.json").read_text())
    assert payload["filler"].startswith(f"paragraphs of {doc}")
    assert [(r["length"], r["depth"]) for r in payload["results"]] == [(96, 0.0), (96, 1.0), (160, 0.0), (160, 1.0)]
    bad = run_cli("eval", "passkey", "-m", str(tiny_model), "--haystack", str(tmp_path / "missing.txt"))
    assert bad.returncode == 2 and "no such file" in bad.stderr
