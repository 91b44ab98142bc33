"""Writes the shortest prefix of whole words of Jane Austen's Emma that is at least N tokens long for a
model's tokenizer (the long prompts of bench/long_prompt.sh and bench/past_context.sh).

    .venv/bin/python bench/austen_prompt.py OUT.txt N_TOKENS [MODEL]   (MODEL: a GGUF, a name such as
                                                                      gemma3-270m, or "default")
"""

from __future__ import annotations

import sys

import farctx
from farctx.eval.data import austen


def prefix_of(words: list[str], n_tokens: int, llm: farctx.Llama) -> str:
    lo, hi = 0, len(words)
    while lo < hi:  # binary search on the number of words
        mid = (lo + hi) // 2
        if len(llm.tokenize(" ".join(words[:mid]).encode())) < n_tokens:
            lo = mid + 1
        else:
            hi = mid
    return " ".join(words[:lo])


def main(out: str, n_tokens: int, model: str = "default") -> None:
    llm = farctx.Llama(None if model == "default" else model, n_ctx=256)
    with open(out, "w") as fh:
        fh.write(prefix_of(austen("emma").split(" "), n_tokens, llm))
    llm.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), *sys.argv[3:4])
