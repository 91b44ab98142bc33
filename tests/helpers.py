"""Shared test helpers: the command line and the server in a child process, running the engine over a token
stream, and the tolerances of the oracle checks."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import numpy as np


def gpu_layers() -> int:
    """FARCTX_TEST_NGL: layers every farctx.Llama of the tests offloads (`all` or -1: all of them;
    unset or 0: none, the CPU-only default). scripts/gpu-check sets `all`."""
    value = os.environ.get("FARCTX_TEST_NGL", "0").strip().lower()
    return -1 if value in ("all", "-1") else int(value)


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`farctx ARGS` in a child process (the installed command line)."""
    return subprocess.run([sys.executable, "-m", "farctx.cli.main", *args], capture_output=True, text=True,
                          input=stdin, timeout=300)


# ggml type ids of the KV caches under test
F32, F16, Q8_0, BF16 = 0, 1, 8, 30
KV_NAMES = {F32: "f32", F16: "f16", Q8_0: "q8_0", BF16: "bf16"}


@dataclass(frozen=True)
class Tolerance:
    """max |engine - oracle| and mean |engine - oracle|, relative to max |oracle| (abs for F32)."""

    max_abs: float | None = None
    max_rel: float | None = None
    mean_rel: float | None = None

    def check(self, got: np.ndarray, ref: np.ndarray, what: str) -> None:
        diff = np.abs(got - ref)
        scale = float(np.abs(ref).max())
        detail = f"{what}: max diff {diff.max():.3g}, mean {diff.mean():.3g}, logit scale {scale:.3g}"
        print(detail)  # shown with pytest -rP: the measured error of each configuration
        if self.max_abs is not None:
            assert diff.max() <= self.max_abs, detail
        if self.max_rel is not None:
            assert diff.max() <= self.max_rel * scale, detail
        if self.mean_rel is not None:
            assert diff.mean() <= self.mean_rel * scale, detail

    def widened(self, factor: float) -> Tolerance:
        """The same bounds times factor."""
        return Tolerance(*(None if b is None else b * factor for b in (self.max_abs, self.max_rel, self.mean_rel)))


def tolerance(type_k: int, type_v: int, flash_attn: bool) -> Tolerance:
    if Q8_0 in (type_k, type_v):
        # llama.cpp also quantizes the queries to Q8_0 for the K.Q product: measured 2.7% max, 0.2% mean
        return Tolerance(max_rel=6e-2, mean_rel=5e-3)
    if type_k == F32 and type_v == F32 and not flash_attn:
        if gpu_layers():
            # offloaded: CUDA's cuBLAS computes F32 products in TF32 (10-bit mantissa, as F16;
            # ggml-cuda/common.cuh:1535), so the F16 bound applies
            return Tolerance(max_rel=2e-2)
        return Tolerance(max_abs=1e-4)
    if BF16 in (type_k, type_v):
        return Tolerance(max_rel=3e-2)  # 8-bit mantissa: measured 0.9%
    return Tolerance(max_rel=2e-2)


# (type_k, type_v, flash_attn): llama.cpp needs flash attention for a quantized V cache
KV_CONFIGS = [
    (F32, F32, False),
    (F32, F32, True),
    (F16, F16, False),
    (F16, F16, True),
    (Q8_0, F16, False),
    (Q8_0, Q8_0, True),
    (BF16, BF16, False),  # no RoPE kernel for BF16: rotated keys go through an F32 copy
]


def kv_id(config: tuple[int, int, bool]) -> str:
    k, v, fa = config
    return f"k{KV_NAMES[k]}-v{KV_NAMES[v]}-fa{'on' if fa else 'off'}"


def random_tokens(n: int, seed: int = 1, n_vocab: int = 49152) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, n).tolist()


def next_token_logits(model: Path, tokens: list[int], n_fed: int, change=None, **kwargs: object
                      ) -> tuple[np.ndarray, int]:
    """Feed tokens[:n_fed], change the cache with `change(llama_cpp, mem)` (a K-shift it records is applied
    at the start of the next llama_decode), then decode tokens[n_fed] right after the last position in the
    cache. Returns its logits and the position it went to."""
    import ctypes

    import farctx
    import llama_cpp

    kwargs.setdefault("method", "vanilla")  # llama.cpp's own attention unless a test names a method
    llm = farctx.Llama(str(model), **kwargs)
    try:
        llm.eval(tokens[:n_fed])
        mem = llama_cpp.llama_get_memory(llm.ctx)
        if change is not None:
            change(llama_cpp, mem)
        next_token = (ctypes.c_int32 * 1)(tokens[n_fed])
        batch = llama_cpp.llama_batch_get_one(next_token, 1)  # position: after the last one in the cache
        assert llama_cpp.llama_decode(llm.ctx, batch) == 0
        pos = llama_cpp.llama_memory_seq_pos_max(mem, 0)
        logits = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(llm.n_vocab(),)).astype(np.float64).copy(), pos
    finally:
        llm.close()


