"""Needle in a haystack: a needle (a key, or a word and its number) hidden at a depth of a long text, a question
at the end, the answer scored by string match (the first integer of the greedy answer equals the key).

One sampler serves `farctx eval niah` and `farctx eval passkey`. A grid is lengths x depths x samples per cell.
Every sample of one length shares its haystack (the filler is cut once per length), so a prompt shares its
prefix with the one before it up to the earlier of their needles: run in order of depth, deepest first, the
prompt cache of llama_cpp.Llama reads only what differs (`run_cells`). The protocol's sources and the ablation
that chose its defaults: docs/evaluation.md.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

# -- the needle kinds ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NeedleKind:
    intro: str      # the task, before the text
    needle: str     # {key}, {word}
    question: str   # {word}
    cue: str        # the answer's start, {word}
    words: bool     # whether the needle names a word


KINDS: dict[str, NeedleKind] = {
    # the LM-Infinite / Landmark Attention passkey
    "passkey": NeedleKind(
        intro=("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
               "I will quiz you about the important information there."),
        needle="The pass key is {key}. Remember it. {key} is the pass key.",
        question="What is the pass key?",
        cue="The pass key is",
        words=False),
    # RULER's niah_single_2 form (a word and its number)
    "word-value": NeedleKind(
        intro=("A special magic number is hidden within the following text. Make sure to memorize it. "
               "I will quiz you about the number afterwards."),
        needle="One of the special magic numbers for {word} is: {key}.",
        question="What is the special magic number for {word} mentioned in the provided text?",
        cue="The special magic number for {word} mentioned in the provided text is",
        words=True),
}
KINDS["multikey"] = KINDS["word-value"]  # the same needle among distractors of its form (RULER niah_multikey_1)
KIND_NAMES = ("passkey", "word-value", "multikey")
PLACEMENTS = ("line", "inline")
QUESTIONS = ("cue", "bare")

_ADJECTIVES = ("quiet", "amber", "brisk", "hollow", "silver", "gentle", "rapid", "narrow", "frosty", "golden",
               "humble", "little", "modern", "polite", "rustic", "scarlet", "shallow", "sturdy", "tender", "vivid",
               "wooden", "yellow", "clever", "distant", "eager", "fancy", "glossy", "hearty", "jolly", "lucky")
_NOUNS = ("harbor", "teapot", "lantern", "meadow", "pencil", "violin", "walnut", "basket", "candle", "garden",
          "hammer", "island", "jacket", "kettle", "ladder", "mirror", "needle", "orchard", "pepper", "rabbit",
          "saddle", "tomato", "umbrella", "valley", "window", "anchor", "button", "carpet", "dolphin", "feather")

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
REPEAT = "repeat"  # --haystack repeat: the repeated sentences of the LM-Infinite passkey


@dataclass(frozen=True)
class Protocol:
    """What a sample looks like; the JSON keeps it, and a resumed run must ask for the same."""

    kind: str = "passkey"
    haystack: str = "austen:emma"
    placement: str = "line"      # the needle on a line of its own, or inline in its paragraph
    digits: int = 5              # the key has exactly this many digits
    question: str = "cue"        # cue: the question then the answer's start; bare: the question alone
    chat: bool = False           # the document and question as a user message of the model's chat template
    distractors: int = 3         # multikey: needles of the same form with other words and numbers

    def __post_init__(self) -> None:
        if self.kind not in KIND_NAMES:
            raise ValueError(f"unknown needle kind '{self.kind}' (choose from {', '.join(KIND_NAMES)})")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement '{self.placement}' (choose from {', '.join(PLACEMENTS)})")
        if self.question not in QUESTIONS:
            raise ValueError(f"unknown question form '{self.question}' (choose from {', '.join(QUESTIONS)})")
        if not 1 <= self.digits <= 12:
            raise ValueError("a key has 1 to 12 digits")
        if self.distractors < 0:
            raise ValueError("distractors: 0 or more")

    def describe(self) -> str:
        extra = f", {self.distractors} distractor needles" if self.kind == "multikey" else ""
        form = "the model's chat template" if self.chat else "raw completion"
        return (f"{self.kind} needle ({self.digits}-digit key{extra}) {'on a line of its own' if self.placement == 'line' else 'inline'} "
                f"at the sentence boundary nearest its depth of {self.haystack}; question {self.question}; {form}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Sample:
    length: int          # the prompt and its answer fit in this many tokens
    depth: float
    index: int           # the sample's number inside its cell
    key: int
    word: Optional[str]
    text: str            # the prompt (with the chat template's markup when the protocol asks for it)


def parse_answer(text: str) -> Optional[int]:
    """The first integer in the answer, or None."""
    match = re.search(r"\d+", text)
    return int(match.group()) if match else None


def haystack_paragraphs(text: str) -> list[str]:
    """The document's paragraphs (blank-line separated), each on one line."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return [p for p in paragraphs if p]


