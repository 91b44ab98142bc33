"""One method's prefill, then decoding, on a model, timed: the workload to run under a profiler (`perf record -F 499
python bench/attn_profile.py dca 16384 1500`, then `perf report --sort symbol`), and the quick A/B of two builds.
Ratios to publish come from `farctx bench`, which runs stock llama.cpp in the same run."""

from __future__ import annotations

import argparse
import time

import numpy as np

import farctx


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("method")
    ap.add_argument("n_prompt", type=int)
    ap.add_argument("n_gen", type=int, nargs="?", default=0)
    ap.add_argument("-m", "--model", default="build/bench/attnbound-2k.gguf")
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    llm = farctx.Llama(args.model, method=args.method, n_ctx=args.n_prompt + args.n_gen + 64, n_batch=512,
                       n_ubatch=512, flash_attn=True, n_threads=args.threads, n_threads_batch=args.threads)
    tokens = np.random.default_rng(0).integers(10, min(4000, llm.n_vocab()), args.n_prompt + args.n_gen).tolist()
    t = time.time()
    llm.eval(tokens[:args.n_prompt])
    print(f"{args.method} prefill {args.n_prompt / (time.time() - t):.1f} tok/s", flush=True)
    if args.n_gen:
        t = time.time()
        first = 0.0
        for token in tokens[args.n_prompt:]:
            llm.eval([token])
            first = first or time.time() - t  # the first token after the prompt: the cache's own work lands there
        print(f"{args.method} decode {args.n_gen / (time.time() - t):.1f} tok/s (the first token {first * 1000:.1f} ms)",
              flush=True)
    llm.close()


if __name__ == "__main__":
    main()
