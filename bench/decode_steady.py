"""Decode speed right after a prompt and in the steady state, with the cells each decoded token reads.

After a long prompt a fixed-cache method's free room (n_ubatch cells, plus padding to 256) is one gap in
the middle of the cache, so every decoded token reads the whole cache; as tokens are evicted and placed
the gap moves, and once it reaches the end each new token reuses the cell just evicted and the view is
the live cells only. This times the first 128 decoded tokens and the last 256 of N, and lists the sizes
of the K view that the decode graphs read (read through llama.cpp's evaluation callback in a second, untimed run:
farctx.eval.tensor_probe.FlashAttnLayouts).

    .venv/bin/python bench/decode_steady.py --methods window,lminf --length 8192 -n 3300 --reps 2
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def one(model: str, method: str, length: int, n_gen: int) -> str:
    """Timed decoding, then the same run again with the flash-attention nodes recorded (a callback per graph node
    would slow the timed one)."""
    from farctx.eval.tensor_probe import FlashAttnLayouts, eval_callback_installed

    first, last = decode(model, method, length, n_gen)
    probe = FlashAttnLayouts()
    with eval_callback_installed(probe):
        decode(model, method, length, n_gen)
    probe.check()
    views = [node.ops["k"].ne[1] for node in probe.nodes if node.ops["q"].ne[1] == 1]  # one query: a decode graph
    return f"{method} {length}: first 128 {first:.0f} tok/s, last 256 {last:.0f} tok/s, decode views {list(dict.fromkeys(views))}"


def decode(model: str, method: str, length: int, n_gen: int) -> tuple[float, float]:
    from farctx.bench.worker import corpus, open_farctx

    llm = open_farctx(model, method, length, n_gen, {"n_threads": 2, "flash_attn": True, "verbose": False})
    tokens = corpus(lambda b: llm.tokenize(b, add_bos=False), length + n_gen)
    llm.eval(tokens[:length])

    def timed(part: list[int]) -> float:
        start = time.perf_counter()
        for t in part:
            llm.eval([t])
        return len(part) / (time.perf_counter() - start)

    first = timed(tokens[length : length + 128])
    for t in tokens[length + 128 : length + n_gen - 256]:
        llm.eval([t])
    last = timed(tokens[length + n_gen - 256 : length + n_gen])
    llm.close()
    return first, last


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="build/bench/attnbound-2k.gguf")
    ap.add_argument("--methods", default="window,lminf")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("-n", type=int, default=3300)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(one(args.model, args.one, args.length, args.n))
        return
    for _ in range(args.reps):
        for method in args.methods.split(","):
            # a process per run: each starts from a fresh allocator
            out = subprocess.run([sys.executable, __file__, "--model", args.model, "--one", method, "--length",
                                  str(args.length), "-n", str(args.n)], check=True, capture_output=True, text=True)
            print(out.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
