"""Passkey retrieval (the LM-Infinite / Mesa protocol): filler sentences, a random key in
[1, 10^7) at a given or random depth, a question at the end; a sample is correct when the first
integer of the greedy answer equals the key.

With a haystack (needle-in-a-haystack practice) the filler is real prose instead of the repeated
sentences: the document's paragraphs in order, from a paragraph the sample's seed picks (wrapping
round at the end), cut at the end of a sentence to fit the length, the needle put at the sentence boundary
nearest its depth (measured in characters of the filler)."""

from __future__ import annotations

import random
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Optional, Sequence

PREFIX = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
          "I will quiz you about the important information there.\n")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "What is the pass key? The pass key is"
ANSWER_TOKENS = 12  # the most answer tokens generated: the key's tokens + 2, at most this


@dataclass
class PasskeySample:
    text: str
    key: int
    depth: float


@dataclass
class PasskeyResult:
    method: str
    length: int
    depth: Optional[float]
    samples: int
    accuracy: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_sample(n_tokens: int, depth: Optional[float], rng: random.Random,
                count_tokens: Callable[[str], int]) -> PasskeySample:
    """A prompt of about n_tokens tokens (never more) with the key at `depth` (0 start .. 1 end; None: random)."""
    key = rng.randrange(1, 10**7)
    d = rng.random() if depth is None else depth
    needle = NEEDLE.format(key=key)
    fixed = count_tokens(PREFIX + needle + QUESTION)
    per = max(count_tokens(FILLER * 8) / 8, 1)
    n_fill = max(int((n_tokens - fixed) / per), 0)
    while n_fill > 0:
        before = int(round(n_fill * d))
        text = PREFIX + FILLER * before + needle + FILLER * (n_fill - before) + QUESTION
        if count_tokens(text) <= n_tokens:
            return PasskeySample(text, key, d)
        n_fill -= 1
    return PasskeySample(PREFIX + needle + QUESTION, key, d)


def haystack_paragraphs(text: str) -> list[str]:
    """The document's paragraphs (blank-line separated), each on one line."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return [p for p in paragraphs if p]


_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'\u201d\u2019_)]*\s+")


def _insert_at_depth(filler: str, needle: str, depth: float) -> tuple[str, str]:
    """filler split at the sentence boundary nearest depth * len(filler) (a space when there is none)."""
    target = depth * len(filler)
    cuts = [m.end() for m in _SENTENCE_END.finditer(filler)] + [0, len(filler)]
    best = min(cuts, key=lambda c: abs(c - target))
    if abs(best - target) > 400:  # no sentence end nearby: the nearest space
        spaces = [m.end() for m in re.finditer(r"\s+", filler)] or [0]
        best = min(spaces + [0, len(filler)], key=lambda c: abs(c - target))
    before, after = filler[:best].rstrip(), filler[best:].lstrip()
    return (before + " " if before else ""), (" " + after if after else "")


def make_haystack_sample(n_tokens: int, depth: Optional[float], rng: random.Random,
                         count_tokens: Callable[[str], int], paragraphs: Sequence[str]) -> PasskeySample:
    """A prompt of at most n_tokens tokens (as close to it as a word allows): the document's paragraphs
    as filler, the needle at `depth`."""
    if not paragraphs:
        raise ValueError("the haystack has no text")
    key = rng.randrange(1, 10**7)
    d = rng.random() if depth is None else depth
    needle = NEEDLE.format(key=key).strip()
    start = rng.randrange(len(paragraphs))
    budget = max(n_tokens - count_tokens(PREFIX + needle + " " + QUESTION), 0)
    # paragraphs in order from `start`, wrapping round, until about twice the budget in characters
    chars_per_token = 3.0
    pieces: list[str] = []
    size, i = 0, start
    while size < 2 * budget * chars_per_token + 200:
        pieces.append(paragraphs[i % len(paragraphs)])
        size += len(pieces[-1]) + 1
        i += 1
    full = "\n".join(pieces)
    while count_tokens(full) < budget and len(full) < 50 * (budget + 1) * chars_per_token:
        full += "\n" + "\n".join(paragraphs)  # a dense tokenizer: more text

    def text_for(n_chars: int) -> str:
        filler = full[:n_chars]
        if n_chars < len(full):  # end on a whole sentence (a whole word when none ends near)
            ends = [m.end() for m in _SENTENCE_END.finditer(filler, max(0, n_chars - 300))]
            if ends:
                filler = filler[: ends[-1]]
            elif not full[n_chars].isspace():
                filler = filler[: filler.rfind(" ") + 1] if " " in filler else ""
        before, after = _insert_at_depth(filler.strip(), needle, d)
        return PREFIX + before + needle + after + "\n" + QUESTION

    lo, hi = 0, len(full)  # the most characters whose prompt fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(text_for(mid)) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return PasskeySample(text_for(lo), key, d)


def parse_answer(text: str) -> Optional[int]:
    """The first integer in the answer, or None."""
    match = re.search(r"\d+", text)
    return int(match.group()) if match else None


def passkey_of_method(llm: Any, lengths: Sequence[int], depths: Sequence[Optional[float]], samples: int, seed: int,
                      on_result: Callable[[PasskeyResult], None] | None = None,
                      haystack: Optional[Sequence[str]] = None) -> list[PasskeyResult]:
    """Accuracy for each (length, depth) with a farctx.Llama already set up for its method (filler: the
    repeated sentences, or the paragraphs of `haystack`)."""

    def count(text: str) -> int:
        return len(llm.tokenize(text.encode("utf-8")))

    results = []
    for length in lengths:
        for depth in depths:
            rng = random.Random(f"{seed}-{length}-{depth}")  # the same samples for every method
            correct = 0
            for _ in range(samples):
                if haystack is None:
                    sample = make_sample(length, depth, rng, count)
                else:
                    sample = make_haystack_sample(length, depth, rng, count, haystack)
                budget = min(count(f" {sample.key}") + 2, ANSWER_TOKENS)  # digit-by-digit vocabularies too
                out = llm.create_completion(sample.text, max_tokens=budget, temperature=0.0)
                correct += parse_answer(out["choices"][0]["text"]) == sample.key
            result = PasskeyResult(llm.method_params.method, length, depth, samples, correct / samples)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results
