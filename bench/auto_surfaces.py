"""A document of twice the default model's trained context, read with no method flag on each surface.

One prompt of the needle-in-a-haystack protocol (docs/evaluation.md: RULER's word-value needle in Emma, on its own
line, the model's chat template; 16k tokens, the needle at 25% depth, about 12,000 tokens back from the question) goes
to `farctx generate -f`, to `farctx.Llama(n_ctx=32768)` and to `farctx serve -c 32768` through the OpenAI SDK, none
of them given a method: each answers through auto (stock inside 8192 tokens, dca past it), and each answer is
recorded beside the key. Writes bench/results/auto/surfaces-SmolLM2-135M-Instruct.md (about 15 minutes on 2 cores).

    .venv/bin/python bench/auto_surfaces.py [--length 16384] [--depth 0.25] [--seed 3]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import farctx
from farctx.eval.data import long_text
from farctx.eval.niah import Protocol, Sampler, chat_formatter, haystack_paragraphs, parse_answer

ROOT = Path(__file__).resolve().parents[1]
FARCTX = [sys.executable, "-m", "farctx.cli.main"]
N_PREDICT = 8


def sample(length: int, depth: float, seed: int) -> tuple[str, int]:
    """The prompt (chat markup included, the answer's cue at its end) and its key."""
    vocab = farctx.Llama(None, vocab_only=True)
    protocol = Protocol(kind="word-value", haystack="austen:emma", placement="line", digits=5, question="cue",
                        chat=True)
    text, _ = long_text(protocol.haystack)
    count = lambda t: len(vocab.tokenize(t.encode("utf-8"), special=True))  # noqa: E731
    s = Sampler(protocol, haystack_paragraphs(text), count, seed, chat_formatter(vocab)).sample(length, depth, 0)
    return s.text, s.key


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def via_generate(path: Path) -> tuple[str, str]:
    run = subprocess.run([*FARCTX, "generate", "-f", str(path), "-n", str(N_PREDICT), "--temp", "0", "-t", "2",
                          "-fa", "on"], capture_output=True, text=True, check=True)
    said = next(line for line in run.stderr.splitlines() if line.startswith("farctx: auto"))
    return run.stdout.rstrip("\n"), "farctx generate: " + said.removeprefix("farctx: ")


def via_llama(prompt: str) -> tuple[str, str]:
    llm = farctx.Llama(n_ctx=32768, n_threads=2, n_threads_batch=2, flash_attn=True)
    try:
        out = llm.create_completion(prompt, max_tokens=N_PREDICT, temperature=0)
        return out["choices"][0]["text"], f"farctx.Llama(n_ctx=32768): {llm.method_params.describe()}"
    finally:
        llm.close()


def via_server(prompt: str) -> tuple[str, str]:
    import httpx
    import openai

    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        server = subprocess.Popen([*FARCTX, "serve", "-c", "32768", "-t", "2", "-fa", "on", "--port", str(port), "--log-level",
                                   "warning"], stdout=log, stderr=subprocess.STDOUT)
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            meta = httpx.get(f"{base}/v1/models").json()["data"][0]["meta"]
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=3600)
            out = client.completions.create(model="any", prompt=prompt, max_tokens=N_PREDICT, temperature=0)
            return out.choices[0].text, f"farctx serve -c 32768: {meta['method_summary']}, {meta['n_ctx']} cells"
        finally:
            server.terminate()
            server.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=16384)
    ap.add_argument("--depth", type=float, default=0.25)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench/results/auto/surfaces-SmolLM2-135M-Instruct.md"))
    args = ap.parse_args()
    prompt, key = sample(args.length, args.depth, args.seed)
    n_prompt = len(farctx.Llama(None, vocab_only=True).tokenize(prompt.encode("utf-8"), special=True))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        doc = Path(tmp) / "document.txt"
        doc.write_text(prompt)
        for name, run in (("farctx generate -f", lambda: via_generate(doc)), ("farctx.Llama", lambda: via_llama(prompt)),
                          ("farctx serve + OpenAI SDK", lambda: via_server(prompt))):
            started = time.monotonic()
            answer, said = run()
            seconds = time.monotonic() - started
            right = parse_answer(answer) == key
            print(f"{name}: {'right' if right else 'wrong'} {answer!r} (key {key}, {seconds:.0f} s)", file=sys.stderr)
            rows.append(f"| {name} | {said} | {answer!r} | {'right' if right else 'wrong'} | {seconds:.0f} |")
    lines = [
        f"$ .venv/bin/python bench/auto_surfaces.py --length {args.length} --depth {args.depth} --seed {args.seed}",
        "",
        f"One prompt of {n_prompt} tokens (SmolLM2-135M-Instruct, trained context 8192): RULER's word-value needle "
        f"in Emma at {args.depth:.0%} depth, key {key}, the model's chat template; greedy, {N_PREDICT} tokens; no "
        "method flag on any surface (flash attention on, as the needle grid).",
        "",
        "| surface | what it said it runs | answer | | seconds |",
        "|---|---|---|---|---:|",
        *rows,
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