def engine_logits(model: Path, tokens: list[int], n_prefill: int, *, n_ubatch: int, type_k: int = F32,
                  type_v: int = F32, flash_attn: bool = False, n_ctx: int = 0, stats: dict[str, int] | None = None,
                  **kwargs: object) -> np.ndarray:
    """Logits for every token: the first n_prefill in one eval (split in ubatches), then one token at a time.
    `stats`, if given, receives the session's counters at the end."""
    import farctx

    kwargs.setdefault("method", "vanilla")  # llama.cpp's own attention unless a test names a method
    llm = farctx.Llama(str(model), n_ctx=n_ctx or len(tokens), n_batch=max(n_prefill, 1), n_ubatch=n_ubatch,
                       logits_all=True, type_k=type_k, type_v=type_v, flash_attn=flash_attn, **kwargs)
    try:
        llm.eval(tokens[:n_prefill])
        for token in tokens[n_prefill:]:
            llm.eval([token])
        if stats is not None:
            stats.update(llm.stats())
        return np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()


# -- farctx serve in a child process ------------------------------------------------------------------

SERVE_MESA = {"method": "mesa", "first_chunk": 4, "stair_width": 2, "last_context": 8, "gen_budget": 2}
LONG_TEXT = " ".join(f"word{i % 17}" for i in range(100))  # about 7 x the tiny model's trained context (32)
MID_TEXT = " ".join(f"word{i % 17}" for i in range(30))  # about 2 x (mesa is slow on this model past that)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server(args: list[str], log: Path, base: str, **client: object) -> Iterator[str]:
    """`farctx serve ARGS` in a child until the block ends; yields base once /health answers (client: httpx
    options, e.g. verify for HTTPS)."""
    import time

    import httpx
    import pytest

    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "farctx.cli.main", "serve", *args], stdout=out,
                                stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1, **client).status_code == 200:  # type: ignore[arg-type]
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"server did not start:\n{log.read_text()}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def post(server: str, path: str, body: object, **kw: object) -> "httpx.Response":  # noqa: F821
    import json

    import httpx

    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    kw.setdefault("timeout", 60)
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}  # type: ignore[dict-item]
    return httpx.post(f"{server}{path}", content=content, headers=headers, **kw)  # type: ignore[arg-type]


def server_metrics(server: str, headers: Optional[dict[str, str]] = None) -> dict[str, float]:
    """/metrics as {name{labels}: value}."""
    import httpx

    values = {}
    for line in httpx.get(f"{server}/metrics", headers=headers).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def wait_idle(server: str) -> None:
    import time

    import httpx

    deadline = time.monotonic() + 30
    while httpx.get(f"{server}/health").json()["slots_processing"] and time.monotonic() < deadline:
        time.sleep(0.05)


def ask(client: object, kind: str, prompt: str, max_tokens: int = 8, farctx: dict | None = None) -> str:
    """One greedy request through the openai client: kind is completion, completion-stream, chat or
    chat-stream; the answer's text."""
    extra = {"extra_body": {"farctx": farctx}} if farctx else {}
    c: Any = client
    if kind == "completion":
        return c.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                    **extra).choices[0].text
    if kind == "completion-stream":
        return "".join(x.choices[0].text for x in c.completions.create(
            model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True, **extra))
    messages = [{"role": "user", "content": prompt}]
    if kind == "chat":
        return c.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens, temperature=0,
                                         **extra).choices[0].message.content or ""
    return "".join(x.choices[0].delta.content or "" for x in c.chat.completions.create(
        model="tiny", messages=messages, max_tokens=max_tokens, temperature=0, stream=True, **extra) if x.choices)


def concurrently(fns: list) -> list:
    """Each function in a thread of its own, started together; their results in order."""
    import threading

    results: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, fns[i]())) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return [results.get(i) for i in range(len(fns))]


def check_rewinds(llm: Any, tokens: list[int], ref: np.ndarray, keeps: Sequence[int], what: str) -> None:
    """Rewind a streamed farctx.Llama to each of `keeps` (F32 cache, no flash attention) and read the rest again:
    the logits from there on must be the oracle's `ref`."""
    n = len(tokens)
    for keep in keeps:
        llm.n_tokens = keep
        llm.eval(tokens[keep:])
        got = np.array(llm.scores[:n], dtype=np.float64)
        tolerance(F32, F32, False).check(got[keep:], ref[keep:], f"{what} after a rewind to {keep}")
