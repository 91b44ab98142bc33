"""Passkey retrieval (the LM-Infinite / Mesa protocol): filler sentences, a random key in
[1, 10^7) at a given or random depth, a question at the end; a sample is correct when the first
integer of the greedy answer equals the key."""

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


def parse_answer(text: str) -> Optional[int]:
    """The first integer in the answer, or None."""
    match = re.search(r"\d+", text)
    return int(match.group()) if match else None


def passkey_of_method(llm: Any, lengths: Sequence[int], depths: Sequence[Optional[float]], samples: int, seed: int,
                      on_result: Callable[[PasskeyResult], None] | None = None) -> list[PasskeyResult]:
    """Accuracy for each (length, depth) with a farctx.Llama already set up for its method."""

    def count(text: str) -> int:
        return len(llm.tokenize(text.encode("utf-8")))

    results = []
    for length in lengths:
        for depth in depths:
            rng = random.Random(f"{seed}-{length}-{depth}")  # the same samples for every method
            correct = 0
            for _ in range(samples):
                sample = make_sample(length, depth, rng, count)
                budget = min(count(f" {sample.key}") + 2, ANSWER_TOKENS)  # digit-by-digit vocabularies too
                out = llm.create_completion(sample.text, max_tokens=budget, temperature=0.0)
                correct += parse_answer(out["choices"][0]["text"]) == sample.key
            result = PasskeyResult(llm.method_params.method, length, depth, samples, correct / samples)
            results.append(result)
            if on_result is not None:
                on_result(result)
    return results
