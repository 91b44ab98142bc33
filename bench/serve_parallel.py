"""Aggregate decode speed of N concurrent streams: farctx's SequenceBatch (what `farctx serve --parallel N`
steps) against stock llama.cpp's own batched decoding of the same model, in the same run.

Each measurement runs in a process of its own (stock and patched llama.cpp never share one):

- ours: `farctx.batch.SequenceBatch` with N streams under a method (vanilla, lminf): every stream reads
  the same prompt, then `--n-gen` steps each feed every stream its greedy token, one `step` per token;
- stock: llama-cpp-python's low-level API on the unpatched library (build/cmake-stock, LLAMA_CPP_LIB_PATH):
  one llama_context with n_seq_max = N (a KV stream per sequence, kv_unified off), each prompt decoded,
  then one llama_decode per step with N tokens (one per sequence), greedy from each row. (Not
  llama-batched-bench: this times the same loop, token handling included, with no C++ tool to build.)

Reported: decode tokens/s summed over the streams (N x n_gen / decode seconds), medians of --reps
repetitions (every configuration once per repetition), against 1 stream of the same engine (x1) and ours
/ stock; then lminf with 4 streams, each 4 x past the (assumed) trained context, against 4 lminf streams
inside it, with the KV cells each stream holds before and after its generation (constant).

    .venv/bin/python bench/serve_parallel.py                     # 1, 2, 4, 8 streams; JSON in bench/results/serve/
    .venv/bin/python bench/serve_parallel.py --streams 1,4 --n-gen 16 --n-ctx-train 256
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]


# -- workers (one measurement per process) --------------------------------------------------------------


def worker_ours(args: argparse.Namespace, prompt: list[int]) -> dict[str, Any]:
    import numpy as np

    from farctx.batch import SequenceBatch
    from farctx.context import LoadedModel, RuntimeOptions
    from farctx.methods import MethodParams

    params = {"n_ctx_train": args.n_ctx_train} if args.n_ctx_train else {}
    method = MethodParams.from_kwargs(args.method, params)
    options = RuntimeOptions(n_batch=args.n_batch, n_ubatch=args.n_ubatch, n_threads=args.threads,
                             n_threads_batch=args.threads, flash_attn=args.fa == "on")
    model = LoadedModel(args.model, options)
    # each stream's cells: the context plan's for the prompt and the generation (fixed-cache methods: their own)
    plan = model.plan(method, n_seq=args.n, n_prompt=len(prompt), n_predict=args.n_gen + 1)
    batch = SequenceBatch.planned(model, plan, args.n)
    n_ctx_seq = batch.n_ctx_seq
    for i in range(args.n):
        batch.open(i, args.method, **params)
    start = time.perf_counter()
    rows = batch.step({i: prompt for i in range(args.n)})
    prefill = time.perf_counter() - start
    cells_before = [batch.stats(i)["n_cells_used"] for i in range(args.n)]
    start = time.perf_counter()
    for _ in range(args.n_gen):
        rows = batch.step({i: [int(np.argmax(rows[i]))] for i in range(args.n)})
    decode = time.perf_counter() - start
    stats = [batch.stats(i) for i in range(args.n)]
    batch.close()
    return {"prefill_s": prefill, "decode_s": decode, "decode_tps": args.n * args.n_gen / decode,
            "n_ctx_seq": n_ctx_seq, "cells_before": cells_before, "cells_after": [s["n_cells_used"] for s in stats],
            "kv_bytes_per_stream": stats[0]["kv_bytes"], "n_past": stats[0]["n_past"]}


def worker_stock(args: argparse.Namespace, prompt: list[int]) -> dict[str, Any]:
    import llama_cpp
    import numpy as np

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), mparams)
    cparams = llama_cpp.llama_context_default_params()
    per_seq = -(-(len(prompt) + args.n_gen + 1) // 256) * 256
    cparams.n_ctx = per_seq * args.n
    cparams.n_batch = max(args.n_batch, args.n)
    cparams.n_ubatch = args.n_ubatch
    cparams.n_seq_max = args.n
    cparams.kv_unified = False
    cparams.n_threads = cparams.n_threads_batch = args.threads
    cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if args.fa == "on"
                               else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    batch = llama_cpp.llama_batch_init(max(len(prompt), args.n), 0, args.n)

    def fill(items: list[tuple[int, int, int]]) -> None:  # (token, pos, seq), logits for every item
        batch.n_tokens = len(items)
        for k, (tok, pos, seq) in enumerate(items):
            batch.token[k], batch.pos[k], batch.n_seq_id[k] = tok, pos, 1
            batch.seq_id[k][0] = seq
            batch.logits[k] = 1

    def row(k: int) -> np.ndarray:
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, k), shape=(n_vocab,))

    start = time.perf_counter()
    last: list[int] = []
    for seq in range(args.n):
        fill([(t, p, seq) for p, t in enumerate(prompt)])
        for k in range(len(prompt) - 1):
            batch.logits[k] = 0
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed (prefill)")
        last.append(int(np.argmax(row(-1))))
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(args.n_gen):
        fill([(last[seq], len(prompt) + step, seq) for seq in range(args.n)])
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed (decode)")
        last = [int(np.argmax(row(seq))) for seq in range(args.n)]
    decode = time.perf_counter() - start
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return {"prefill_s": prefill, "decode_s": decode, "decode_tps": args.n * args.n_gen / decode,
            "n_ctx": per_seq * args.n}


# -- the run ------------------------------------------------------------------------------------------------


def measure(kind: str, model: str, n: int, prompt: list[int], args: argparse.Namespace,
            method: str = "vanilla", n_ctx_train: int = 0) -> Optional[dict[str, Any]]:
    env = dict(os.environ)
    cmd = [sys.executable, __file__, "--worker", kind, "--model", model, "--n", str(n), "--method", method,
           "--n-gen", str(args.n_gen), "-b", str(args.n_batch), "-ub", str(args.n_ubatch),
           "--n-ctx-train", str(n_ctx_train), "--threads", str(args.threads), "-fa", args.fa]
    if kind == "stock":
        from farctx.bench.harness import stock_lib_dir

        env["LLAMA_CPP_LIB_PATH"] = str(stock_lib_dir())
    result = subprocess.run(cmd, input=json.dumps(prompt), capture_output=True, text=True, env=env)
    if result.returncode != 0:
        print(f"{kind} {method} x{n}: failed\n{result.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])


def prompt_tokens(model: str, n: int) -> list[int]:
    import farctx  # noqa: F401  (first: llama_cpp on the patched library)
    import llama_cpp

    vocab = llama_cpp.Llama(model, vocab_only=True, verbose=False)
    text = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
            "must be in want of a wife. ") * (n // 10 + 1)
    return vocab.tokenize(text.encode(), add_bos=True)[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=["ours", "stock"], help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--method", default="vanilla", help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None, help="GGUF (default: the bundled model)")
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--methods", default="vanilla,lminf")
    ap.add_argument("--prompt", type=int, default=64, help="prompt tokens per stream")
    ap.add_argument("--n-gen", type=int, default=32, help="decode steps")
    ap.add_argument("-b", "--batch-size", dest="n_batch", type=int, default=2048)
    ap.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="CPU threads, the same for ours and stock (default: half the cores, llama_cpp's)")
    ap.add_argument("--n-ctx-train", type=int, default=512,
                    help="the trained context the past-context lminf run assumes (0: the model's)")
    ap.add_argument("-fa", "--flash-attn", dest="fa", choices=["on", "off"], default="on",
                    help="flash attention, the same for ours and stock")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (stock and ours interleaved); medians")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve" / "parallel-decode.json"))
    args = ap.parse_args()

    if args.worker:
        prompt = json.loads(sys.stdin.read())
        if args.worker == "stock":
            result = worker_stock(args, prompt)
        else:
            args.n_ctx_train = args.n_ctx_train or 0
            result = worker_ours(args, prompt)
        print(json.dumps(result))
        return 0

    import farctx

    model = str(args.model or farctx.default_model_path())
    prompt = prompt_tokens(model, args.prompt)
    streams = [int(x) for x in args.streams.split(",")]
    methods = args.methods.split(",")
    n_train = args.n_ctx_train or None
    long_prompt = prompt_tokens(model, 4 * (n_train or 8192))
    samples: dict[tuple[str, int], list[float]] = {}
    pasts: list[dict[str, Any]] = []
    for rep in range(args.reps):  # every configuration once per repetition: slow phases of the machine hit all
        for n in streams:
            for kind, method in [("stock", "vanilla")] + [("ours", m) for m in methods]:
                result = measure(kind, model, n, prompt, args, method)
                if result:
                    samples.setdefault((kind if kind == "stock" else method, n), []).append(result["decode_tps"])
        past = measure("ours", model, 4, long_prompt, args, "lminf", args.n_ctx_train)
        if past:
            pasts.append(past)
        print(f"repetition {rep + 1}/{args.reps} done", file=sys.stderr, flush=True)

    def median(key: tuple[str, int]) -> Optional[float]:
        values = sorted(samples.get(key, []))
        return values[len(values) // 2] if values else None

    rows = []
    for n in streams:
        stock = median(("stock", n))
        row: dict[str, Any] = {"streams": n, "stock_decode_tps": stock,
                               "stock_vs_1_stream": stock and median(("stock", streams[0])) and
                               stock / median(("stock", streams[0]))}
        for method in methods:
            ours = median((method, n))
            one = median((method, streams[0]))
            row[f"{method}_decode_tps"] = ours
            row[f"{method}_vs_stock"] = ours and stock and ours / stock
            row[f"{method}_vs_1_stream"] = ours and one and ours / one
        rows.append(row)
    past = None
    if pasts:
        past = sorted(pasts, key=lambda p: p["decode_tps"])[len(pasts) // 2]
        inside = median(("lminf", 4))
        past = {**past, "vs_4_streams_inside": inside and past["decode_tps"] / inside}
    report = {
        "model": model, "prompt_tokens": args.prompt, "n_gen": args.n_gen, "n_batch": args.n_batch,
        "n_ubatch": args.n_ubatch, "threads": args.threads, "flash_attn": args.fa, "reps": args.reps,
        "samples": {f"{k[0]}@{k[1]}": v for k, v in samples.items()},
        "stock": "llama-cpp-python low-level API on build/cmake-stock, n_seq_max = N, kv_unified off",
        "rows": rows,
        "lminf_4_streams_4x_past_context": past and {**past, "n_ctx_train_assumed": n_train or "model's",
                                                      "prompt_tokens_per_stream": len(long_prompt)},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"decode tokens/s summed over the streams, medians of {args.reps} (-t {args.threads}, -fa {args.fa}); "
          f"x1: against 1 stream of the same engine")
    print(f"{'streams':>7} {'stock tok/s':>12} {'x1':>5} " + " ".join(f"{m + ' tok/s':>14} {'x1':>5} {'/stock':>7}"
                                                                     for m in methods))
    for row in rows:
        cells = [f"{row['streams']:>7}", f"{row['stock_decode_tps'] or 0:>12.1f}", f"{row['stock_vs_1_stream'] or 0:>5.2f}"]
        for m in methods:
            cells += [f"{row[f'{m}_decode_tps'] or 0:>14.1f}", f"{row[f'{m}_vs_1_stream'] or 0:>5.2f}",
                      f"{row[f'{m}_vs_stock'] or 0:>7.2f}"]
        print(" ".join(cells))
    if past:
        print(f"lminf, 4 streams of {len(long_prompt)} prompt tokens (4 x {n_train or 'n_ctx_train'}): "
              f"{past['decode_tps']:.1f} tok/s ({past['vs_4_streams_inside'] or 0:.2f} x 4 streams inside); KV cells "
              f"per stream {past['cells_before']} -> {past['cells_after']}")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
