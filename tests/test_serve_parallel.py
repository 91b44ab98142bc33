"""farctx serve --parallel N on the tiny model: continuous batching, prompt reuse, /metrics, limits."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import openai
import pytest
from test_serve import LONG, MESA, MID, _free_port, _post, running_server

N = 4
CAP = 40  # -n: the server's cap on max_tokens


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("serve-np") / "server.log"
    # -b 64 with 4 slots: prompt pieces of 16 tokens (one ubatch), so short prompts are read in several steps
    args = ["-m", str(tiny_model), "--method", "lminf", "--port", str(port), "-ub", "16", "-b", "64",
            "--ctx-max", "512", "-np", str(N), "--metrics", "-n", str(CAP), "-a", "tiny", "--log-level", "warning"]
    with running_server(args, log, f"http://127.0.0.1:{port}") as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)


def _metrics(server: str) -> dict[str, float]:
    text = httpx.get(f"{server}/metrics").text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def _wait_idle(server: str) -> None:
    deadline = time.monotonic() + 30
    while httpx.get(f"{server}/health").json()["slots_processing"] and time.monotonic() < deadline:
        time.sleep(0.05)


# requests of every kind: completions and chat, streamed and not, short and past the trained context, another method
def _run(client: openai.OpenAI, kind: str, prompt: str, max_tokens: int = 8, farctx: dict | None = None) -> str:
    extra = {"extra_body": {"farctx": farctx}} if farctx else {}
    if kind == "completion":
        return client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                         **extra).choices[0].text
    if kind == "completion-stream":
        return "".join(c.choices[0].text for c in client.completions.create(
            model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True, **extra))
    messages = [{"role": "user", "content": prompt}]
    if kind == "chat":
        return client.chat.completions.create(model="tiny", messages=messages, max_tokens=max_tokens, temperature=0,
                                              **extra).choices[0].message.content or ""
    return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=max_tokens, temperature=0, stream=True, **extra) if c.choices)


JOBS = [
    ("completion", "The river ran", None),
    ("completion-stream", "In the morning " + MID, None),
    ("chat", "Tell me about " + LONG, None),  # about 6 x the trained context, through lminf
    ("chat-stream", "Hello there", {"method": "window", "n_local": 16}),
    ("completion", MID, MESA),  # a whole-stream method in its slot
    ("completion-stream", "Once upon a time", {"method": "vanilla"}),
]


def _concurrently(fns: list) -> list:
    results: dict[int, object] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, fns[i]())) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return [results.get(i) for i in range(len(fns))]


def test_health_shows_the_slots(server):
    health = httpx.get(f"{server}/health").json()
    assert health["status"] == "ok" and health["slots_idle"] + health["slots_processing"] == N
    meta = httpx.get(f"{server}/v1/models").json()["data"][0]["meta"]
    assert meta["n_parallel"] == N and meta["method"] == "lminf"
    assert meta["params"] == {"n_ctx_train": 32, "n_global": 10, "n_local": 32}


def test_concurrent_greedy_answers_equal_each_alone(client):
    alone = [_run(client, kind, prompt, farctx=farctx) for kind, prompt, farctx in JOBS]
    assert all(alone)
    together = _concurrently([lambda j=j: _run(client, j[0], j[1], farctx=j[2]) for j in JOBS])
    assert together == alone


def test_a_follow_up_turn_reuses_the_prefix(server, client):
    _wait_idle(server)
    messages = [{"role": "system", "content": "You answer. " + MID}, {"role": "user", "content": "First " + MID}]
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    before = _metrics(server)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And then?"}]
    second = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    after = _metrics(server)
    cached = after["farctx_prompt_tokens_cached_total"] - before["farctx_prompt_tokens_cached_total"]
    read = after["farctx_prompt_tokens_total"] - before["farctx_prompt_tokens_total"]
    assert cached + read == second.usage.prompt_tokens
    # the first turn's prompt, cut back to a multiple of the 16-token piece, is not read again
    assert cached >= first.usage.prompt_tokens - 16 > 0
    assert read < second.usage.prompt_tokens - first.usage.prompt_tokens + 16 + 8


def test_metrics_in_prometheus_text_format(server, client):
    _wait_idle(server)
    before = _metrics(server)
    done = client.completions.create(model="tiny", prompt="Count: one two", max_tokens=5, temperature=0)
    bad = _post(server, "/v1/completions", {"prompt": "hi", "max_tokens": "four"})
    assert bad.status_code == 400
    _wait_idle(server)
    text = httpx.get(f"{server}/metrics")
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    for line in text.text.splitlines():  # the exposition format: comments, or name{labels} value
        assert re.fullmatch(r"# (HELP|TYPE) \w+ .+|\w+(\{\w+=\"[^\"]*\"(,\w+=\"[^\"]*\")*\})? [0-9.e+-]+", line), line
    after = _metrics(server)
    assert after['farctx_requests_total{status="200"}'] == before['farctx_requests_total{status="200"}'] + 1
    assert after["farctx_generated_tokens_total"] - before["farctx_generated_tokens_total"] == \
        done.usage.completion_tokens
    assert after["farctx_prompt_tokens_total"] + after["farctx_prompt_tokens_cached_total"] - \
        before["farctx_prompt_tokens_total"] - before["farctx_prompt_tokens_cached_total"] == done.usage.prompt_tokens
    assert after["farctx_slots"] == N and after["farctx_slots_busy"] == 0 and after["farctx_requests_waiting"] == 0
    cells = [after[f'farctx_kv_cells_used{{slot="{i}"}}'] for i in range(N)]
    assert max(cells) > 0
    assert "# TYPE farctx_requests_total counter" in text.text and "# TYPE farctx_kv_cells_used gauge" in text.text


def test_max_tokens_is_capped_by_n_predict(client):
    done = client.completions.create(model="tiny", prompt="Once", max_tokens=CAP * 10, temperature=0,
                                     extra_body={"logit_bias": {"2": -100, "0": -100}})
    assert done.usage.completion_tokens <= CAP
    assert done.choices[0].finish_reason == "stop" or done.usage.completion_tokens == CAP
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], temperature=0)
    assert chat.usage.completion_tokens <= CAP


def test_a_whole_stream_request_past_the_slot_gets_the_sizes(server):
    response = _post(server, "/v1/completions", {"prompt": LONG * 3, "max_tokens": 4, "farctx": MESA})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == 512
    assert error["n_prompt_tokens"] > 512 and "--ctx-max" in error["message"]
    vanilla = _post(server, "/v1/completions", {"prompt": LONG * 3, "max_tokens": 4, "farctx": {"method": "vanilla"}})
    assert vanilla.status_code == 400 and vanilla.json()["error"]["n_ctx"] == 512


def test_a_client_leaving_mid_stream_leaves_the_others_alone(server, client):
    others = [("completion-stream", "The river ran", None), ("chat", "Hello " + MID, None)]
    alone = [_run(client, kind, prompt, farctx=farctx) for kind, prompt, farctx in others]

    def leave() -> int:
        with httpx.stream("POST", f"{server}/v1/completions", timeout=60,
                          json={"prompt": "A long story:", "max_tokens": 100000, "temperature": 0, "stream": True}) as r:
            lines = r.iter_lines()
            return len([next(lines) for _ in range(6)])

    together = _concurrently([leave] + [lambda j=j: _run(client, j[0], j[1], farctx=j[2]) for j in others])
    assert together[0] == 6 and together[1:] == alone
    _wait_idle(server)
    assert httpx.get(f"{server}/health").json()["slots_processing"] == 0
    assert _run(client, others[0][0], others[0][1]) == alone[0]


def test_timeout_cancels_one_request_and_the_others_finish(tiny_model, tmp_path):
    port = _free_port()
    args = ["-m", str(tiny_model), "--method", "lminf", "--port", str(port), "-ub", "16", "-np", "3", "-to", "1.5",
            "--log-level", "warning"]
    with running_server(args, tmp_path / "server.log", f"http://127.0.0.1:{port}") as base:
        quick = {"prompt": "The river ran", "max_tokens": 4, "temperature": 0}
        endless = {"prompt": "A long story:", "max_tokens": 10**6, "temperature": 0,
                   "logit_bias": {"2": -100, "0": -100}}  # no end of text

        def stream_endless() -> list[str]:
            with httpx.stream("POST", f"{base}/v1/completions", json={**endless, "stream": True}, timeout=60) as r:
                return [line for line in r.iter_lines() if line.startswith("data: ")]

        results = _concurrently([lambda: _post(base, "/v1/completions", endless), stream_endless,
                                 lambda: _post(base, "/v1/completions", quick)])
        whole, streamed, short = results
        assert whole.status_code == 408 and whole.json()["error"]["type"] == "timeout_error"
        last = json.loads(streamed[-1][len("data: "):])
        assert last["error"]["code"] == 408 and len(streamed) > 2
        assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] >= 1
        assert httpx.get(f"{base}/health").json()["slots_processing"] == 0


def test_health_stays_open_with_a_key_and_metrics_needs_the_flag(tiny_model, tmp_path):
    port = _free_port()
    args = ["-m", str(tiny_model), "--port", str(port), "-np", "2", "--api-key", "k", "--log-level", "warning"]
    with running_server(args, tmp_path / "server.log", f"http://127.0.0.1:{port}") as base:
        assert httpx.get(f"{base}/health").json()["slots_idle"] == 2
        assert httpx.get(f"{base}/metrics").status_code == 401
        assert httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer k"}).status_code == 501


def test_limits_without_parallel(tiny_model, tmp_path):
    """-n in the one-at-a-time server caps max_tokens. (Its -to covers the queue and the prefill only: a
    generation running past it is not cut there; `--parallel` cuts it, test_timeout_cancels_one_request.)"""
    port = _free_port()
    args = ["-m", str(tiny_model), "--method", "lminf", "-ub", "16", "--log-level", "warning", "--port", str(port),
            "-n", "5"]
    with running_server(args, tmp_path / "capped.log", f"http://127.0.0.1:{port}") as base:
        capped = _post(base, "/v1/completions", {"prompt": "Once", "max_tokens": 50, "temperature": 0,
                                                 "logit_bias": {"2": -100, "0": -100}})
        assert capped.status_code == 200 and capped.json()["usage"]["completion_tokens"] == 5


def test_metrics_needs_parallel(tiny_model):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "farctx.cli.main", "serve", "-m", str(tiny_model), "--metrics"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--parallel" in run.stderr


@pytest.mark.parametrize("method,extra", [
    ("lminf", []), ("streaming", []),
    ("mesa", ["--first-chunk", "4", "--stair-width", "2", "--last-context", "8", "--gen-budget", "2"])])
def test_slots_at_the_default_models_depth_with_flash_attention(deep_model, tmp_path, method, extra):
    """`farctx serve --method M -np 2 -fa on` on a model as deep as the bundled one (30 layers): the graphs of two
    streams per layer fit their budget (a 2-layer model hid an abort at the first request), and two concurrent
    requests, one far past the trained context, get the answers each gets alone."""
    port = _free_port()
    args = ["-m", str(deep_model), "--method", method, "--port", str(port), "-ub", "16", "-b", "64", "-np", "2",
            "-fa", "on", "--ctx-max", "512", "-n", "8", "-a", "tiny", "--log-level", "warning", *extra]
    with running_server(args, tmp_path / "server.log", f"http://127.0.0.1:{port}") as base:
        deep = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        jobs = [("completion", "The river ran", None), ("completion-stream", "Tell me about " + LONG, None)]
        alone = [_run(deep, kind, prompt, farctx=farctx) for kind, prompt, farctx in jobs]
        together = _concurrently([lambda j=j: _run(deep, j[0], j[1], farctx=j[2]) for j in jobs])
        assert together == alone and all(isinstance(a, str) for a in alone)
        assert httpx.get(f"{base}/health").json()["status"] == "ok"