# a sentence ends at . ! or ? (and its closing quotes), not after a title or an initial ("Mr. Knightley", "J. Smith")
_SENTENCE_END = re.compile(r"(?<=[.!?])(?<!\bMr\.)(?<!\bMrs\.)(?<!\bMs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\b[A-Z]\.)"
                           r"[\"'\u201d\u2019_)]*\s+")


def _boundary(filler: str, depth: float) -> int:
    """The sentence boundary nearest depth * len(filler) (the nearest space where no sentence ends nearby)."""
    target = depth * len(filler)
    cuts = [m.end() for m in _SENTENCE_END.finditer(filler)] + [0, len(filler)]
    best = min(cuts, key=lambda c: abs(c - target))
    if abs(best - target) > 400:
        spaces = [m.end() for m in re.finditer(r"\s+", filler)]
        best = min(spaces + [0, len(filler)], key=lambda c: abs(c - target))
    return best


def _insert(filler: str, needles: Sequence[tuple[float, str]], placement: str) -> str:
    """filler with each (depth, needle) at its sentence boundary, in order of depth."""
    sep = "\n" if placement == "line" else " "
    out, last = [], 0
    for depth, needle in sorted(needles):
        cut = max(_boundary(filler, depth), last)
        piece = filler[last:cut].strip()
        if piece:
            out.append(piece)
        out.append(needle)
        last = cut
    tail = filler[last:].strip()
    if tail:
        out.append(tail)
    # inline: a paragraph break around the needle stays a paragraph break
    return sep.join(out) if placement == "line" else " ".join(out).replace(" \n", "\n").replace("\n ", "\n")


