"""Perplexity against length: one long document, the tokens just before each length scored.

Protocol (printed with the results): for each length L, the `window` tokens at positions
[L - window, L) are scored, each predicted from everything before it that the method lets it see.
Methods whose attention depends only on the pair of positions (every method but mesa) read the
document once, front to back, and score each window on the way. Mesa's chunking depends on the
prompt, so for each L it starts a new stream: the text before the window is the prompt (chunked
prefill) and the window is scored as its continuation (Stair positions, as during generation).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np

PROTOCOL = (
    "for each length L: the {window} tokens at positions [L-{window}, L) are scored, each predicted from "
    "the tokens before it under the method; one pass over the document per method (mesa: a new stream "
    "per L, the text before the window as the prompt and the window as its continuation)"
)


@dataclass
class PplResult:
    method: str
    length: int
    ppl: float
    tokens_scored: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def nll(logits: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """Negative log-likelihood of each target under the matching row of logits (float64)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(x).sum(axis=1))
    return log_z - x[np.arange(len(targets)), np.asarray(targets)]


def check_lengths(lengths: Sequence[int], window: int, n_tokens: int) -> list[int]:
    from ..errors import FarctxError

    out = sorted(set(int(x) for x in lengths))
    if not out:
        raise FarctxError("no lengths given")
    if out[0] <= window:
        raise FarctxError(f"every length must be larger than the scored window ({window}): got {out[0]}")
    if out[-1] > n_tokens:
        raise FarctxError(f"the text has {n_tokens} tokens, fewer than the largest length {out[-1]}")
    return out


def perplexity_of_method(llm: Any, tokens: Sequence[int], lengths: Sequence[int], window: int,
                         on_result: Callable[[PplResult], None] | None = None) -> list[PplResult]:
    """Score the windows before each length with a farctx.Llama already set up for its method."""
    results: list[PplResult] = []
    method = llm.method_params.method
    whole_prompt = llm.method_params.info.whole_prompt  # mesa plans its chunks from the prompt's one feed
    llm.reset()
    for length in lengths:
        start = length - window  # first scored position
        if whole_prompt:
            llm.reset()
            llm.eval(tokens[: start - 1])  # the prompt: chunked prefill
        else:
            llm.eval(tokens[llm.n_tokens : start - 1])
        logits = llm.score(tokens[start - 1 : length - 1])
        losses = nll(logits, tokens[start:length])
        result = PplResult(method, length, float(math.exp(losses.mean())), int(len(losses)))
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def pool(per_doc: Sequence[Sequence[PplResult]]) -> list[PplResult]:
    """One result per length from several streams' results: the mean NLL over all their scored tokens."""
    pooled = []
    for rows in zip(*per_doc):
        n = sum(r.tokens_scored for r in rows)
        mean_nll = sum(math.log(r.ppl) * r.tokens_scored for r in rows) / n
        pooled.append(PplResult(rows[0].method, rows[0].length, float(math.exp(mean_nll)), n))
    return pooled
