"""Host time per prefill ubatch and per generated token, outside ggml's compute: farctx against stock
llama.cpp in the same run.

On a GPU a small model's token takes about a millisecond, so the host work around each graph (the
mask fill and its upload, graph build or reuse, policy calls, Python) decides the speed. This measures
that work on the CPU: each measurement runs in a process of its own with `host_shim.c` preloaded,
which times every `ggml_backend_sched_graph_compute_async` call (synchronous on the CPU backend);
host time = wall time of the `Llama.eval` calls - time inside compute. Prefill is timed over the second
half of the prompt (the steady state: the first half settles each method's regime, and a regime
switch re-reserves llama.cpp's compute buffers once, reported apart as `warmup_host_us`). Stock is llama-cpp-python's
`Llama` on the unpatched library (build/cmake-stock), ours is `farctx.Llama`; both feed the same
tokens with the same n_batch = n_ubatch, then decode one token per call; the first decoded token (where a
method switches to its decoding graph once per stream) is reported apart, the rest per token.

    .venv/bin/python bench/host_time.py                       # defaults below, table on stdout
    .venv/bin/python bench/host_time.py --json bench/results/host-time/host-time.json

Two regimes: `inside` (the stream fits the trained context: every method runs the stock graph) and
`past` (--n-ctx-train smaller than the stream, so the methods run their own graphs; stock runs the
same length, which it can, since the model's real context is larger).

`--instructions` counts instead of timing: every worker runs under valgrind's callgrind with the graphs
not computed (FARCTX_HOST_SHIM_SKIP_COMPUTE=1), and the table gives the instructions of the host work
per prefill ubatch and per decoded token. Repeatable to a fraction of a percent where wall times on
shared cores scatter by 10-30%, but blind to memory stalls (a fresh mask's page faults, cold caches).
Needs valgrind (Debian `valgrind`, which also brings the header the shim is built with).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIM_SRC = Path(__file__).with_name("host_shim.c")
SHIM = ROOT / "build" / "host-shim" / "libfarctx-host-shim.so"


def build_shim() -> Path:
    if not SHIM.exists() or SHIM.stat().st_mtime < SHIM_SRC.stat().st_mtime:
        SHIM.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(SHIM), str(SHIM_SRC), "-ldl"], check=True)
    return SHIM


# ------------------------------------------------------------------------------------ worker

def worker(cfg: dict) -> dict:
    shim = ctypes.CDLL(None)  # the preloaded shim's symbols are global
    compute_ns = shim.farctx_host_shim_compute_ns
    compute_ns.restype = ctypes.c_uint64
    calls = shim.farctx_host_shim_compute_calls
    calls.restype = ctypes.c_uint64
    count = shim.farctx_host_shim_count  # callgrind's counting (--instructions); a no-op outside valgrind
    count.argtypes = [ctypes.c_int, ctypes.c_char_p]

    length, n_gen, ub = cfg["length"], cfg["n_gen"], cfg["n_ubatch"]
    common = dict(n_batch=ub, n_ubatch=ub, n_threads=cfg["threads"], verbose=False,
                  flash_attn=cfg["flash_attn"])
    if cfg["method"] == "stock":
        import llama_cpp

        llm = llama_cpp.Llama(model_path=cfg["model"], n_ctx=length + n_gen, **common)
    else:
        import farctx

        kwargs = dict(common)
        if cfg.get("n_ctx_train"):
            kwargs["n_ctx_train"] = cfg["n_ctx_train"]
        if cfg["method"] in ("vanilla", "mesa", "rerope", "selfextend"):
            kwargs["n_ctx"] = length + n_gen
        llm = farctx.Llama(cfg["model"], method=cfg["method"], **kwargs)
    tokens = list(range(1000, 1000 + length + n_gen))  # any valid ids: host time does not depend on them

    if os.environ.get("FARCTX_HOST_SHIM_SKIP_COMPUTE") == "1" and not shim.farctx_host_shim_can_count():
        raise SystemExit("host_time: the shim was built without valgrind's headers (Debian package valgrind)")

    def timed(fn, name: str = "") -> tuple[float, float, int]:
        c0, n0 = compute_ns(), calls()
        if name:
            count(1, None)
        t0 = time.perf_counter_ns()
        fn()
        wall = time.perf_counter_ns() - t0
        if name:
            count(0, name.encode())
        return wall / 1e3, (compute_ns() - c0) / 1e3, calls() - n0

    # the first half of the prompt settles the regime (a method switches from the stock graph to its own
    # past n_local, which re-reserves the compute buffers once): the second half is the steady state that
    # a long prompt lives in
    warm = (length // 2) // ub * ub
    wall_w, comp_w, graphs_w = timed(lambda: llm.eval(tokens[:warm]))
    wall_p, comp_p, graphs_p = timed(lambda: llm.eval(tokens[warm:length]), "prefill")

    # the first decoded token apart: where a method switches from its prompt's graph to its decoding one (a
    # reservation of the new setting, mesa's first in-place rotation of the cache), once per stream
    wall_f, comp_f, _ = timed(lambda: llm.eval([tokens[length]]))

    def decode() -> None:
        for t in tokens[length + 1:]:
            llm.eval([t])

    wall_d, comp_d, graphs_d = timed(decode, "decode")
    n_ubatches = -(-(length - warm) // ub)
    return {
        "prefill_host_us_per_ubatch": (wall_p - comp_p) / n_ubatches,
        "prefill_compute_us_per_ubatch": comp_p / n_ubatches,
        "warmup_host_us": wall_w - comp_w,
        "decode_host_us_per_token": (wall_d - comp_d) / (n_gen - 1),
        "decode_compute_us_per_token": comp_d / (n_gen - 1),
        "first_token_host_us": wall_f - comp_f,
        "graphs_prefill": graphs_p,
        "graphs_decode": graphs_d,
        "n_ubatches": n_ubatches,
    }


# ------------------------------------------------------------------------------------ driver

def callgrind_counts(out_dir: Path) -> dict[str, int]:
    """Instructions per named dump (farctx_host_shim_count) in callgrind's output files."""
    counts: dict[str, int] = {}
    for f in out_dir.glob("cg.out*"):
        name, total = None, None
        for line in f.read_text(errors="replace").splitlines():
            if line.startswith("desc: Trigger: Client Request: "):
                name = line.rsplit(": ", 1)[1].strip()
            elif line.startswith(("summary: ", "totals: ")):
                total = int(line.split()[1])
        if name and total is not None:
            counts[name] = total
    return counts


