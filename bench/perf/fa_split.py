"""Decode right after a long prompt, with the CPU's split-KV flash attention splitting the cells in view by
unmasked count (patch 0017) or evenly by index (FARCTX_FA_SPLIT_EVEN=1, stock's ranges), against `window`.

A fixed-cache method's view after a long prompt holds its free cells (evicted keys, the room for a ubatch) in
one stretch; with the even split one thread gets most of the live cells. Each measurement is a process of its
own: the attention-bound model, a prompt of --lengths tokens, one decoded token (not timed: the first graph of
the decode), then 128 timed. Variants, methods and lengths interleaved in every repetition; the ratios are
paired per repetition (method / window of the same variant and repetition), then the median.

    .venv/bin/python bench/perf/fa_split.py --reps 5 --json bench/perf/fa-split/fa_split.json \
        > bench/perf/fa-split/fa_split.md
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
N_TIMED = 128

WORKER = r"""
import json, sys, time
from farctx.bench.worker import corpus, open_farctx
model, method, length, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
llm = open_farctx(model, method, length, n + 1, {"n_threads": 2, "flash_attn": True, "verbose": False})
tokens = corpus(lambda b: llm.tokenize(b, add_bos=False), length + n + 1)
llm.eval(tokens[:length])
llm.eval([tokens[length]])
start = time.perf_counter()
for t in tokens[length + 1 : length + n + 1]:
    llm.eval([t])
print(json.dumps(n / (time.perf_counter() - start)))
"""


def decode_tps(model: str, method: str, length: int, even: bool) -> float:
    env = dict(os.environ)
    env.pop("FARCTX_FA_SPLIT_EVEN", None)
    if even:
        env["FARCTX_FA_SPLIT_EVEN"] = "1"
    out = subprocess.run([sys.executable, "-c", WORKER, model, method, str(length), str(N_TIMED)],
                         capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    return float(json.loads(out.stdout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "build" / "bench" / "attnbound-2k.gguf"))
    ap.add_argument("--methods", default="lminf,streaming")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not Path(args.model).exists():
        subprocess.run([sys.executable, str(ROOT / "bench" / "attnbound_model.py"), args.model], check=True,
                       stdout=subprocess.DEVNULL)
    methods = ["window", *args.methods.split(",")]
    lengths = [int(x) for x in args.lengths.split(",")]
    tps: dict[str, list[float]] = {}
    for rep in range(args.reps):
        for length in lengths:
            for variant in ("even", "balanced"):
                for method in methods:
                    tps.setdefault(f"{variant} {method} {length}", []).append(
                        decode_tps(args.model, method, length, variant == "even"))
        print(f"fa_split: rep {rep + 1}/{args.reps} done", file=sys.stderr)
    print(f"decode tok/s over {N_TIMED} tokens after the prompt (attention-bound model, -t 2, -fa on), medians of "
          f"{args.reps}; ratio: paired per repetition against window of the same split, then the median\n")
    print("| length | method | split | decode tok/s | / window (paired) | every pair |")
    print("|---:|---|---|---:|---:|---|")
    rows = []
    for length in lengths:
        for method in methods:
            for variant in ("even", "balanced"):
                own, win = tps[f"{variant} {method} {length}"], tps[f"{variant} window {length}"]
                pairs = [a / b for a, b in zip(own, win)]
                rows.append(dict(length=length, method=method, split=variant, tps=own, ratios=pairs))
                print(f"| {length} | {method} | {variant} | {statistics.median(own):.0f} | "
                      f"{statistics.median(pairs):.2f} | {' '.join(f'{r:.2f}' for r in pairs)} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
