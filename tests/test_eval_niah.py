"""farctx eval niah / eval passkey: the sampler puts each needle at its depth inside its length, the samples of a
length share their prefix, a grid run with the prompt cache answers as one without it, the JSON keeps every answer
and resumes, the heat map is a PNG."""

from __future__ import annotations

import json
import re
import struct

import pytest
from helpers import F32, run_cli

import farctx
from farctx.eval.niah import (FILLER, KINDS, REPEAT, Protocol, Record, Sampler, chat_formatter, effective_length,
                              haystack_paragraphs, parse_answer, plan_order, run_cells)

DOC = "\n\n".join(
    f"Paragraph {p} begins here. " + " ".join(f"Sentence {p}.{s} tells of the {['garden', 'letter', 'ball', 'visit'][s % 4]}"
                                              f" and of Mr. Knightley's opinion number {s}." for s in range(6))
    for p in range(300)
)


@pytest.fixture(scope="module")
def vocab(default_model):
    llm = farctx.Llama(str(default_model), vocab_only=True)
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def count(vocab):
    return lambda text: len(vocab.tokenize(text.encode("utf-8"), special=True))


def _sampler(count, chat_format=None, **protocol):
    return Sampler(Protocol(**protocol), haystack_paragraphs(DOC), count, seed=1, chat_format=chat_format)


def test_paragraphs():
    assert haystack_paragraphs("a b\n\n\n c\n d \n\n  \n") == ["a b", "c d"]
    assert len(haystack_paragraphs(DOC)) == 300


@pytest.mark.parametrize("answer, key", [(" The pass key is 4821.", 4821), ("4821", 4821), (" 4821 is it", 4821),
                                         (" I don't know.", None), ("", None), (" 12, no 34", 12)])
def test_answer_parser(answer, key):
    assert parse_answer(answer) == key


@pytest.mark.parametrize("placement", ["line", "inline"])
@pytest.mark.parametrize("length", [400, 2000])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_needle_at_its_depth_and_the_length_fits(count, placement, length, depth):
    sampler = _sampler(count, placement=placement)
    sample = sampler.sample(length, depth, 0)
    n = count(sample.text)
    assert sampler.budget(length) - 60 <= n <= sampler.budget(length) == length - sampler.answer_tokens
    kind = KINDS["passkey"]
    assert sample.text.startswith(kind.intro + "\n") and sample.text.endswith(f"{kind.question} {kind.cue}")
    needle = kind.needle.format(key=sample.key)
    assert sample.text.count(needle) == 1 and len(str(sample.key)) == 5
    before, after = sample.text[len(kind.intro) + 1 : -len(kind.question) - len(kind.cue) - 2].split(needle)
    measured = count(before) / (count(before) + count(after))
    assert abs(measured - depth) <= (0.06 if length == 400 else 0.03), (measured, depth)
    if placement == "line":
        assert (before == "" or before.endswith("\n")) and (after == "" or after.startswith("\n"))
    elif 0 < depth < 1:
        assert before.endswith(" ") and after.startswith(" ")
    if 0 < depth < 1:
        assert before.rstrip().endswith("."), before[-40:]  # at a sentence boundary


def test_samples_of_a_length_share_their_filler(count):
    sampler = _sampler(count)
    a, b, c = sampler.sample(1000, 0.9, 0), sampler.sample(1000, 0.9, 1), sampler.sample(1000, 0.2, 0)
    assert a.key != b.key and a.text != b.text
    cut = a.text.index(f"The pass key is {a.key}")
    assert a.text[:cut] == b.text[:cut]  # the same depth: the same text up to the needle
    cut_c = c.text.index(f"The pass key is {c.key}")
    assert a.text[: cut_c - 1] == c.text[: cut_c - 1]  # a shallower needle: the same text up to it
    assert not c.text[:cut_c].rstrip().endswith(("Mr.", "Mrs.")) and c.text[:cut_c].rstrip().endswith(".")
    again = _sampler(count).sample(1000, 0.9, 1)
    assert again == b  # deterministic for a seed
    other = Sampler(Protocol(), haystack_paragraphs(DOC), count, seed=2).sample(1000, 0.9, 1)
    assert other.key != b.key and other.text != b.text


def test_word_value_and_multikey(count):
    single = _sampler(count, kind="word-value", digits=7).sample(800, 0.5, 0)
    assert single.word and f"One of the special magic numbers for {single.word} is: {single.key}." in single.text
    assert single.text.endswith(f"The special magic number for {single.word} mentioned in the provided text is")
    assert len(str(single.key)) == 7
    multi = _sampler(count, kind="multikey", distractors=3).sample(800, 0.5, 0)
    needles = [line for line in multi.text.split("\n") if line.startswith("One of the special magic numbers for ")]
    assert len(needles) == 4 and sum(f" {multi.word} is: {multi.key}." in n for n in needles) == 1
    assert len({n.split(" for ")[1].split(" is:")[0] for n in needles}) == 4  # four different words