class Sampler:
    """The samples of one protocol for a tokenizer: `count(text)` is the prompt's token count."""

    def __init__(self, protocol: Protocol, paragraphs: Sequence[str], count: Callable[[str], int],
                 seed: int = 1, chat_format: Optional[Callable[[str], str]] = None) -> None:
        if not paragraphs:
            raise ValueError("the haystack has no text")
        if protocol.chat and chat_format is None:
            raise ValueError("--chat: this model has no chat template")
        self.protocol = protocol
        self.kind = KINDS[protocol.kind]
        self.paragraphs = list(paragraphs)
        self.count = count
        self.seed = seed
        self.chat_format = chat_format
        self._fillers: dict[int, str] = {}
        n_key = count(" " + "9" * protocol.digits) - count("")
        # the answer's tokens: the key and two more after a cue; room for a sentence before it without one
        self.answer_tokens = n_key + 2 if protocol.question == "cue" else n_key + 24

    # the prompt around a filler
    def _prompt(self, body: str, word: Optional[str]) -> str:
        k = self.kind
        question = k.question.format(word=word)
        cue = k.cue.format(word=word)
        if self.protocol.chat:
            assert self.chat_format is not None
            text = self.chat_format(f"{k.intro}\n{body}\n{question}")
            return text + cue if self.protocol.question == "cue" else text
        return f"{k.intro}\n{body}\n{question}" + (f" {cue}" if self.protocol.question == "cue" else "")

    def _widest_needles(self) -> list[str]:
        key = int("9" * self.protocol.digits)
        word = max((f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS), key=len) if self.kind.words else None
        n = 1 + (self.protocol.distractors if self.protocol.kind == "multikey" else 0)
        return [self.kind.needle.format(key=key, word=word)] * n

    def _source(self, length: int) -> str:
        """The haystack's text from a paragraph the seed picks for this length, wrapping round, about twice what
        the length needs."""
        rng = random.Random(f"haystack-{self.seed}-{length}")
        start = rng.randrange(len(self.paragraphs))
        joiner = " " if self.protocol.haystack == REPEAT else "\n"
        pieces, size, i = [], 0, start
        while size < 8 * length + 400:  # about 4 characters a token: twice the length
            pieces.append(self.paragraphs[i % len(self.paragraphs)])
            size += len(pieces[-1]) + 1
            i += 1
        full = joiner.join(pieces)
        while self.count(full) < length and len(full) < 200 * (length + 1):  # a dense tokenizer: more text
            full += joiner + joiner.join(self.paragraphs)
        return full

    def filler(self, length: int) -> str:
        """The filler of every sample of this length: the most whole sentences that fit beside the widest needles
        and the question."""
        if length in self._fillers:
            return self._fillers[length]
        full = self._source(length)
        word = max((f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS), key=len) if self.kind.words else None
        needles = [(0.5, n) for n in self._widest_needles()]

        def cut(n_chars: int) -> str:
            text = full[:n_chars]
            if n_chars < len(full):  # end on a whole sentence (a whole word when none ends near)
                ends = [m.end() for m in _SENTENCE_END.finditer(text, max(0, n_chars - 300))]
                if ends:
                    text = text[: ends[-1]]
                elif not full[n_chars].isspace():
                    text = text[: text.rfind(" ") + 1] if " " in text else ""
            return text.strip()

        def fits(n_chars: int) -> bool:
            return self.count(self._prompt(_insert(cut(n_chars), needles, self.protocol.placement), word)) \
                <= self.budget(length)

        if not fits(0):
            fixed = self.count(self._prompt(_insert("", needles, self.protocol.placement), word))
            raise ValueError(f"a length of {length} tokens holds no haystack: the task, needle and question take "
                             f"{fixed} tokens and the answer {self.answer_tokens}")
        lo, hi = 0, len(full)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid - 1
        self._fillers[length] = cut(lo)
        return self._fillers[length]

    def sample(self, length: int, depth: Optional[float], index: int) -> Sample:
        """Sample `index` of cell (length, depth); depth None: a random depth per sample."""
        rng = random.Random(f"{self.seed}-{length}-{depth}-{index}")
        d = rng.random() if depth is None else depth
        lo, hi = 10 ** (self.protocol.digits - 1), 10**self.protocol.digits
        key = rng.randrange(lo, hi)
        words = [f"{a}-{n}" for a in _ADJECTIVES for n in _NOUNS]
        chosen = rng.sample(words, 1 + self.protocol.distractors) if self.kind.words else [None]
        word = chosen[0]
        needles = [(d, self.kind.needle.format(key=key, word=word))]
        if self.protocol.kind == "multikey":
            for other in chosen[1 : 1 + self.protocol.distractors]:
                other_key = rng.randrange(lo, hi)
                while other_key == key:
                    other_key = rng.randrange(lo, hi)
                needles.append((rng.random(), self.kind.needle.format(key=other_key, word=other)))
        filler = self.filler(length)
        text = self._prompt(_insert(filler, needles, self.protocol.placement), word)
        while self.count(text) > self.budget(length) and filler:  # a needle wider than the widest: a sentence less
            filler = filler[: max(filler.rfind(". ", 0, len(filler) - 2), 0)].strip()
            text = self._prompt(_insert(filler, needles, self.protocol.placement), word)
        return Sample(length, d, index, key, word, text)

    def budget(self, length: int) -> int:
        """The prompt's most tokens: a length holds the prompt and its answer."""
        return length - self.answer_tokens


