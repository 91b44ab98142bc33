"""One client, one request at a time: `farctx serve -np 1` against a baseline server, in the same run.

The baseline is any command that serves the same OpenAI API (`--baseline "CMD ..."`, e.g. the farctx command
of an older checkout, or stock llama-server); both servers run the same model with the same flags, side by side,
and the requests alternate between them (one server busy at a time), so both see the same machine load. Each
request is a streamed completion of a distinct Austen passage (no prompt reuse), greedy, `--n-gen` tokens.

Reported per server: median time to first token, median whole-request time, decode tokens/s (generated tokens
after the first over the time after the first), and farctx / baseline ratios. JSON beside the table.

    .venv/bin/python bench/serve_single.py --baseline "python /path/to/old/farctx serve" --out bench/serve-single/x.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak import _free_port, start_server  # noqa: E402


def one_request(base: str, prompt: str, n_gen: int) -> dict[str, float]:
    body = {"prompt": prompt, "max_tokens": n_gen, "temperature": 0, "stream": True,
            "logit_bias": {"0": -100, "2": -100}}  # no end of text: every request generates n_gen tokens
    started = time.perf_counter()
    first = None
    n = 0
    with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None and "prompt_progress" not in chunk:
                n += 1
                if first is None:
                    first = time.perf_counter()
    end = time.perf_counter()
    assert first is not None
    return {"ttft": first - started, "total": end - started, "decode_tps": (n - 1) / max(1e-9, end - first),
            "n": n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="the baseline's serve command (its --port is appended)")
    ap.add_argument("--baseline-name", default="baseline")
    ap.add_argument("--method", default="vanilla")
    ap.add_argument("--requests", type=int, default=12, help="requests per server")
    ap.add_argument("--prompt-words", type=int, default=300)
    ap.add_argument("--n-gen", type=int, default=32)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--flags", default="", help="more flags for both servers (e.g. '-fa on -c 4096')")
    ap.add_argument("--out", type=Path, default=Path("bench/serve-single/serve-single.json"))
    args = ap.parse_args()

    from farctx.eval.data import austen

    words = austen("persuasion").split()
    prompts = [" ".join(words[i * args.prompt_words:(i + 1) * args.prompt_words]) for i in range(args.requests + 1)]
    common = ["--method", args.method, "-t", str(args.threads), "--log-level", "warning", *shlex.split(args.flags)]
    servers = {"farctx -np 1": [sys.executable, "-m", "farctx.cli.main", "serve", "-np", "1", *common],
               args.baseline_name: [*shlex.split(args.baseline), *common]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    bases, procs = {}, []
    try:
        for name, cmd in servers.items():
            port = _free_port()
            base = f"http://127.0.0.1:{port}"
            proc, up = start_server([*cmd, "--port", str(port)], args.out.with_suffix(f".{len(procs)}.server.log"),
                                    base, 300)
            procs.append(proc)
            if not up:
                print(f"{name} did not start: {cmd}", file=sys.stderr)
                return 1
            bases[name] = base
        for base in bases.values():  # warm-up: the first request of each pays for lazy work
            one_request(base, prompts[-1], args.n_gen)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in bases}
        for i in range(args.requests):
            order = list(bases) if i % 2 == 0 else list(reversed(bases))
            for name in order:
                results[name].append(one_request(bases[name], prompts[i], args.n_gen))
            print(f"\rrequest {i + 1}/{args.requests}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)

    summary: dict[str, Any] = {"method": args.method, "requests": args.requests, "prompt_words": args.prompt_words,
                               "n_gen": args.n_gen, "threads": args.threads, "flags": args.flags,
                               "baseline": args.baseline, "servers": {}}
    for name, rows in results.items():
        summary["servers"][name] = {key: statistics.median(r[key] for r in rows) for key in ("ttft", "total",
                                                                                              "decode_tps")}
    ours, base = summary["servers"]["farctx -np 1"], summary["servers"][args.baseline_name]
    summary["ratio"] = {"ttft": ours["ttft"] / base["ttft"], "total": ours["total"] / base["total"],
                        "decode_tps": ours["decode_tps"] / base["decode_tps"]}
    print(f"| server | median TTFT s | median request s | decode tok/s |\n|---|---|---|---|")
    for name, row in summary["servers"].items():
        print(f"| {name} | {row['ttft']:.3f} | {row['total']:.3f} | {row['decode_tps']:.1f} |")
    r = summary["ratio"]
    print(f"farctx / {args.baseline_name}: TTFT x{r['ttft']:.2f}, request time x{r['total']:.2f}, "
          f"decode speed x{r['decode_tps']:.2f} (time: lower is better; speed: higher)")
    args.out.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
