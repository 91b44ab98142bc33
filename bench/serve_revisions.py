"""`farctx serve` at two revisions of the Python package under the same OpenAI-SDK load, in one run.

For a change that touches only Python (the native libraries are the ones built here, shared by both), this
tells whether the server got slower: each revision's package is exported (`git archive`) into a folder of its own
and run with the interpreter's site-packages but without the editable install (`python -S`), so both load the same
way. For each -np, each revision serves `--requests` chat completions (greedy, `--max-tokens` each) from -np
clients at once; the revisions alternate `--rounds` times. Prints the median request time and the tokens per
second of each, and their ratio (REV over BASE); writes the table and its JSON to bench/results/serve/.

    .venv/bin/python bench/serve_revisions.py --base 30d2a28 [--rev WORKTREE] [--parallel 1,4] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from soak import _free_port, start_server  # noqa: E402

QUESTIONS = ["Tell me a short story about a lighthouse keeper.", "What makes a good cup of tea?",
             "Describe a walk through a forest in autumn.", "Why do cats purr?", "Explain how a bicycle stays upright.",
             "Write a letter to a friend about a trip to the sea.", "What is the best way to learn to cook?",
             "Describe the night sky in winter."]


def export(rev: str, dest: Path) -> Path:
    """The package of `rev` ("WORKTREE": the files as they are here) as an importable folder: farctx with its
    cli subpackage, as pyproject.toml maps them."""
    src = dest / "src"
    if rev == "WORKTREE":
        shutil.copytree(ROOT / "pyext", src / "pyext", ignore=shutil.ignore_patterns("__pycache__", "lib"))
        shutil.copytree(ROOT / "cli", src / "cli", ignore=shutil.ignore_patterns("__pycache__"))
    else:
        src.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "pyext", "cli"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pkg = dest / "pkg"
    shutil.copytree(src / "pyext" / "farctx", pkg / "farctx")
    shutil.copytree(src / "cli", pkg / "farctx" / "cli")
    return pkg


def load(base: str, clients: int, requests: int, max_tokens: int) -> dict[str, Any]:
    """`requests` chat completions from `clients` threads at once; request times and completion tokens."""
    from openai import OpenAI

    times: list[float] = []
    tokens: list[int] = []
    lock = threading.Lock()
    todo = list(range(requests))

    def client() -> None:
        api = OpenAI(base_url=f"{base}/v1", api_key="none", timeout=600)
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop()
            started = time.perf_counter()
            out = api.chat.completions.create(model="m", messages=[{"role": "user", "content": QUESTIONS[i % 8]}],
                                              max_tokens=max_tokens, temperature=0)
            with lock:
                times.append(time.perf_counter() - started)
                tokens.append(out.usage.completion_tokens)

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return {"wall_s": wall, "median_request_s": statistics.median(times), "tokens": sum(tokens),
            "tok_per_s": sum(tokens) / wall}


def serve_once(pkg: Path, np_: int, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=f"{pkg}{os.pathsep}{sysconfig.get_paths()['purelib']}",
               FARCTX_LIB_DIR=str(Path(sysconfig.get_paths()["purelib"]) / "farctx" / "lib"))
    cmd = [sys.executable, "-S", "-m", "farctx.cli.main", "serve", "--port", str(port), "-np", str(np_),
           "-t", str(args.threads), "--log-level", "warning"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        import httpx

        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        load(base, np_, np_, 4)  # warm-up
        return load(base, np_, args.requests, args.max_tokens)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the revision to compare against (a commit)")
    ap.add_argument("--rev", default="WORKTREE", help="the revision under test (default: the files as they are)")
    ap.add_argument("--parallel", default="1,4", help="comma-separated -np values; as many clients at once")
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve"))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="serve-revisions-"))
    pkgs = {name: export(rev, work / name) for name, rev in (("base", args.base), ("rev", args.rev))}
    rows = []
    for np_ in (int(x) for x in args.parallel.split(",")):
        runs: dict[str, list[dict[str, Any]]] = {"base": [], "rev": []}
        for r in range(args.rounds):
            for name in ("base", "rev") if r % 2 == 0 else ("rev", "base"):
                res = serve_once(pkgs[name], np_, args, work / f"{name}-np{np_}-{r}.log")
                runs[name].append(res)
                print(f"-np {np_} round {r + 1} {name}: {res['tok_per_s']:.1f} tok/s, median request "
                      f"{res['median_request_s']:.2f} s", file=sys.stderr, flush=True)
        med = {name: {k: statistics.median(run[k] for run in runs[name]) for k in ("tok_per_s", "median_request_s")}
               for name in runs}
        rows.append({"np": np_, "base": med["base"], "rev": med["rev"], "runs": runs,
                     "speed_ratio": med["rev"]["tok_per_s"] / med["base"]["tok_per_s"],
                     "time_ratio": med["rev"]["median_request_s"] / med["base"]["median_request_s"]})
    lines = [f"farctx serve (bundled model, vanilla, -t {args.threads}), {args.requests} chat completions of "
             f"{args.max_tokens} tokens from -np clients at once, {args.rounds} alternating rounds; base {args.base}, "
             f"rev {args.rev}", "",
             "| -np | base tok/s | rev tok/s | rev / base speed | base median request s | rev median request s | "
             "rev / base time |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['np']} | {row['base']['tok_per_s']:.1f} | {row['rev']['tok_per_s']:.1f} | "
                     f"{row['speed_ratio']:.3f} | {row['base']['median_request_s']:.2f} | "
                     f"{row['rev']['median_request_s']:.2f} | {row['time_ratio']:.3f} |")
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "revisions.txt").write_text(text + "\n")
    (out / "revisions.json").write_text(json.dumps({"base": args.base, "rev": args.rev, "rows": rows}, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