def chat_formatter(vocab: Any) -> Optional[Callable[[str], str]]:
    """The model's chat template as one user message with the assistant's turn opened, or None without one."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = vocab.metadata.get("tokenizer.chat_template")
    if not template:
        return None
    text = vocab._model.token_get_text
    formatter = Jinja2ChatFormatter(template, eos_token=text(vocab.token_eos()), bos_token=text(vocab.token_bos()))
    return lambda content: formatter(messages=[{"role": "user", "content": content}]).prompt


# -- a grid, its records and its summary ---------------------------------------------------------------------------


@dataclass
class Record:
    method: str
    length: int
    depth: Optional[float]   # the cell's depth (None: random per sample)
    index: int
    seed: int
    key: int
    word: Optional[str]
    needle_depth: float      # where the needle is (the cell's depth, or the sample's random one)
    prompt_tokens: int
    prompt_read: int         # prompt tokens fed (the rest came from the cache's shared prefix)
    answer: str
    correct: bool
    seconds: float

    def cell(self) -> tuple[str, int, Optional[float], int]:
        return (self.method, self.length, self.depth, self.index)


def plan_order(lengths: Iterable[int], depths: Iterable[Optional[float]], samples: int) -> list[tuple[int, Optional[float], int]]:
    """(length, depth, index) in the order that shares most: lengths up, depths deepest first, the samples of a cell
    together (a prompt shares its prefix with the one before it up to the earlier needle)."""
    ordered_depths = sorted(depths, key=lambda d: -1.0 if d is None else d, reverse=True)
    return [(n, d, i) for n in sorted(set(lengths)) for d in ordered_depths for i in range(samples)]


def run_cells(llm: Any, sampler: Sampler, method: str, cells: Sequence[tuple[int, Optional[float], int]],
              tokenize: Callable[[str], list[int]], on_record: Callable[[Record], None]) -> None:
    """Each cell's sample through `llm` (a farctx.Llama set up for `method`), greedy; on_record after each."""
    inner = llm.progress
    read = [0]

    def progress(done: int, total: int) -> None:
        read[0] = max(read[0], total)
        if inner is not None:
            inner(done, total)

    llm.progress = progress
    try:
        for length, depth, index in cells:
            sample = sampler.sample(length, depth, index)
            tokens = tokenize(sample.text)
            read[0] = 0
            t0 = time.monotonic()
            out = llm.create_completion(tokens, max_tokens=sampler.answer_tokens, temperature=0.0)
            answer = out["choices"][0]["text"]
            on_record(Record(method, length, depth, index, sampler.seed, sample.key, sample.word, round(sample.depth, 4),
                             len(tokens), read[0], answer, parse_answer(answer) == sample.key,
                             round(time.monotonic() - t0, 2)))
    finally:
        llm.progress = inner


@dataclass
class Cell:
    method: str
    length: int
    depth: Optional[float]
    correct: int
    n: int

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else float("nan")


def summarize(records: Sequence[Record]) -> list[Cell]:
    cells: dict[tuple[str, int, Optional[float]], Cell] = {}
    for r in records:
        c = cells.setdefault((r.method, r.length, r.depth), Cell(r.method, r.length, r.depth, 0, 0))
        c.correct += r.correct
        c.n += 1
    return list(cells.values())


def length_accuracy(records: Sequence[Record], method: str) -> dict[int, tuple[int, int]]:
    """length -> (correct, samples) over every depth."""
    out: dict[int, tuple[int, int]] = {}
    for r in records:
        if r.method == method:
            c, n = out.get(r.length, (0, 0))
            out[r.length] = (c + r.correct, n + 1)
    return dict(sorted(out.items()))


