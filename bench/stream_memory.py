"""Constant memory of a fixed-size-cache method over a long stream.

Feeds N tokens (Jane Austen's novels, repeated as needed) through farctx with --method (lminf by
default) and prints, every 10% of the way, the KV cells in use (llama.cpp's own count), the
KV bytes and the process RSS. Both must stay flat whatever N is.

    .venv/bin/python bench/stream_memory.py --tiny -n 1000000        # the test-sized random model
    .venv/bin/python bench/stream_memory.py -n 100000                 # the bundled default model
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def corpus_tokens(llm, n: int) -> list[int]:
    from farctx.eval.data import NOVELS, austen

    tokens: list[int] = []
    while len(tokens) < n:
        for novel in NOVELS:
            tokens += llm.tokenize(austen(novel).encode(), add_bos=False)
            if len(tokens) >= n:
                break
    return tokens[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--tiny", action="store_true", help="the random-weight test model (n_ctx_train 32)")
    ap.add_argument("-n", "--tokens", type=int, default=100_000)
    ap.add_argument("--method", default="lminf")
    ap.add_argument("-ub", "--ubatch", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="write the samples here")
    args = ap.parse_args()

    import farctx

    model = args.model
    if args.tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny_gguf import write_tiny_gguf

        model = str(write_tiny_gguf(Path(tempfile.mkdtemp()) / "tiny.gguf", farctx.default_model_path()))
    llm = farctx.Llama(model, method=args.method, n_batch=args.ubatch, n_ubatch=args.ubatch,
                       n_threads=args.threads, n_threads_batch=args.threads)
    tokens = corpus_tokens(llm, args.tokens)
    print(f"model {Path(llm.model_path).name}, method {args.method}, cache {llm.n_ctx()} cells, "
          f"params {llm.method_params.as_dict()}", flush=True)
    print(f"{'tokens':>10} {'done':>5} {'cells':>6} {'KV MiB':>7} {'RSS MiB':>8} {'tok/s':>8}", flush=True)
    samples = []
    step = max(len(tokens) // 10, 1)
    start = time.monotonic()
    for k in range(0, len(tokens), step):
        llm.eval(tokens[k : k + step])
        s = llm.stats()
        sample = {"tokens": s["n_past"], "cells": s["n_cells_used"], "kv_bytes": s["kv_bytes"], "rss_bytes": rss_bytes(),
                  "seconds": round(time.monotonic() - start, 2)}
        samples.append(sample)
        print(f"{sample['tokens']:>10} {100 * sample['tokens'] / len(tokens):>4.0f}% {sample['cells']:>6} "
              f"{sample['kv_bytes'] / 2**20:>7.1f} {sample['rss_bytes'] / 2**20:>8.1f} "
              f"{sample['tokens'] / max(sample['seconds'], 1e-9):>8.0f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": llm.model_path, "method": args.method,
                                               "n_ctx": llm.n_ctx(), "samples": samples}, indent=1))


if __name__ == "__main__":
    main()
