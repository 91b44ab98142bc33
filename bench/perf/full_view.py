"""Decode when no free cell is in view: streaming's default cache (4 sinks + 2044 = 2048 live cells, 8 blocks of
256) right after a 2048-token prompt on the attention-bound model (n_ctx_train 2048). Every decoded token
evicts one key and takes the cell it freed, so the view stays exactly full and patch 0012's free cells are never
at hand. Before (FARCTX_SEG2_LSE=0): patch 0007's one flash-attention call over a concatenated copy of every
cell, per layer and token. After: two flash-attention calls over views of the cache, merged by log-sum-exp in
the kernel (patches 0015/0016). `window` and `lminf` (free cells in its view) run in both for reference.

Each measurement is a process of its own: the prompt, one decoded token (not timed), then --blocks blocks of
--block tokens; it reports the fastest block and the median block (these shared cores slow whole stretches of a
run down: the fastest block is the least disturbed). Variants and methods interleaved in every repetition;
ratios to window are paired per repetition, then the median.

    .venv/bin/python bench/perf/full_view.py --reps 4 > bench/perf/full-view/full_view.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKER = r"""
import json, statistics, sys, time
from farctx.bench.worker import corpus, open_farctx
model, method, length, n_blocks, block = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
n = n_blocks*block
llm = open_farctx(model, method, length, n + 1, {"n_threads": 2, "flash_attn": True, "verbose": False})
tokens = corpus(lambda b: llm.tokenize(b, add_bos=False), length + n + 1)
llm.eval(tokens[:length])
llm.eval([tokens[length]])
speeds = []
i = length + 1
for _ in range(n_blocks):
    start = time.perf_counter()
    for t in tokens[i:i + block]:
        llm.eval([t])
    speeds.append(block / (time.perf_counter() - start))
    i += block
print(json.dumps([max(speeds), statistics.median(speeds)]))
"""

VARIANTS = {"before (FARCTX_SEG2_LSE=0)": {"FARCTX_SEG2_LSE": "0"}, "after": {}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="build/bench/attnbound-2k.gguf")
    ap.add_argument("--methods", default="window,lminf,streaming")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--reps", type=int, default=4)
    args = ap.parse_args()
    model = str(ROOT / args.model) if not os.path.isabs(args.model) else args.model
    if not os.path.exists(model):
        subprocess.run([sys.executable, str(ROOT / "bench/attnbound_model.py"), model], check=True, capture_output=True)
    methods = args.methods.split(",")
    res: dict[tuple[str, str], list[list[float]]] = {}
    for rep in range(args.reps):
        for name, env_add in VARIANTS.items():
            for method in methods:
                env = {k: v for k, v in os.environ.items() if k != "FARCTX_SEG2_LSE"}
                env.update(env_add)
                out = subprocess.run([sys.executable, "-c", WORKER, model, method, str(args.length), str(args.blocks),
                                      str(args.block)], capture_output=True, text=True, cwd=ROOT, env=env, check=True)
                res.setdefault((name, method), []).append(json.loads(out.stdout))
                print(f"rep {rep + 1}/{args.reps} {name} {method}: {res[(name, method)][-1]}", file=sys.stderr, flush=True)
    print(f"decode after a {args.length}-token prompt, {args.blocks} blocks of {args.block} tokens per process, "
          f"{args.reps} repetitions, -t 2 -fa on")
    print("| variant | method | fastest block tok/s (median) | / window, paired | median block tok/s | / window, paired |")
    print("|---|---|---:|---:|---:|---:|")
    for name in VARIANTS:
        for method in methods:
            v, w = res[(name, method)], res[(name, "window")]
            cells = []
            for i in (0, 1):
                cells.append(f"{statistics.median(x[i] for x in v):.0f}")
                cells.append(f"{statistics.median(a[i] / b[i] for a, b in zip(v, w)):.3f}")
            print(f"| {name} | {method} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
