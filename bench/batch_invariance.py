"""How much one stream's logits move when other streams share its llama_decode calls, in stock llama.cpp and in ours.

The server's greedy answers under load are compared with the same request served alone (bench/soak.py). llama.cpp
is not batch-invariant: a stream whose tokens share a ubatch with other streams' goes through kernels of other
shapes (matrix products, flash attention over a longer cache view), whose roundings differ. This measures that
difference for the same model, prompt and settings, in one run, on stock llama.cpp (build/cmake-stock) and on
ours (patched llama.cpp, a vanilla stream: llama.cpp's own graph), and ours with batch-invariant kernels
(`llama_set_batch_invariant`, what `farctx serve --deterministic` turns on), through llama-cpp-python's
low-level API:

- alone: stream 0's prompt in llama_decode calls of n_batch tokens (its own), the other streams empty;
- together: every call carries n_batch / 4 tokens of each of 4 streams (stream 0's prompt and three others).

Printed per engine: max |logits together - logits alone| at stream 0's last prompt token (and over its last 64),
relative to the largest logit, the gap between the first two tokens alone (a greedy answer flips where the
difference exceeds that gap), and the seconds both runs took (the cost of the batch-invariant kernels).

    .venv/bin/python bench/batch_invariance.py [-fa on|off] [--prompt-tokens 731]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import llama_cpp
    import numpy as np

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    if args.deterministic:
        mparams.use_extra_bufts = False  # as farctx's SequenceBatch: repacked weights have batch-shaped kernels
    model = llama_cpp.llama_model_load_from_file(args.model.encode(), mparams)
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    texts = json.loads(args.texts)
    prompts = []
    for text in texts:
        buf = (llama_cpp.llama_token * (4 * len(text) + 16))()
        n = llama_cpp.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, len(buf), True, False)
        prompts.append(list(buf[: min(n, args.prompt_tokens)]))

    def context() -> Any:
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = 4 * 2048
        cparams.n_batch, cparams.n_ubatch = args.n_batch, args.n_ubatch
        cparams.n_seq_max, cparams.kv_unified = 4, False
        cparams.n_threads = cparams.n_threads_batch = args.threads
        cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if args.fa == "on"
                                   else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if args.deterministic:
            import ctypes

            fn = llama_cpp.llama_cpp._lib.llama_set_batch_invariant
            fn.restype, fn.argtypes = ctypes.c_bool, [ctypes.c_void_p, ctypes.c_bool]
            assert fn(ctx, True), "a backend without batch-invariant kernels"
        return ctx

    batch = llama_cpp.llama_batch_init(args.n_batch, 0, 1)

    def decode(ctx: Any, items: list[tuple[int, int, int]], keep: int) -> np.ndarray:
        """items (token, pos, seq); returns the logits of every item of stream 0 in the last `keep` positions"""
        batch.n_tokens = len(items)
        n0 = len(prompts[0])
        for k, (tok, pos, seq) in enumerate(items):
            batch.token[k], batch.pos[k], batch.n_seq_id[k] = tok, pos, 1
            batch.seq_id[k][0] = seq
            batch.logits[k] = int(seq == 0 and pos >= n0 - keep)
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        rows = [k for k, (_, pos, seq) in enumerate(items) if seq == 0 and pos >= n0 - keep]
        return np.array([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, k), shape=(n_vocab,)).copy()
                         for k in rows])

    keep = 64
    t0 = time.perf_counter()
    ctx = context()
    alone = []
    p0 = prompts[0]
    for s in range(0, len(p0), args.n_batch):
        alone.append(decode(ctx, [(t, s + k, 0) for k, t in enumerate(p0[s : s + args.n_batch])], keep))
    llama_cpp.llama_free(ctx)
    t1 = time.perf_counter()
    ctx = context()
    together, share = [], args.n_batch // 4
    fed = [0] * 4
    while fed[0] < len(p0):
        items = []
        for seq in range(4):
            piece = prompts[seq][fed[seq] : fed[seq] + share]
            items += [(t, fed[seq] + k, seq) for k, t in enumerate(piece)]
            fed[seq] += len(piece)
        together.append(decode(ctx, items, keep))
    llama_cpp.llama_free(ctx)
    t2 = time.perf_counter()
    a = np.concatenate([x for x in alone if len(x)]).astype(np.float64)
    b = np.concatenate([x for x in together if len(x)]).astype(np.float64)
    scale = float(np.abs(a).max())
    top2 = np.sort(a[-1])[-2:]
    return {"last_max_diff": float(np.abs(a[-1] - b[-1]).max()), "last64_max_diff": float(np.abs(a - b).max()),
            "scale": scale, "top2_gap_alone": float(top2[1] - top2[0]),
            "argmax_equal_last64": int((a.argmax(1) == b.argmax(1)).sum()), "n_rows": len(a),
            "seconds_alone": t1 - t0, "seconds_together": t2 - t1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--texts", help=argparse.SUPPRESS)
    ap.add_argument("--deterministic", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default=None)
    ap.add_argument("-fa", "--flash-attn", dest="fa", choices=["on", "off"], default="on")
    ap.add_argument("--prompt-tokens", type=int, default=731)
    ap.add_argument("-b", "--n-batch", type=int, default=512)
    ap.add_argument("-ub", "--n-ubatch", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON (default: bench/results/serve/batch-invariance-fa-<on|off>.json)")
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    from farctx.bench.harness import stock_lib_dir
    from farctx.eval.data import austen
    from farctx.models import resolve_model_path

    model = str(resolve_model_path(args.model))
    words = austen().split()
    texts = [" ".join(words[k * 50_000 : k * 50_000 + args.prompt_tokens]) for k in range(4)]
    rows = {}
    for engine in ("stock", "ours", "ours-det"):
        env = dict(os.environ)
        if engine == "stock":
            env["LLAMA_CPP_LIB_PATH"] = str(stock_lib_dir())
            code = "import sys, runpy; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
        else:  # farctx sets LLAMA_CPP_LIB_PATH to its own library when imported first
            code = ("import farctx, sys, runpy; sys.argv = sys.argv[1:]; "
                    "runpy.run_path(sys.argv[0], run_name='__main__')")
        cmd = [sys.executable, "-c", code, __file__, "--worker", "--texts", json.dumps(texts), "--model", model,
               "-fa", args.fa, "--prompt-tokens", str(args.prompt_tokens), "-b", str(args.n_batch),
               "-ub", str(args.n_ubatch), "-t", str(args.threads)] + (["--deterministic"] if engine == "ours-det" else [])
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if run.returncode != 0:
            print(run.stderr[-3000:], file=sys.stderr)
            return 1
        rows[engine] = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"one stream's logits, alone vs sharing each llama_decode with 3 others (-b {args.n_batch} "
          f"-ub {args.n_ubatch} -fa {args.fa}, {args.prompt_tokens}-token prompts, bundled model)")
    print("engine    max diff last token  max diff last 64  relative  top-2 gap alone  same argmax (of 64)  "
          "seconds (alone + together)  time / ours")
    for engine, r in rows.items():
        secs = r["seconds_alone"] + r["seconds_together"]
        base = rows["ours"]["seconds_alone"] + rows["ours"]["seconds_together"]
        print(f"{engine:<9} {r['last_max_diff']:>19.4f} {r['last64_max_diff']:>17.4f} "
              f"{r['last64_max_diff'] / r['scale']:>9.2%} {r['top2_gap_alone']:>16.4f} "
              f"{r['argmax_equal_last64']:>17}/{r['n_rows']} {secs:>27.2f} {secs / base:>12.2f}")
    out = Path(args.out or ROOT / "bench" / "results" / "serve" / f"batch-invariance-fa-{args.fa}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"settings": {k: v for k, v in vars(args).items()
                                                       if k not in ("worker", "texts")}, "rows": rows}, indent=1)
                              + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
