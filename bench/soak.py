"""Soak test of `farctx serve -np N`: a mixed load for a while, then checks.

Starts the server on the default model (SmolLM2-135M-Instruct) with its methods assuming a short trained
context (`--n-ctx-train 256`, so 8 x that is cheap), and runs client threads (more than the slots, so
requests queue) until the time is up, each drawing from a fixed pool of requests: completions and chat,
streamed and not, methods by the per-request `farctx` field (lminf, window, streaming, vanilla, mesa,
selfextend), prompts from a few tokens to 8 x the trained context, greedy (compared) and sampled; and
among them clients that leave mid-stream, clients that give up waiting (a read timeout of a second on a long
generation), malformed requests and requests that do not fit (400 expected). Every request of the pool is
first served alone (the reference answers, and the warm-up), and every greedy answer under load is compared
with its request's answer alone.

The server runs with --deterministic (batch-invariant kernels) unless --no-deterministic: then a greedy answer
may take another token under load where two are nearly tied (CPU flash attention, and matrix products on some
weight types, round differently for other batch shapes; docs/server.md), so mismatches are reported, not failed.

It fails (exit status 1) on: any 5xx, a request error that is not the expected one, the server dying, a
greedy answer under load different from the same request alone (with --deterministic), RSS rising after
warm-up by more than --max-kb-per-request KB per request answered (the least-squares slope of RSS against
the requests answered so far), RSS growing over the rounds that follow the load (--rounds of the same
requests, each client its share of the pool, RSS read at idle after each) by more than --max-growth KB per
request, or the server's /metrics counting other requests than the clients sent (in all and by status; a
client that left after the last byte was written is the server's 200 and its own 499). The summary
(JSON) goes to bench/results/soak/ (or --out).

    .venv/bin/python bench/soak.py --minutes 60 -np 4 -fa on   # the bundled model at its depth (the committed run)
    .venv/bin/python bench/soak.py --deep --minutes 5 -fa on   # a 30-layer random model (what CI runs)
    .venv/bin/python bench/soak.py --tiny --minutes 3          # the 2-layer random model
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Spec:
    """One request of the pool: its body, the path, and what it should get."""

    name: str
    path: str
    body: Any  # a dict, or raw text for malformed JSON
    expect: int = 200  # HTTP status
    leave_after: int = 0  # a client that leaves after this many stream events (0: reads to the end)
    give_up: float = 0.0  # a client that waits this many seconds for the next bytes, then leaves (0: no limit)

    @property
    def greedy(self) -> bool:
        return (self.expect == 200 and isinstance(self.body, dict) and self.body.get("temperature") == 0
                and not self.leave_after and not self.give_up)


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    answers: dict[str, set[str]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    n_requests: int = 0

    def add(self, status: int, outcome: str, spec: Spec, answer: Optional[str], problem: Optional[str]) -> None:
        with self.lock:
            self.n_requests += 1
            self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            if answer is not None and spec.greedy:
                self.answers.setdefault(spec.name, set()).add(answer)
            if problem and len(self.failures) < 50:
                self.failures.append(f"{spec.name}: {problem}")


def _text(words: list[str], n_tokens: int, rng: random.Random) -> str:
    n_words = max(1, int(n_tokens / 1.35))
    start = rng.randrange(0, max(1, len(words) - n_words))
    return " ".join(words[start:start + n_words])


def _corpus() -> list[str]:
    try:
        from farctx.eval.data import austen

        return austen("persuasion").split()
    except Exception:  # the Austen texts are an optional extra: plain words then
        rng = random.Random(0)
        vocab = "the a of and to in was she he it that her his not with as had for but at be you on by".split()
        return [rng.choice(vocab) for _ in range(50000)]


def methods(t: int) -> list[Optional[dict[str, Any]]]:
    """The methods of the mix (None: the server's lminf), their parameters scaled to the trained context t."""
    mesa = {"method": "mesa", "first_chunk": max(1, t // 8), "stair_width": max(1, t // 16),
            "last_context": max(1, t // 4), "gen_budget": max(1, t // 16)}
    return [None, {"method": "window", "n_local": t // 2}, {"method": "streaming", "n_sink": 4},
            {"method": "vanilla"}, mesa, {"method": "selfextend"}]


def pool(seed: int, t: int) -> list[Spec]:
    """The requests the clients draw from (fixed by the seed), for a trained context of t tokens (slots of
    8 t cells)."""
    rng = random.Random(seed)
    words = _corpus()
    mix = methods(t)
    specs: list[Spec] = []
    lengths = [8, t // 2, t, 2 * t, 4 * t, 8 * t - t // 2]
    for i in range(30):
        method = mix[i % len(mix)]
        n_prompt = rng.choice(lengths)
        if method is not None and method["method"] in ("mesa", "selfextend", "vanilla"):
            n_prompt = min(n_prompt, 3 * t)  # they keep the whole stream: inside a slot's cache
        chat = i % 3 == 1
        body: dict[str, Any] = {"max_tokens": rng.choice([4, 8, 16, 24]), "temperature": 0}
        if rng.random() < 0.2:
            body.update(temperature=0.8, seed=rng.randrange(1000))
        if method is not None:
            body["farctx"] = method
        text = _text(words, n_prompt, rng)
        if chat:
            body["messages"] = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": text}]
        else:
            body["prompt"] = text
        body["stream"] = i % 2 == 0
        if body["stream"] and rng.random() < 0.3:
            body["stream_options"] = {"include_usage": True}
        name = f"{i:02d}-{'chat' if chat else 'completion'}-{(method or {}).get('method', 'lminf')}-{n_prompt}"
        specs.append(Spec(name, "/v1/chat/completions" if chat else "/v1/completions", body))
    # clients that leave mid-stream (a long generation they never read to the end)
    for i in range(4):
        body = {"prompt": _text(words, rng.choice([20, 2 * t, 7 * t]), rng), "max_tokens": 400, "temperature": 0,
                "stream": True}
        if mix[i % 3] is not None:
            body["farctx"] = mix[i % 3]
        specs.append(Spec(f"leave-{i}", "/v1/completions", body, leave_after=rng.choice([1, 3, 8])))
    # clients that give up waiting: a long generation, read with a timeout shorter than it takes
    for i in range(2):
        body = {"prompt": _text(words, 4 * t, rng), "max_tokens": 300, "temperature": 0, "stream": i == 0}
        specs.append(Spec(f"give-up-{i}", "/v1/completions", body, give_up=1.0))
    # malformed requests and requests that do not fit
    specs += [
        Spec("bad-json", "/v1/completions", '{"prompt": "hi", "max_tokens": 4', 400),
        Spec("bad-field", "/v1/completions", {"prompt": "hi", "colour": "blue"}, 400),
        Spec("bad-type", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "x"},
             400),
        Spec("bad-method", "/v1/completions", {"prompt": "hi", "farctx": {"method": "magic"}}, 400),
        Spec("bad-param", "/v1/completions", {"prompt": "hi", "max_tokens": 2,
                                              "farctx": {"method": "mesa", "first_chunk": 100000}}, 400),
        Spec("no-messages", "/v1/chat/completions", {"messages": []}, 400),
        Spec("mesa-too-long", "/v1/completions", {"prompt": _text(words, 7 * t, rng), "max_tokens": 4 * t,
                                                  "farctx": mix[4]}, 400),
        Spec("vanilla-too-long", "/v1/completions", {"prompt": _text(words, 10 * t, rng), "max_tokens": 4,
                                                     "farctx": {"method": "vanilla"}}, 400),
    ]
    return specs


def send(base: str, spec: Spec, timeout: float = 600) -> tuple[int, str, Optional[str], Optional[str]]:
    """(status, outcome, answer text or None, problem or None). A client that gives up (Spec.give_up) counts as
    status 499 (the server's count of a client that left first)."""
    if spec.give_up:
        timeout = spec.give_up
    content = spec.body if isinstance(spec.body, str) else json.dumps(spec.body)
    headers = {"Content-Type": "application/json"}
    stream = isinstance(spec.body, dict) and spec.body.get("stream")
    try:
        if not stream:
            r = httpx.post(base + spec.path, content=content, headers=headers, timeout=timeout)
            if r.status_code != 200:
                problem = None if r.status_code == spec.expect else f"status {r.status_code}: {r.text[:200]}"
                return r.status_code, "refused", None, problem
            choice = r.json()["choices"][0]
            answer = choice.get("text") if "text" in choice else (choice.get("message") or {}).get("content") or ""
            return 200, "done", answer, None if spec.expect == 200 else "accepted a request it should refuse"
        with httpx.stream("POST", base + spec.path, content=content, headers=headers, timeout=timeout) as r:
            if r.status_code != 200:
                r.read()
                problem = None if r.status_code == spec.expect else f"status {r.status_code}: {r.text[:200]}"
                return r.status_code, "refused", None, problem
            pieces, n = [], 0
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                n += 1
                if spec.leave_after and n >= spec.leave_after:
                    return 499, "left", None, None  # the server's count of a client that left first
                data = line[len("data: "):]
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    return int(event["error"].get("code", 500)), "stream-error", None, f"stream error {event}"
                for choice in event.get("choices") or []:
                    pieces.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            return 200, "done", "".join(pieces), None
    except httpx.TimeoutException as exc:
        if spec.give_up:
            return 499, "gave-up", None, None
        return 0, "connection-error", None, f"{type(exc).__name__}: {exc}"
    except httpx.HTTPError as exc:
        return 0, "connection-error", None, f"{type(exc).__name__}: {exc}"


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB), in MB per minute."""
    if len(samples) < 3:
        return 0.0
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mr = sum(r for _, r in samples) / n
    var = sum((t - mt) ** 2 for t, _ in samples)
    return 60 * sum((t - mt) * (r - mr) for t, r in samples) / var if var else 0.0


def kb_per_request(samples: list[tuple[float, int, float]]) -> float:
    """Least-squares slope of RSS (MB) against the requests answered so far, in KB per request."""
    pts = [(q, r) for _, q, r in samples]
    if len(pts) < 3:
        return 0.0
    mq = sum(q for q, _ in pts) / len(pts)
    mr = sum(r for _, r in pts) / len(pts)
    var = sum((q - mq) ** 2 for q, _ in pts)
    return 1024 * sum((q - mq) * (r - mr) for q, r in pts) / var if var else 0.0


def server_metrics(base: str) -> dict[str, float]:
    """The server's /metrics as {sample name: value} ({} when it does not answer)."""
    found: dict[str, float] = {}
    try:
        for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                found[name] = float(value)
    except httpx.HTTPError:
        pass
    return found


def rounds(base: str, specs: list[Spec], n_rounds: int, n_threads: int, pid: int,
           tally: Tally, heap: list[float]) -> list[tuple[int, float]]:
    """The leak check: the same requests round after round (thread k sends every n_threads-th request of the
    pool, in order), RSS read when the server is idle after each round, as (requests sent so far, MB).
    Every round repeats the last one's work, so once the allocators have seen it RSS stays put; a leak per
    request or per step adds the same amount each round."""
    shares = [specs[k::n_threads] for k in range(n_threads)]
    samples: list[tuple[int, float]] = []
    for _ in range(n_rounds):
        threads = [threading.Thread(target=_send_all, args=(base, share, tally), daemon=True) for share in shares]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(1.5)  # a client that left: the server notices at its next token, or its next check
        samples.append((tally.n_requests, rss_mb(pid)))
        heap.append(server_metrics(base).get("farctx_heap_in_use_bytes", float("nan")) / 2**20)
    return samples


def _send_all(base: str, share: list[Spec], tally: Tally) -> None:
    for spec in share:
        status, outcome, answer, problem = send(base, spec)
        tally.add(status, outcome, spec, answer, problem)


def round_growth_kb_per_request(samples: list[tuple[int, float]], settle: int = 3) -> float:
    """RSS growth per request over the rounds after the first `settle` (KB per request): the mean of the
    per-round steps without the largest one. A leak adds to every round; the allocators step up now and then
    (and give memory back), so one step is not a trend."""
    later = samples[settle - 1:]
    steps = sorted(1024 * (r1 - r0) / max(1, q1 - q0) for (q0, r0), (q1, r1) in zip(later, later[1:]))[:-1]
    return sum(steps) / len(steps) if steps else 0.0


def start_server(cmd: list[str], log_path: Path, base: str, limit_s: float) -> tuple[subprocess.Popen, bool]:
    """Start `cmd` (a server, its output to log_path) and wait until base/health answers 200: (process, whether
    it came up within limit_s seconds and is still running)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    started = time.monotonic()
    while proc.poll() is None and time.monotonic() - started < limit_s:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return proc, True
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    return proc, False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("-np", "--parallel", type=int, default=4)
    ap.add_argument("--clients", type=int, default=6, help="client threads (more than the slots: a queue)")
    ap.add_argument("--model", default=None, help="GGUF (default: the bundled model)")
    ap.add_argument("--tiny", action="store_true", help="the 2-layer random-weight test model (n_ctx_train 32)")
    ap.add_argument("--deep", action="store_true",
                    help="the 30-layer random-weight test model (the bundled model's depth, n_ctx_train 32)")
    ap.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                    help="the server's --deterministic; without it greedy mismatches are reported, not failed")
    ap.add_argument("--n-ctx-train", type=int, default=0,
                    help="the trained context the methods assume (default: 256; 32 with --tiny)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-t", "--threads", type=int, default=0, help="the server's -t (0: llama.cpp's default)")
    ap.add_argument("-fa", "--flash-attn", dest="flash_attn", choices=["on", "off"], default="off",
                    help="the server's -fa")
    ap.add_argument("--max-kb-per-request", type=float, default=2.0,
                    help="RSS slope after warm-up (KB per request answered) that fails the run")
    ap.add_argument("--rounds", type=int, default=10,
                    help="after the load, rounds of the same requests (each client its share of the pool), RSS at "
                         "idle after each: the leak check")
    ap.add_argument("--max-growth", type=float, default=16.0,
                    help="RSS growth per request (KB; over the rounds after the first 3, the largest step left "
                         "out) that fails the run")
    ap.add_argument("--wrap", default="", help="a command the server runs under, e.g. 'python -m memray run -o "
                                              "server.bin' (a memory profiler; the server's python is run by it)")
    ap.add_argument("--out", default=None, help="summary JSON (default: bench/results/soak/soak-<minutes>min.json)")
    args = ap.parse_args(argv)

    tag = (f"{'tiny-' if args.tiny else 'deep-' if args.deep else ''}{args.minutes:g}min"
           f"{'-fa-on' if args.flash_attn == 'on' else ''}{'' if args.deterministic else '-nondeterministic'}")
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / "soak" / f"soak-{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.tiny or args.deep:
        sys.path.insert(0, str(ROOT / "tests"))
        import tempfile

        import farctx
        from tiny_gguf import DEEP, TinyConfig, write_tiny_gguf

        config = DEEP if args.deep else TinyConfig()
        args.model = str(write_tiny_gguf(Path(tempfile.mkdtemp()) / "random.gguf", farctx.default_model_path(),
                                         config))
    random_model = args.tiny or args.deep
    n_train = args.n_ctx_train or (32 if random_model else 256)
    ubatch = 16 if random_model else 128
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = out.with_suffix(".server.log")
    wrap = shlex.split(args.wrap.replace("python ", sys.executable + " ", 1)) if args.wrap else [sys.executable]
    cmd = [*wrap, "-m", "farctx.cli.main", "serve", "--port", str(port), "--method", "lminf",
           "--n-ctx-train", str(n_train), "-np", str(args.parallel), "-c", str(8 * n_train * args.parallel), "-b", str(4 * ubatch),
           "-ub", str(ubatch), "-fa", args.flash_attn, "--metrics", "-to", "300", "--log-level", "warning"]
    if args.deterministic:
        cmd.append("--deterministic")
    if args.model:
        cmd += ["-m", args.model]
    if args.threads:
        cmd += ["-t", str(args.threads)]
    proc, up = start_server(cmd, log_path, base, 300)
    if not up:
        proc.kill()
        print(log_path.read_text(), file=sys.stderr)
        return 1

    specs = pool(args.seed, n_train)
    # every request of the pool alone first: the reference answers (and the warm-up: each method opened)
    reference: dict[str, str] = {}
    failures: list[str] = []
    reference_statuses: dict[str, int] = {}
    t_ref = time.monotonic()
    for spec in specs:
        status, _, answer, problem = send(base, spec)
        reference_statuses[str(status)] = reference_statuses.get(str(status), 0) + 1
        if problem:
            failures.append(f"{spec.name} (alone): {problem}")
        if spec.greedy and answer is not None:
            reference[spec.name] = answer
    reference_seconds = time.monotonic() - t_ref

    tally = Tally()
    t0 = time.monotonic()
    end = t0 + 60 * args.minutes
    rss: list[tuple[float, int, float]] = [(0.0, 0, rss_mb(proc.pid))]  # (seconds, requests answered, MB)
    stop = threading.Event()

    def client(k: int) -> None:
        rng = random.Random(args.seed * 1000 + k)
        while time.monotonic() < end and not stop.is_set():
            spec = rng.choice(specs)
            status, outcome, answer, problem = send(base, spec)
            tally.add(status, outcome, spec, answer, problem)

    def sampler() -> None:
        while not stop.wait(5):
            try:
                now, mb = time.monotonic() - t0, rss_mb(proc.pid)
            except OSError:
                return
            rss.append((now, tally.n_requests, mb))

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(args.clients)]
    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    load_seconds = time.monotonic() - t0
    alive_after_load = proc.poll() is None

    # the leak check: the same schedule round after round, RSS at idle; judged after the first 3 rounds
    t_rounds = time.monotonic()
    round_heap: list[float] = []
    round_rss = (rounds(base, specs, args.rounds, args.parallel, proc.pid, tally, round_heap)
                 if alive_after_load else [])
    rounds_seconds = time.monotonic() - t_rounds
    growth = round_growth_kb_per_request(round_rss)

    # every greedy answer under load against the same request alone
    mismatches = []
    n_compared = 0
    for name, answers in sorted(tally.answers.items()):
        n_compared += len(answers)
        if answers != {reference.get(name)}:
            mismatches.append({"request": name, "alone": reference.get(name), "under_load": sorted(answers)})
    metrics = server_metrics(base)
    # the server's count of the completion requests, by status, against the clients'
    sent = dict(reference_statuses)
    for status, n in tally.statuses.items():
        sent[status] = sent.get(status, 0) + n
    counted = {name.split('"')[1]: int(v) for name, v in metrics.items() if name.startswith("farctx_requests_total")}
    # a client that leaves after the server wrote its last byte is a 200 to the server, a 499 to itself
    metrics_agree = (sum(counted.values()) == sum(sent.values())
                     and all(counted.get(k, 0) == n for k, n in sent.items() if k not in ("200", "499"))
                     and counted.get("499", 0) <= sent.get("499", 0))
    alive = proc.poll() is None
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()

    # warm-up: the first half of the load, at most 2 minutes (slots fill, each method's graphs are built once)
    warm_start = min(120.0, load_seconds / 2)
    warm = [x for x in rss if x[0] >= warm_start]
    slope = slope_mb_per_min([(t, mb) for t, _, mb in warm])
    per_request = kb_per_request(warm)
    n_5xx = sum(n for status, n in tally.statuses.items() if status.startswith("5"))
    summary = {
        "minutes": args.minutes, "load_seconds": round(load_seconds, 1), "parallel": args.parallel,
        "clients": args.clients,
        "model": "tiny (random weights)" if args.tiny else args.model or "default (SmolLM2-135M-Instruct)",
        "n_ctx_train_assumed": n_train, "server": " ".join(cmd[len(wrap) + 2:]),
        "reference_seconds": round(reference_seconds, 1), "requests": tally.n_requests, "statuses": tally.statuses, "outcomes": tally.outcomes,
        "n_5xx": n_5xx, "failures": failures + tally.failures, "server_alive": alive and alive_after_load,
        "deterministic": args.deterministic,
        "greedy_requests_compared": n_compared, "greedy_mismatches": mismatches,
        "statuses_sent": sent, "statuses_counted_by_server": counted, "metrics_agree": metrics_agree,
        "rss_mb_first": rss[0][2], "rss_mb_last": rss[-1][2],
        "rss_slope_mb_per_min_after_warmup": round(slope, 3),
        "rss_kb_per_request_after_warmup": round(per_request, 3),
        "rss_samples": [(round(t, 1), q, round(r, 1)) for t, q, r in rss],
        "rounds": len(round_rss), "rounds_seconds": round(rounds_seconds, 1),
        "rounds_rss_kb_per_request": round(growth, 2),
        "rounds_rss": [(q, round(r, 1)) for q, r in round_rss],
        "rounds_heap_in_use_mb": [round(h, 2) for h in round_heap],
        "metrics": metrics, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
    }
    ok = (n_5xx == 0 and not failures and not tally.failures and summary["server_alive"]
          and (not mismatches or not args.deterministic) and per_request <= args.max_kb_per_request
          and len(round_rss) == args.rounds and growth <= args.max_growth and metrics_agree)
    summary["passed"] = ok
    out.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k not in ("rss_samples", "metrics")}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