def test_repeat_filler_and_bare_question(count):
    sampler = Sampler(Protocol(haystack=REPEAT, placement="inline", digits=7, question="bare"), [FILLER], count)
    sample = sampler.sample(500, None, 3)
    assert "The grass is green." in sample.text and sample.text.endswith("What is the pass key?")
    assert 0.0 <= sample.depth <= 1.0 and sampler.answer_tokens > 20
    assert count(sample.text) <= sampler.budget(500)


def test_chat_template(count, vocab):
    fmt = chat_formatter(vocab)
    assert fmt is not None
    sample = _sampler(count, chat_format=fmt, chat=True).sample(600, 0.5, 0)
    assert sample.text.startswith("<|im_start|>") and "<|im_start|>assistant\n" in sample.text
    assert sample.text.endswith("assistant\nThe pass key is")
    assert count(sample.text) <= 600


def test_a_length_too_short_says_so(count):
    with pytest.raises(ValueError, match="holds no haystack"):
        _sampler(count).filler(40)
    with pytest.raises(ValueError, match="unknown needle kind"):
        Protocol(kind="magic")


def test_plan_order_reads_the_deepest_first():
    assert plan_order([200, 100], [0.1, 0.9, 0.5], 2) == [
        (100, 0.9, 0), (100, 0.9, 1), (100, 0.5, 0), (100, 0.5, 1), (100, 0.1, 0), (100, 0.1, 1),
        (200, 0.9, 0), (200, 0.9, 1), (200, 0.5, 0), (200, 0.5, 1), (200, 0.1, 0), (200, 0.1, 1)]


def _records(method, table):
    out = []
    for length, right in table.items():
        for i, ok in enumerate(right):
            out.append(Record(method, length, 0.5, i, 1, 1, None, 0.5, length, length, "", ok, 0.0))
    return out


def test_effective_length():
    recs = _records("m", {4096: [1, 1, 1, 1], 8192: [1, 1, 1, 0], 16384: [1, 1, 1, 0], 32768: [1, 0, 0, 0]})
    e = effective_length(recs, "m", 8192, 0.85)
    assert (e.length, e.threshold, e.reference) == (16384, 0.6375, 8192)
    assert effective_length(recs, "m", 8192, 0.9, absolute=True).length == 4096
    assert effective_length(recs, "m", 2048, 0.85).length is None  # no length inside the trained context
    assert effective_length(_records("z", {4096: [0, 0]}), "z", 8192, 0.85).length is None


