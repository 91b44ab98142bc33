"""Four concurrent completions on the bundled model, one of them 4 x past the trained context, per method.

For each method: `farctx serve --method M -np 4 -fa on` (or `-fa off`) on the default model (SmolLM2-135M, 30 layers), with
the methods assuming a trained context of T tokens (`--n-ctx-train T`, so that 4 x T is quick to read on a CPU;
`--n-ctx-train 0`: the model's own 8192); four greedy completions (prompts of 16 tokens, T / 2, T and 4 x T,
from Jane Austen) are sent one after another, then all four at once, and the answers compared. Fails (exit 1)
on a 5xx, a server that dies, or an answer under load different from the same request alone. Writes a table and
its JSON to bench/results/serve/.

    .venv/bin/python bench/serve_concurrent.py [--methods lminf,streaming,rerope,selfextend,mesa] [--n-ctx-train 512] [-fa on|off]

With -fa on, llama.cpp's CPU flash attention is not batch-invariant (a stream's queries go through its tiled kernel
when a ubatch holds at least its tile of them, else through a kernel accumulating in F16), so a greedy answer may
take another token where two are nearly tied; bench/batch_invariance.py measures that on stock llama.cpp and ours.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from soak import _free_port, rss_mb, start_server  # noqa: E402


def prompts(t: int) -> list[str]:
    """Texts of about 16, t / 2, t and 4 t tokens of the default model's tokenizer (about 1.3 tokens a word)."""
    from farctx.eval.data import austen

    words = austen().split()
    return [" ".join(words[k * 40_000 : k * 40_000 + n]) for k, n in enumerate([12, t * 3 // 8, t * 3 // 4, t * 3])]


def complete(base: str, prompt: str, max_tokens: int) -> tuple[int, str, int]:
    r = httpx.post(f"{base}/v1/completions", timeout=1800,
                   json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    if r.status_code != 200:
        return r.status_code, r.text[:300], 0
    body = r.json()
    return 200, body["choices"][0]["text"], body["usage"]["prompt_tokens"]


def run_method(method: str, t: int, n_gen: int, threads: int, fa: str, log_dir: Path) -> dict[str, Any]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    n_train = t or 8192
    from farctx.methods import method_infos

    # the methods that keep the whole stream: 4 t + a reply per slot (-c is the 4 slots' cells)
    ctx = 4 * 5 * n_train if not method_infos()[method].fixed_cache else 0
    cmd = [sys.executable, "-m", "farctx.cli.main", "serve", "--port", str(port), "--method", method, "-np", "4",
           "-fa", fa, "-t", str(threads), "--log-level", "warning"]
    if t:
        cmd += ["--n-ctx-train", str(t)]
    if ctx:
        cmd += ["-c", str(ctx)]
    log_path = log_dir / f"{method}.server.log"
    proc, up = start_server(cmd, log_path, base, 600)
    try:
        if not up:
            return {"method": method, "error": "the server did not start", "log": log_path.read_text()[-2000:]}
        texts = prompts(n_train)
        t0 = time.monotonic()
        alone = [complete(base, p, n_gen) for p in texts]
        t_alone = time.monotonic() - t0
        together: list[Any] = [None] * len(texts)

        def send(i: int) -> None:
            together[i] = complete(base, texts[i], n_gen)

        t0 = time.monotonic()
        threads_ = [threading.Thread(target=send, args=(i,)) for i in range(len(texts))]
        for th in threads_:
            th.start()
        for th in threads_:
            th.join()
        t_together = time.monotonic() - t0
        alive = proc.poll() is None and httpx.get(f"{base}/health", timeout=5).status_code == 200
        statuses = [a[0] for a in alone] + [b[0] for b in together]
        return {"method": method, "n_ctx_train": n_train, "prompt_tokens": [a[2] for a in alone],
                "statuses": statuses, "equal": [a == b for a, b in zip(alone, together)],
                "answers": [a[1] for a in alone], "seconds_serial": round(t_alone, 1),
                "seconds_concurrent": round(t_together, 1), "server_alive": alive,
                "server_rss_mb": round(rss_mb(proc.pid), 1)}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--methods", default="lminf,streaming,rerope,selfextend,mesa")
    ap.add_argument("--n-ctx-train", type=int, default=512, help="the trained context the methods assume (0: the model's)")
    ap.add_argument("-n", "--n-gen", type=int, default=16)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-fa", "--flash-attn", dest="fa", choices=["on", "off"], default="on")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for method in args.methods.split(","):
        print(f"{method}: serving ...", file=sys.stderr, flush=True)
        row = run_method(method, args.n_ctx_train, args.n_gen, args.threads, args.fa, out)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "answers"}), file=sys.stderr, flush=True)
    ok = all(not r.get("error") and r["server_alive"] and all(s == 200 for s in r["statuses"]) and all(r["equal"])
             for r in rows)
    lines = [f"farctx serve --method M -np 4 -fa {args.fa}, bundled model, methods assuming n_ctx_train "
             f"{args.n_ctx_train or 8192}; 4 greedy completions of {args.n_gen} tokens, serial then concurrent",
             "method      prompt tokens                 all 200  equal to serial  serial s  concurrent s  RSS MB"]
    for r in rows:
        if r.get("error"):
            lines.append(f"{r['method']:<11} {r['error']}")
            continue
        lines.append(f"{r['method']:<11} {str(r['prompt_tokens']):<29} {str(all(s == 200 for s in r['statuses'])):<8} "
                     f"{str(r['equal']):<16} {r['seconds_serial']:>8} {r['seconds_concurrent']:>13} "
                     f"{r['server_rss_mb']:>7}")
    lines.append("passed" if ok else "FAILED")
    tag = f"ctx{args.n_ctx_train or 8192}-fa-{args.fa}"
    (out / f"concurrent-{tag}.txt").write_text("\n".join(lines) + "\n")
    (out / f"concurrent-{tag}.json").write_text(json.dumps({"passed": ok, "rows": rows}, indent=1) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
