"""Where the time goes: a `perf` profile of one phase (prefill or decode) of one method.

Runs farctx in this process, attaches `perf record` to it for the chosen phase only, and prints
the functions that took the most CPU time (self time, all threads), grouped into what they are
(attention products, softmax, copies, RoPE, weights, ...).

    .venv/bin/python bench/profile.py --model build/bench/attnbound-2k.gguf --method lminf \
        --length 8192 --phase decode -n 128 -fa on

Needs `perf` (Debian package linux-perf) and kernel.perf_event_paranoid <= 2.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


# ggml CPU functions by what they do (substring of the symbol -> group)
GROUPS = [
    ("vec_dot_f16", "F16 dot products (K.Q, V.P)"),
    ("vec_dot_f32", "F32 dot products"),
    ("vec_dot_q", "quantized dot products (weights)"),
    ("gemm", "GEMM kernels (weights)"),
    ("gemv", "GEMV kernels (weights)"),
    ("flash_attn", "flash attention"),
    ("soft_max", "softmax"),
    ("vec_mad", "out_prod (V.P, few queries)"),
    ("out_prod", "out_prod (V.P, few queries)"),
    ("rope", "RoPE"),
    ("sincos", "RoPE"),
    ("concat", "concat"),
    ("dup", "copies (cont, cast)"),
    ("cpy", "copies (cont, cast)"),
    ("fp16_to_fp32", "F16 -> F32 conversion"),
    ("fp32_to_fp16", "F32 -> F16 conversion"),
    ("cpy_f32_f16", "F32 -> F16 conversion"),
    ("barrier", "thread barriers / waiting"),
    ("sync", "thread barriers / waiting"),
    ("farctx_", "farctx mask fill (host)"),
    ("extrap", "farctx mask fill (host)"),
]


def group_of(symbol: str) -> str:
    for key, name in GROUPS:
        if key in symbol:
            return name
    return "other"


def perf_report(data: Path) -> list[tuple[float, str]]:
    out = subprocess.run(
        ["perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "dso,symbol", "-g", "none",
         "--percent-limit", "0.3", "-F", "overhead,dso,sym", "--field-separator", "|"],
        capture_output=True, text=True, check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split("|")]
        if line.startswith("#") or len(parts) < 3 or not parts[0].endswith("%"):
            continue
        try:
            value = float(parts[0].rstrip("%"))
        except ValueError:
            continue
        dso, symbol = parts[1], parts[2].split("]", 1)[-1].strip()
        rows.append((value, symbol if not symbol.startswith("0x") else f"{dso} {symbol}"))
    return sorted(rows, key=lambda r: -r[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--method", default="lminf")
    ap.add_argument("--length", type=int, required=True, help="prompt tokens (the decode depth)")
    ap.add_argument("--phase", choices=["prefill", "decode"], default="decode")
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-fa", "--flash-attn", choices=["on", "off"], default="on")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", help="write the groups and the top functions here")
    args = ap.parse_args()
    if shutil.which("perf") is None:
        sys.exit("profile: `perf` is not installed (Debian: linux-perf)")

    from farctx.bench.worker import corpus, open_farctx

    kwargs = {"n_threads": args.threads, "flash_attn": args.flash_attn == "on", "verbose": False}
    llm = open_farctx(args.model, args.method, args.length, args.n_gen, kwargs)
    llm.progress = lambda done, total: None
    tokens = corpus(lambda b: llm.tokenize(b, add_bos=False), args.length + args.n_gen)

    def run_phase(phase: str) -> float:
        start = time.perf_counter()
        if phase == "prefill":
            llm.eval(tokens[: args.length])
        else:
            for t in tokens[args.length : args.length + args.n_gen]:
                llm.eval([t])
        return time.perf_counter() - start

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "perf.data"
        if args.phase == "decode":
            run_phase("prefill")
        rec = subprocess.Popen(["perf", "record", "-q", "-F", "999", "-p", str(os.getpid()), "-o", str(data)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # perf attaches
        seconds = run_phase(args.phase)
        rec.send_signal(signal.SIGINT)
        rec.wait()
        rows = perf_report(data)

    n = args.length if args.phase == "prefill" else args.n_gen
    groups: dict[str, float] = {}
    for value, symbol in rows:
        name = group_of(symbol)
        groups[name] = groups.get(name, 0.0) + value
    print(f"{args.method} {args.phase} at {args.length} tokens, -fa {args.flash_attn}, -t {args.threads}: "
          f"{n / seconds:.1f} tok/s ({seconds:.2f} s); share of CPU samples:")
    for name, value in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"  {value:5.1f}%  {name}")
    print("  top functions:")
    for value, symbol in rows[: args.top]:
        print(f"  {value:5.1f}%  {symbol}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "model": args.model, "method": args.method, "length": args.length, "phase": args.phase,
            "flash_attn": args.flash_attn, "threads": args.threads, "tokens_per_s": n / seconds,
            "groups": groups, "functions": [{"percent": v, "symbol": s} for v, s in rows],
        }, indent=1) + "\n")


if __name__ == "__main__":
    main()