def run_one(cfg: dict, instructions: bool = False) -> dict:
    env = dict(os.environ, LD_PRELOAD=str(SHIM), PYTHONPATH=str(ROOT / "pyext"))
    if cfg["method"] == "stock":
        from farctx.bench.harness import stock_lib_dir

        env["LLAMA_CPP_LIB_PATH"] = str(stock_lib_dir())
    cmd = [sys.executable, __file__, "--worker", json.dumps(cfg)]
    with tempfile.TemporaryDirectory() as tmp:
        if instructions:
            env["FARCTX_HOST_SHIM_SKIP_COMPUTE"] = "1"
            cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", f"--callgrind-out-file={tmp}/cg.out"] + cmd
        out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        if instructions:
            counts = callgrind_counts(Path(tmp))
            res["prefill_instr_per_ubatch"] = counts["prefill"] / res["n_ubatches"]
            res["decode_instr_per_token"] = counts["decode"] / (cfg["n_gen"] - 1)
    return res


def median_rows(samples: dict[tuple[str, str], list[dict]], methods: list[str], keys: list[str],
                ratios: tuple[str, str]) -> list[dict]:
    """Per regime and method (stock first): the median of each key, and keys[0] and keys[1] over stock's as
    ratios[0] and ratios[1]."""
    table = []
    for regime in ("inside", "past"):
        stock = {k: statistics.median(s[k] for s in samples[("stock", regime)]) for k in keys}
        for method in ["stock"] + methods:
            med = {k: statistics.median(s[k] for s in samples[(method, regime)]) for k in keys}
            table.append({"regime": regime, "method": method, **med,
                          ratios[0]: med[keys[0]] / stock[keys[0]], ratios[1]: med[keys[1]] / stock[keys[1]]})
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("-m", "--model", default=None, help="GGUF (default: the bundled model)")
    ap.add_argument("--methods", default="vanilla,lminf,window,streaming,mesa")
    ap.add_argument("--length", type=int, default=2048, help="prompt tokens")
    ap.add_argument("-n", "--n-gen", type=int, default=64, help="tokens decoded one per call")
    ap.add_argument("-ub", "--n-ubatch", type=int, default=256)
    ap.add_argument("--past-n-ctx-train", type=int, default=512,
                    help="n_ctx_train given to the methods in the `past` regime")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-fa", "--flash-attn", default="off", choices=["on", "off"])
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--instructions", action="store_true",
                    help="count the host work's instructions under callgrind (graphs not computed) instead of timing")
    args = ap.parse_args()

    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return

    if args.instructions and shutil.which("valgrind") is None:
        ap.error("--instructions needs valgrind (Debian package valgrind)")
    sys.path.insert(0, str(ROOT / "pyext"))
    import farctx

    build_shim()
    model = args.model or str(farctx.default_model_path())
    base = dict(model=model, length=args.length, n_gen=args.n_gen, n_ubatch=args.n_ubatch, threads=args.threads,
                flash_attn=args.flash_attn == "on")
    methods = args.methods.split(",")
    samples: dict[tuple[str, str], list[dict]] = {}
    for rep in range(args.reps):
        for regime in ("inside", "past"):
            for method in ["stock"] + methods:  # stock interleaved with every repetition
                cfg = dict(base, method=method)
                if regime == "past" and method != "stock":
                    cfg["n_ctx_train"] = args.past_n_ctx_train
                samples.setdefault((method, regime), []).append(run_one(cfg, args.instructions))
                print(f"rep {rep + 1}/{args.reps} {regime:<6} {method:<10} done", file=sys.stderr, flush=True)

    if args.instructions:
        print_instructions(args, samples, methods)
        return
    keys = ["prefill_host_us_per_ubatch", "decode_host_us_per_token", "prefill_compute_us_per_ubatch",
            "decode_compute_us_per_token", "warmup_host_us", "first_token_host_us"]
    table = median_rows(samples, methods, keys, ("prefill_host_ratio", "decode_host_ratio"))
    print(f"host time outside ggml compute, medians of {args.reps} (prompt {args.length}, ubatch {args.n_ubatch}, "
          f"{args.n_gen} decoded, -fa {args.flash_attn}, -t {args.threads}; past: n_ctx_train {args.past_n_ctx_train})")
    print()
    print("| regime | method | host us / ubatch | x stock | host us / token | x stock | compute us / ubatch | "
          "compute us / token | first half: host ms | first token: host ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['regime']} | {r['method']} | {r['prefill_host_us_per_ubatch']:.0f} | {r['prefill_host_ratio']:.2f} | "
              f"{r['decode_host_us_per_token']:.0f} | {r['decode_host_ratio']:.2f} | "
              f"{r['prefill_compute_us_per_ubatch']:.0f} | {r['decode_compute_us_per_token']:.0f} | "
              f"{r['warmup_host_us'] / 1e3:.1f} | {r['first_token_host_us'] / 1e3:.1f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "rows": table}, indent=1))


def print_instructions(args: argparse.Namespace, samples: dict[tuple[str, str], list[dict]], methods: list[str]) -> None:
    keys = ["prefill_instr_per_ubatch", "decode_instr_per_token", "graphs_prefill"]
    table = median_rows(samples, methods, keys, ("prefill_ratio", "decode_ratio"))
    print(f"host work in instructions (callgrind, graphs not computed), medians of {args.reps} (prompt {args.length}, "
          f"ubatch {args.n_ubatch}, {args.n_gen} decoded, -fa {args.flash_attn}, -t {args.threads}; past: n_ctx_train "
          f"{args.past_n_ctx_train})")
    print()
    print("| regime | method | M instr / ubatch | x stock | k instr / token | x stock | graphs, second half |")
    print("|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['regime']} | {r['method']} | {r['prefill_instr_per_ubatch'] / 1e6:.2f} | {r['prefill_ratio']:.2f} | "
              f"{r['decode_instr_per_token'] / 1e3:.0f} | {r['decode_ratio']:.2f} | {r['graphs_prefill']:.0f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": vars(args), "rows": table}, indent=1))


if __name__ == "__main__":
    main()
