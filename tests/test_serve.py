"""farctx serve on the tiny model, through the official openai client and plain HTTP on loopback."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

MESA = {"method": "mesa", "first_chunk": 4, "stair_width": 2, "last_context": 8, "gen_budget": 2}
LONG = " ".join(f"word{i % 17}" for i in range(100))  # about 7 x the tiny model's trained context (32)
MID = " ".join(f"word{i % 17}" for i in range(30))  # about 2 x (mesa is slow on this model past that)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server(args: list[str], log: Path, base: str, **client: Any) -> Iterator[str]:
    """`farctx serve ARGS` in a child until the block ends; yields base once /health answers (client: httpx
    options, e.g. verify for HTTPS)."""
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "farctx.cli.main", "serve", *args], stdout=out,
                                stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    try:
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1, **client).status_code == 200:
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


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "server.log"
    args = ["-m", str(tiny_model), "--method", "lminf", "--port", str(port), "-ub", "16", "--ctx-max", "512",
            "-a", "tiny", "--log-level", "warning"]
    with running_server(args, log, f"http://127.0.0.1:{port}") as base:
        yield base


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)


def _post(server: str, path: str, body: object, **kw: object) -> httpx.Response:
    content = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(f"{server}{path}", content=content, headers={"Content-Type": "application/json"},
                      timeout=60, **kw)


def test_health_and_models_show_the_method(server, client):
    assert httpx.get(f"{server}/health").json() == {"status": "ok"}
    models = httpx.get(f"{server}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["tiny"]
    meta = models[0]["meta"]
    assert meta["method"] == "lminf" and meta["n_ctx_train"] == 32
    assert meta["params"] == {"n_ctx_train": 32, "n_global": 10, "n_local": 32}
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_completion_streaming_and_not_agree(client):
    whole = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 6
    pieces = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0,
                                       stream=True)
    assert "".join(c.choices[0].text for c in pieces) == whole.choices[0].text


def test_chat_completion_streaming_and_not_agree(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    assert whole.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == 6


def test_long_prompt_streams_through_lminf_with_progress(client):
    whole = client.completions.create(model="tiny", prompt=LONG, max_tokens=4, temperature=0)
    n_prompt = whole.usage.prompt_tokens
    assert n_prompt > 5 * 32
    chunks = list(client.completions.create(model="tiny", prompt=LONG + " again", max_tokens=4, temperature=0,
                                            stream=True, extra_body={"return_progress": True}))
    progress = [c.model_extra["prompt_progress"] for c in chunks if "prompt_progress" in (c.model_extra or {})]
    assert progress, "no prompt_progress chunk"
    assert set(progress[0]) == {"total", "cache", "processed", "time_ms"}
    assert progress[-1]["processed"] == progress[-1]["total"] > n_prompt
    assert [p["processed"] for p in progress] == sorted(p["processed"] for p in progress)
    assert "".join(c.choices[0].text for c in chunks if "prompt_progress" not in (c.model_extra or {}))


def test_mesa_request_gets_a_cache_sized_to_its_prompt(server, client):
    done = client.completions.create(model="tiny", prompt=MID, max_tokens=4, temperature=0,
                                     extra_body={"farctx": MESA})
    assert done.usage.prompt_tokens > 2 * 32 and done.usage.completion_tokens == 4
    too_long = _post(server, "/v1/completions", {"prompt": LONG * 3, "max_tokens": 4, "farctx": MESA})
    assert too_long.status_code == 400
    error = too_long.json()["error"]
    assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == 512
    assert error["n_prompt_tokens"] > 512 and "--ctx-max" in error["message"]
    # the server's own method is back for the next request
    assert httpx.get(f"{server}/v1/models").json()["data"][0]["meta"]["method"] == "lminf"


def test_vanilla_past_its_cache_is_llama_server_error(server):
    response = _post(server, "/v1/completions", {"prompt": LONG * 3, "max_tokens": 4, "farctx": {"method": "vanilla"}})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == 400 and error["type"] == "exceed_context_size_error"
    assert error["n_prompt_tokens"] > error["n_ctx"] == 256  # n_ctx_train 32, rounded up by llama.cpp
    with pytest.raises(openai.BadRequestError, match="exceeds the available context size"):
        openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": LONG * 3}], max_tokens=4,
            stream=True, extra_body={"farctx": {"method": "vanilla"}})


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("/v1/completions", '{"prompt": "hi", "max_tokens": 4', "invalid JSON"),
        ("/v1/completions", '["hi"]', "JSON object"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "colour": "blue"}, "colour: Extra inputs"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "four"}, "max_tokens: Input should be a valid integer"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 10**12}, "max_tokens: Input should be less than"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, "max_tokens: Input should be greater than"),
        ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 4}, "one prompt per request"),
        ("/v1/chat/completions", {"messages": [], "max_tokens": 4}, "at least one message"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 2}, "n: Input should be"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "farctx": {"method": "magic"}},
         "farctx.method"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "farctx": {"n_locl": 3}},
         "farctx.n_locl: Extra inputs"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                  "farctx": {"method": "mesa", "first_chunk": 100}}, "first_chunk (100)"),
    ],
)
def test_bad_requests_get_a_400_with_a_message(server, path, body, message):
    response = _post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and message in error["message"], error


def test_concurrent_streams_equal_sequential(client):
    prompts = ["The river ran", "In the morning " + MID]

    def run(prompt: str) -> str:
        chunks = client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0, stream=True)
        return "".join(c.choices[0].text for c in chunks)

    sequential = [run(p) for p in prompts]
    results: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, run(prompts[i]))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [results.get(0), results.get(1)] == sequential


def test_client_leaving_mid_stream_leaves_the_server_healthy(server, client):
    expected = client.completions.create(model="tiny", prompt="A long story:", max_tokens=5, temperature=0)
    with httpx.stream("POST", f"{server}/v1/completions", timeout=60,
                      json={"prompt": "A long story:", "max_tokens": 100000, "temperature": 0, "stream": True}) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
    assert any(line.startswith("data: ") for line in got)
    assert httpx.get(f"{server}/health").status_code == 200
    again = client.completions.create(model="tiny", prompt="A long story:", max_tokens=5, temperature=0)
    assert again.choices[0].text == expected.choices[0].text


def test_api_key_required(tiny_model, tmp_path):
    """--api-key / --api-key-file: 401 without a valid `Authorization: Bearer` key, /health stays open."""
    port = _free_port()
    keys = tmp_path / "keys.txt"
    keys.write_text("second-key\n\n")
    args = ["-m", str(tiny_model), "--port", str(port), "--api-key", "first-key", "--api-key-file", str(keys),
            "--log-level", "warning"]
    log = tmp_path / "server.log"
    with running_server(args, log, f"http://127.0.0.1:{port}") as base:  # /health answered without a key
        assert httpx.get(f"{base}/v1/models").status_code == 401
        bad = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer wrong"})
        assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
        for key in ("first-key", "second-key"):
            assert httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        done = httpx.post(f"{base}/v1/completions", json={"prompt": "Hi", "max_tokens": 2},
                          headers={"Authorization": "Bearer first-key"}, timeout=60)
        assert done.status_code == 200
        assert "(API key required)" in log.read_text()


def test_warning_on_an_open_address_without_a_key():
    from farctx.server import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")


def test_https_with_a_key_and_certificate(tiny_model, tmp_path):
    """--ssl-key-file / --ssl-cert-file serve HTTPS (a self-signed test certificate for 127.0.0.1,
    tests/data); one without the other is refused."""
    data = Path(__file__).parent / "data"
    key, cert = data / "tls-test-key.pem", data / "tls-test-cert.pem"
    trust = ssl.create_default_context(cafile=str(cert))
    half = subprocess.run([sys.executable, "-m", "farctx.cli.main", "serve", "-m", str(tiny_model),
                           "--ssl-key-file", str(key)], capture_output=True, text=True, timeout=120)
    assert half.returncode == 2 and "give both or neither" in half.stderr
    port = _free_port()
    args = ["-m", str(tiny_model), "--port", str(port), "--ssl-key-file", str(key), "--ssl-cert-file", str(cert),
            "--log-level", "warning"]
    with running_server(args, tmp_path / "server.log", f"https://127.0.0.1:{port}", verify=trust) as base:
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        done = httpx.post(f"{base}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, verify=trust, timeout=60)
        assert done.status_code == 200