@dataclass
class EffectiveLength:
    length: Optional[int]    # None: not even the shortest length reaches the threshold
    threshold: Optional[float]  # the accuracy a length must reach (None: no length to take a relative one from)
    reference: Optional[int]  # the length whose score set a relative threshold


def effective_length(records: Sequence[Record], method: str, n_ctx_train: int, threshold: float,
                     absolute: bool = False) -> EffectiveLength:
    """The longest length of the grid such that it and every shorter one reach the threshold: `threshold` itself
    when absolute, else that fraction of the method's own accuracy at the longest length inside n_ctx_train."""
    by_length = {n: c / k for n, (c, k) in length_accuracy(records, method).items()}
    reference = None
    if absolute:
        bar = threshold
    else:
        inside = [n for n in by_length if n <= n_ctx_train]
        if not inside:
            return EffectiveLength(None, None, None)
        reference = max(inside)
        bar = threshold * by_length[reference]
    best = None
    for n, acc in by_length.items():
        if acc + 1e-12 < bar or acc == 0.0:
            break
        best = n
    return EffectiveLength(best, round(bar, 4), reference)


# -- the JSON a grid lives in -----------------------------------------------------------------------------------------


@dataclass
class GridFile:
    """The grid's JSON: header (model, protocol, each method's parameters per length) and every sample; written after each sample, so
    that a run stopped anywhere resumes where it stopped."""

    path: Optional[Path]
    header: dict[str, Any]
    records: list[Record] = field(default_factory=list)

    @classmethod
    def open(cls, path: Optional[Path], header: dict[str, Any]) -> "GridFile":
        grid = cls(path, header)
        if path is None or not path.exists() or path.stat().st_size == 0:
            return grid
        old = json.loads(path.read_text())
        for name in ("model", "protocol", "seed"):
            if old.get(name) != header.get(name):
                raise ValueError(f"{path} holds a grid of another {name} ({old.get(name)!r}, this run "
                                 f"{header.get(name)!r}): give another --json, or remove it to start again")
        grid.header = dict(old, **{k: v for k, v in header.items() if k != "methods"})
        for name in ("cells", "samples"):
            grid.header.pop(name, None)
        grid.records = [Record(**r) for r in old.get("samples", [])]
        grid.header["methods"] = {}
        for method, params in old.get("methods", {}).items():
            if isinstance(params, str):  # one description for the method: it holds for each length it has samples of
                params = {str(r.length): params for r in grid.records if r.method == method}
            grid.header["methods"][method] = dict(params)
        return grid

    def set_method(self, method: str, length: int, params: str) -> None:
        """Record the parameters a method ran with at a length (they can depend on it: selfextend's group); a grid
        holding that length under other parameters is refused."""
        known = self.header.setdefault("methods", {}).setdefault(method, {})
        if known.get(str(length), params) != params:
            raise ValueError(f"{self.path} holds {method} at {length} tokens with other parameters "
                             f"({known[str(length)]}; this run: {params}): give another --json, or remove it to "
                             f"start again")
        known[str(length)] = params

    def done(self) -> set[tuple[str, int, Optional[float], int]]:
        return {r.cell() for r in self.records}

    def add(self, record: Record, extra: Optional[dict[str, Any]] = None) -> None:
        self.records.append(record)
        self.write(extra)

    def payload(self, extra: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        cells = [dict(asdict(c), accuracy=round(c.accuracy, 4)) for c in summarize(self.records)]
        return dict(self.header, **(extra or {}), cells=cells, samples=[asdict(r) for r in self.records])

    def write(self, extra: Optional[dict[str, Any]] = None) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.payload(extra), indent=1) + "\n")
        os.replace(tmp, self.path)