@pytest.mark.parametrize("method", ["vanilla", "dca", "selfextend", "lminf"])
def test_prefix_sharing_answers_as_a_fresh_run(tiny_model, method):
    """The grid's order reads only what differs from the prompt before; the answers are those of prompts read whole.
    An F32 cache: a method that moves keys in place (dca, selfextend) moves some back on each rewind, which an F16
    cache rounds (docs/evaluation.md)."""
    vocab = farctx.Llama(str(tiny_model), vocab_only=True)

    def tokenize(text: str) -> list[int]:
        return vocab.tokenize(text.encode("utf-8"), special=True)

    sampler = Sampler(Protocol(digits=3), haystack_paragraphs(DOC), lambda t: len(tokenize(t)), seed=4)
    cells = plan_order([160, 240], [0.2, 0.8], 2)
    kwargs = dict(method=method, n_ctx=320, n_batch=64, n_ubatch=64, flash_attn=True, type_k=F32, type_v=F32)
    shared: list[Record] = []
    llm = farctx.Llama(str(tiny_model), **kwargs)
    run_cells(llm, sampler, method, cells, tokenize, shared.append)
    llm.close()
    fresh: list[Record] = []
    for cell in cells:
        llm = farctx.Llama(str(tiny_model), **kwargs)
        run_cells(llm, sampler, method, [cell], tokenize, fresh.append)
        llm.close()
    vocab.close()
    assert [r.answer for r in shared] == [r.answer for r in fresh]
    assert all(r.prompt_read == r.prompt_tokens for r in fresh)
    read, total = sum(r.prompt_read for r in shared), sum(r.prompt_tokens for r in shared)
    if method != "lminf":  # a fixed cache has evicted the prefix: it reads every prompt whole
        assert read < 0.75 * total, (read, total)


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_cli_niah_json_plot_and_resume(tmp_path, tiny_model):
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    args = ("eval", "niah", "-m", str(tiny_model), "--methods", "vanilla,dca", "--lengths", "128,192",
            "--depths", "0.25,0.75", "--samples", "2", "--haystack", str(doc), "-c", "256",
            "--json", str(tmp_path / "g.json"), "--plot", str(tmp_path / "g.png"))
    out = run_cli(*args)
    assert out.returncode == 0, out.stderr
    payload = json.loads((tmp_path / "g.json").read_text())
    # the tiny model carries the default model's chat template: niah's default reads in it
    assert payload["protocol"] == Protocol(kind="word-value", haystack=str(doc), chat=True).as_dict()
    assert payload["n_ctx_train"] == 32
    assert len(payload["samples"]) == 16 and set(payload["methods"]) == {"vanilla", "dca"}
    s = payload["samples"][0]
    assert {"method", "length", "depth", "seed", "key", "prompt_tokens", "answer", "correct"} <= set(s)
    assert all(r["prompt_tokens"] <= r["length"] for r in payload["samples"])
    assert len(payload["cells"]) == 8 and set(payload["effective_length"]) == {"vanilla", "dca"}
    assert payload["prompt_tokens_read"] < payload["prompt_tokens"]
    assert "| vanilla" in out.stdout and "effective length" in out.stdout
    assert "no length inside the trained context" in out.stdout  # 32: every length is past it
    assert re.search(r"niah vanilla +128 depth +0.75 #0: (right|wrong) '", out.stderr)
    assert _png_size(tmp_path / "g.png")[0] > 0
    again = run_cli(*args)  # resumed: nothing left to run
    assert again.returncode == 0 and "16 of 16" not in again.stderr and "8 of 8 samples already" in again.stderr
    assert json.loads((tmp_path / "g.json").read_text())["samples"] == payload["samples"]
    report = run_cli("eval", "niah", "-m", str(tiny_model), "--methods", "vanilla,dca", "--lengths", "128,192,256",
                     "--depths", "0.25,0.75", "--samples", "2", "--haystack", str(doc), "--report-only",
                     "--json", str(tmp_path / "g.json"))
    assert report.returncode == 0, report.stderr
    assert "| vanilla      |   0.25 |" in report.stdout and report.stdout.count(" - |") >= 4  # 256: not run
    assert json.loads((tmp_path / "g.json").read_text())["samples"] == payload["samples"]
    raw = run_cli(*args, "--raw")  # another protocol than the file's
    assert raw.returncode == 2 and "another protocol" in raw.stderr
    other = run_cli(*args, "--digits", "7")
    assert other.returncode == 2 and "another protocol" in other.stderr
    short = run_cli("eval", "niah", "-m", str(tiny_model), "--lengths", "40", "--haystack", str(doc))
    assert short.returncode == 2 and "holds no haystack" in short.stderr
    missing = run_cli("eval", "niah", "-m", str(tiny_model), "--haystack", str(tmp_path / "missing.txt"))
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_cli_niah_parameters_per_length(tmp_path, tiny_model):
    """Each length runs the method as sized for it (selfextend's group grows with the length); the JSON keeps the
    parameters per length, and a file from before, one description per method, resumes."""
    doc = tmp_path / "doc.txt"
    doc.write_text(DOC)
    path = tmp_path / "g.json"

    def niah(lengths: str, *extra: str):
        return run_cli("eval", "niah", "-m", str(tiny_model), "--methods", "selfextend", "--lengths", lengths,
                       "--depths", "0.5", "--haystack", str(doc), "--json", str(path), *extra)

    out = niah("128,256", "--samples", "1")
    assert out.returncode == 0, out.stderr
    params = json.loads(path.read_text())["methods"]["selfextend"]
    assert set(params) == {"128", "256"} and params["128"] != params["256"]
    said = [line for line in out.stderr.splitlines() if line.startswith("farctx: selfextend (")]
    assert len(said) == 2 and said[0].startswith(f"farctx: {params['128']}, cache")
    payload = json.loads(path.read_text())
    legacy = dict(payload, methods={"selfextend": params["128"]},
                  samples=[r for r in payload["samples"] if r["length"] == 128])
    path.write_text(json.dumps(legacy))
    resumed = niah("128,256", "--samples", "1")
    assert resumed.returncode == 0, resumed.stderr
    assert "1 of 2 samples already" in resumed.stderr
    assert json.loads(path.read_text())["methods"]["selfextend"] == params
    forced = niah("128", "--samples", "2", "--group", "8")  # a new sample at a length held under other parameters
    assert forced.returncode == 2 and "holds selfextend at 128 tokens with other parameters" in forced.stderr


def test_cli_passkey_is_niah_with_its_defaults(tmp_path, tiny_model):
    pk = run_cli("eval", "passkey", "-m", str(tiny_model), "--methods", "vanilla,streaming", "--lengths", "96",
                 "--samples", "2", "--json", "-")
    assert pk.returncode == 0, pk.stderr
    report = json.loads(pk.stdout)  # stdout holds the JSON alone
    assert report["protocol"] == Protocol(haystack=REPEAT, placement="inline", digits=7).as_dict()
    assert [(s["method"], s["depth"], s["index"]) for s in report["samples"]] == [
        ("vanilla", None, 0), ("vanilla", None, 1), ("streaming", None, 0), ("streaming", None, 1)]
    assert all(0.0 <= s["needle_depth"] <= 1.0 for s in report["samples"])
    assert report["samples"][0]["key"] == report["samples"][2]["key"]
