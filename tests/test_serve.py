"""farctx serve on the tiny model, at -np 1 and -np 4 (one loop over N slots), through the official openai
client and plain HTTP on loopback: every kind of request, errors, limits, prompt reuse, /metrics, keys, HTTPS."""

from __future__ import annotations

import json
import re
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from helpers import LONG_TEXT as LONG
from helpers import MID_TEXT as MID
from helpers import SERVE_MESA as MESA
from helpers import ask, concurrently, free_port, post, running_server, server_metrics, wait_idle

CAP = 40  # -n: the server's cap on max_tokens
SLOT = 512  # cells per slot (-c is SLOT x np)
N_BATCH, N_UBATCH = 64, 16


@pytest.fixture(scope="module", params=[1, 4], ids=lambda n: f"np{n}")
def served(request, tiny_model, tmp_path_factory):
    n = request.param
    port = free_port()
    log = tmp_path_factory.mktemp(f"serve-np{n}") / "server.log"
    # -b 64: prompt pieces of 64 / np tokens (whole ubatches), so prompts are read in several steps
    args = ["-m", str(tiny_model), "--method", "lminf", "--port", str(port), "-ub", str(N_UBATCH), "-b", str(N_BATCH),
            "-c", str(SLOT * n), "-np", str(n), "--metrics", "-n", str(CAP), "-a", "tiny", "--log-level", "warning"]
    with running_server(args, log, f"http://127.0.0.1:{port}") as base:
        yield base, n


@pytest.fixture(scope="module")
def server(served):
    return served[0]


@pytest.fixture(scope="module")
def n_slots(served):
    return served[1]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)


# requests of every kind: completions and chat, streamed and not, short and past the trained context, another method
JOBS = [
    ("completion", "The river ran", None),
    ("completion-stream", "In the morning " + MID, None),
    ("chat", "Tell me about " + LONG, None),  # about 6 x the trained context, through lminf
    ("chat-stream", "Hello there", {"method": "window", "n_local": 16}),
    ("completion", MID, MESA),  # a whole-stream method in its slot
    ("completion-stream", "Once upon a time", {"method": "vanilla"}),
    ("chat", "Summarise: " + MID, {"method": "dca", "chunk_size": 12, "local_window": 4}),  # several chunks
]


def test_health_and_models_show_the_slots_and_the_method(server, client, n_slots):
    health = httpx.get(f"{server}/health").json()
    assert health["status"] == "ok" and health["slots_idle"] + health["slots_processing"] == n_slots
    models = httpx.get(f"{server}/v1/models").json()["data"]
    assert [m["id"] for m in models] == ["tiny"]
    meta = models[0]["meta"]
    assert meta["method"] == "lminf" and meta["n_ctx_train"] == 32 and meta["n_parallel"] == n_slots
    assert meta["n_ctx"] == SLOT
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


def test_requests_past_the_slot_get_the_sizes(server, client):
    done = client.completions.create(model="tiny", prompt=MID, max_tokens=4, temperature=0,
                                     extra_body={"farctx": MESA})
    assert done.usage.prompt_tokens > 2 * 32 and done.usage.completion_tokens == 4
    too_long = post(server, "/v1/completions", {"prompt": LONG * 3, "max_tokens": 4, "farctx": MESA})
    assert too_long.status_code == 400
    error = too_long.json()["error"]
    assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == SLOT
    assert error["n_prompt_tokens"] > SLOT and "-c" in error["message"]
    vanilla = post(server, "/v1/completions", {"prompt": LONG * 3, "max_tokens": 4, "farctx": {"method": "vanilla"}})
    assert vanilla.status_code == 400
    error = vanilla.json()["error"]
    assert error["code"] == 400 and error["type"] == "exceed_context_size_error"
    assert error["n_prompt_tokens"] > error["n_ctx"] == SLOT
    with pytest.raises(openai.BadRequestError, match="exceeds the available context size"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": LONG * 3}], max_tokens=4,
                                       stream=True, extra_body={"farctx": {"method": "vanilla"}})
    # the server's own method is back for the next request
    assert httpx.get(f"{server}/v1/models").json()["data"][0]["meta"]["method"] == "lminf"


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
        ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "farctx": {"method": "lminf", "n_local": 4096}},
         "per slot"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "farctx": {"n_local": -5}},
         "farctx.n_local: Input should be greater than or equal to 0"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}], "max_tokens": 4},
         "chat template cannot render them (TypeError"),
        ("/v1/completions", b'{"prompt": "caf\xe9 \xff", "max_tokens": 4}', "not valid UTF-8"),
        ("/v1/completions", {"prompt": "lone \ud800 surrogate", "max_tokens": 4}, "surrogate"),
        ("/v1/completions", {}, "the prompt is empty"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "grammar": "x"}, "GBNF parser refused it"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "grammar": "root ::= [a-"},
         "GBNF parser refused it"),
        ("/v1/completions", {"prompt": "hi", "farctx": {"method": "mesa", "first_chunk": 2**40}},
         "first_chunk must fit in 32 bits"),
        ("/v1/completions", {"prompt": "", "max_tokens": 4, "stream": True}, "the prompt is empty"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "lone \udfff"}], "max_tokens": 4},
         "surrogate"),
    ],
)
def test_bad_requests_get_a_400_with_a_message(server, path, body, message):
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and message in error["message"], error


def test_concurrent_greedy_answers_equal_each_alone(client):
    alone = [ask(client, kind, prompt, farctx=farctx) for kind, prompt, farctx in JOBS]
    assert all(alone)
    together = concurrently([lambda j=j: ask(client, j[0], j[1], farctx=j[2]) for j in JOBS])
    assert together == alone


def test_a_follow_up_turn_reuses_the_prefix(server, client, n_slots):
    wait_idle(server)
    piece = N_BATCH // n_slots // N_UBATCH * N_UBATCH  # the scheduler's prompt piece
    messages = [{"role": "system", "content": "You answer. " + MID}, {"role": "user", "content": "First " + MID}]
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    before = server_metrics(server)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And then?"}]
    second = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0)
    after = server_metrics(server)
    cached = after["farctx_prompt_tokens_cached_total"] - before["farctx_prompt_tokens_cached_total"]
    read = after["farctx_prompt_tokens_total"] - before["farctx_prompt_tokens_total"]
    assert cached + read == second.usage.prompt_tokens
    # the first turn's prompt, cut back to a multiple of the prompt piece, is not read again
    assert cached >= first.usage.prompt_tokens - piece > 0
    assert read < second.usage.prompt_tokens - first.usage.prompt_tokens + piece + 8


def test_metrics_in_prometheus_text_format(server, client, n_slots):
    wait_idle(server)
    before = server_metrics(server)
    done = client.completions.create(model="tiny", prompt="Count: one two", max_tokens=5, temperature=0)
    bad = post(server, "/v1/completions", {"prompt": "hi", "max_tokens": "four"})
    assert bad.status_code == 400
    wait_idle(server)
    text = httpx.get(f"{server}/metrics")
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/plain")
    for line in text.text.splitlines():  # the exposition format: comments, or name{labels} value
        assert re.fullmatch(r"# (HELP|TYPE) \w+ .+|\w+(\{\w+=\"[^\"]*\"(,\w+=\"[^\"]*\")*\})? [0-9.e+-]+", line), line
    after = server_metrics(server)
    assert after['farctx_requests_total{status="200"}'] == before['farctx_requests_total{status="200"}'] + 1
    assert after["farctx_generated_tokens_total"] - before["farctx_generated_tokens_total"] == \
        done.usage.completion_tokens
    assert after["farctx_prompt_tokens_total"] + after["farctx_prompt_tokens_cached_total"] - \
        before["farctx_prompt_tokens_total"] - before["farctx_prompt_tokens_cached_total"] == done.usage.prompt_tokens
    assert after["farctx_slots"] == n_slots and after["farctx_slots_busy"] == 0
    assert after["farctx_requests_waiting"] == 0
    cells = [after[f'farctx_kv_cells_used{{slot="{i}"}}'] for i in range(n_slots)]
    assert max(cells) > 0
    assert "# TYPE farctx_requests_total counter" in text.text and "# TYPE farctx_kv_cells_used gauge" in text.text


def test_null_means_the_default(server):
    """OpenAI's clients send null for a field they do not set: the field's default applies."""
    body = {"prompt": "The river ran", "max_tokens": 4, "temperature": 0}
    plain = post(server, "/v1/completions", body)
    nulls = post(server, "/v1/completions", {**body, "presence_penalty": None, "frequency_penalty": None, "n": None,
                                              "best_of": None, "seed": None, "stop": None, "logit_bias": None})
    assert plain.status_code == nulls.status_code == 200, nulls.text
    assert nulls.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]


def test_hostile_inputs_are_answered_and_the_others_served(server, client):
    """A body of megabytes (a prompt of a million tokens), a thousand stop strings, and a client that opens a
    stream and never reads it: each is answered cleanly while the other requests get their answers alone."""
    others = [("completion", "The river ran", None), ("chat-stream", "Hello there", None)]
    alone = [ask(client, kind, prompt, farctx=farctx) for kind, prompt, farctx in others]

    def huge() -> tuple[int, dict]:  # about 4 MB of JSON: a million tokens, past any cache of a whole-stream method
        r = post(server, "/v1/completions", {"prompt": "word " * 1_000_000, "max_tokens": 4,
                                              "farctx": {"method": "vanilla"}}, timeout=300)
        return r.status_code, r.json()["error"]

    def stops() -> int:
        r = post(server, "/v1/completions", {"prompt": "The river ran", "max_tokens": 8, "temperature": 0,
                                              "stop": [f"never-{i}" for i in range(1000)]})
        return r.status_code

    def unread() -> int:  # the response's head, then nothing read until the others are done
        with httpx.stream("POST", f"{server}/v1/completions", timeout=60,
                          json={"prompt": "A long story:", "max_tokens": 100000, "stream": True}) as r:
            status = r.status_code
            time.sleep(3)
            return status

    together = concurrently([huge, stops, unread] + [lambda j=j: ask(client, j[0], j[1], farctx=j[2]) for j in others])
    status, error = together[0]
    assert status == 400 and error["type"] == "exceed_context_size_error" and error["n_prompt_tokens"] >= 10**6
    assert together[1] == 200 and together[2] == 200
    assert together[3:] == alone
    wait_idle(server)
    assert ask(client, others[0][0], others[0][1]) == alone[0]


def test_max_tokens_is_capped_by_n_predict(client):
    done = client.completions.create(model="tiny", prompt="Once", max_tokens=CAP * 10, temperature=0,
                                     extra_body={"logit_bias": {"2": -100, "0": -100}})
    assert done.usage.completion_tokens <= CAP
    assert done.choices[0].finish_reason == "stop" or done.usage.completion_tokens == CAP
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], temperature=0)
    assert chat.usage.completion_tokens <= CAP


def test_a_client_leaving_mid_stream_leaves_the_others_alone(server, client):
    others = [("completion-stream", "The river ran", None), ("chat", "Hello " + MID, None)]
    alone = [ask(client, kind, prompt, farctx=farctx) for kind, prompt, farctx in others]

    def leave() -> int:
        with httpx.stream("POST", f"{server}/v1/completions", timeout=60,
                          json={"prompt": "A long story:", "max_tokens": 100000, "temperature": 0, "stream": True}) as r:
            lines = r.iter_lines()
            return len([next(lines) for _ in range(6)])

    together = concurrently([leave] + [lambda j=j: ask(client, j[0], j[1], farctx=j[2]) for j in others])
    assert together[0] == 6 and together[1:] == alone
    wait_idle(server)
    assert httpx.get(f"{server}/health").json()["slots_processing"] == 0
    assert ask(client, others[0][0], others[0][1]) == alone[0]


# -- servers of their own -------------------------------------------------------------------------------


@pytest.mark.parametrize("n_slots", [1, 3])
def test_timeout_cancels_a_request_and_the_others_finish(tiny_model, tmp_path, n_slots):
    port = free_port()
    args = ["-m", str(tiny_model), "--method", "lminf", "--port", str(port), "-ub", "16", "-np", str(n_slots),
            "-to", "1.5", "--log-level", "warning"]
    with running_server(args, tmp_path / "server.log", f"http://127.0.0.1:{port}") as base:
        quick = {"prompt": "The river ran", "max_tokens": 4, "temperature": 0}
        endless = {"prompt": "A long story:", "max_tokens": 10**6, "temperature": 0,
                   "logit_bias": {"2": -100, "0": -100}}  # no end of text

        def stream_endless() -> list[str]:
            with httpx.stream("POST", f"{base}/v1/completions", json={**endless, "stream": True}, timeout=60) as r:
                return [line for line in r.iter_lines() if line.startswith("data: ")]

        if n_slots == 1:  # one after the other: each past the timeout is cut there, the slot serves the next
            whole, streamed = post(base, "/v1/completions", endless), stream_endless()
            short = post(base, "/v1/completions", quick)
        else:
            whole, streamed, short = concurrently([lambda: post(base, "/v1/completions", endless), stream_endless,
                                                   lambda: post(base, "/v1/completions", quick)])
        assert whole.status_code == 408 and whole.json()["error"]["type"] == "timeout_error"
        last = json.loads(streamed[-1][len("data: "):])
        assert last["error"]["code"] == 408 and len(streamed) > 2
        assert short.status_code == 200 and short.json()["usage"]["completion_tokens"] >= 1
        assert httpx.get(f"{base}/health").json()["slots_processing"] == 0


def test_metrics_count_every_request_and_a_client_that_gives_up_frees_its_slot(tiny_model, tmp_path):
    """/metrics counts each completion request once by its status, refusals before the server takes it included
    (401, a body that fails validation); a client that stops waiting for a non-streamed answer cancels it (499)
    and its slot serves the next request; the process's memory is reported."""
    port = free_port()
    args = ["-m", str(tiny_model), "--method", "lminf", "--port", str(port), "-ub", "16", "--api-key", "k",
            "--metrics", "--log-level", "warning"]
    key = {"Authorization": "Bearer k"}
    with running_server(args, tmp_path / "server.log", f"http://127.0.0.1:{port}", headers=key) as base:
        assert post(base, "/v1/completions", {"prompt": "hi"}, headers={}).status_code == 401
        assert post(base, "/v1/completions", {"prompt": "hi", "max_tokens": "x"}, headers=key).status_code == 400
        assert post(base, "/v1/chat/completions", {"messages": []}, headers=key).status_code == 400
        endless = {"prompt": "A long story:", "max_tokens": 10**6, "temperature": 0,
                   "logit_bias": {"2": -100, "0": -100}}  # no end of text
        with pytest.raises(httpx.ReadTimeout):
            post(base, "/v1/completions", endless, headers=key, timeout=1.5)
        deadline = time.monotonic() + 10
        while httpx.get(f"{base}/health").json()["slots_processing"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert httpx.get(f"{base}/health").json()["slots_processing"] == 0, "the left request still runs"
        quick = post(base, "/v1/completions", {"prompt": "The river ran", "max_tokens": 4}, headers=key)
        assert quick.status_code == 200
        metrics = server_metrics(base, headers=key)
        counted = {k.split('"')[1]: v for k, v in metrics.items() if k.startswith("farctx_requests_total")}
        assert counted == {"200": 1, "400": 2, "401": 1, "499": 1}, counted
        assert metrics["process_resident_memory_bytes"] > 10 * 2**20
        assert metrics["farctx_heap_in_use_bytes"] > 2**20 and metrics["farctx_heap_arena_bytes"] > 2**20


def test_deterministic_answers_alone_and_beside_others_with_flash_attention(tiny_model, tmp_path):
    """--deterministic: batch-invariant kernels (the logits' proof is tests/test_depth.py); the greedy answers of
    every kind of request are the same alone and four at once, with flash attention on."""
    port = free_port()
    args = ["-m", str(tiny_model), "--method", "lminf", "--port", str(port), "-ub", "16", "-b", "64", "-np", "4",
            "-c", "2048", "-fa", "on", "--deterministic", "-a", "tiny", "--log-level", "warning"]
    with running_server(args, tmp_path / "server.log", f"http://127.0.0.1:{port}") as base:
        meta = httpx.get(f"{base}/v1/models").json()["data"][0]["meta"]
        assert meta["deterministic"] is True
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        alone = [ask(client, kind, prompt, farctx=farctx) for kind, prompt, farctx in JOBS]
        together = concurrently([lambda j=j: ask(client, j[0], j[1], farctx=j[2]) for j in JOBS])
        assert all(alone) and together == alone


def test_one_slot_by_default_metrics_when_asked_and_sizes_checked_at_start(tiny_model, tmp_path):
    port = free_port()
    args = ["-m", str(tiny_model), "--port", str(port), "--api-key", "k", "--log-level", "warning"]
    with running_server(args, tmp_path / "server.log", f"http://127.0.0.1:{port}") as base:
        assert httpx.get(f"{base}/health").json()["slots_idle"] == 1
        assert httpx.get(f"{base}/metrics").status_code == 401
        assert httpx.get(f"{base}/metrics", headers={"Authorization": "Bearer k"}).status_code == 501
        meta = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer k"}).json()["data"][0]["meta"]
        assert meta["n_parallel"] == 1 and meta["n_ctx"] == 256  # auto: n_ctx_train (32), rounded by llama.cpp
        assert meta["method"] == "auto" and meta["method_summary"].startswith("auto: stock llama.cpp inside the "
                                                                               "trained context, Dual Chunk")
        # no method named: a prompt of twice the trained context is answered (auto reads past it)
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="k", max_retries=0)
        got = client.completions.create(model="any", prompt=MID, max_tokens=4, temperature=0)
        assert got.usage.prompt_tokens > 2 * 32 and got.usage.completion_tokens == 4
    # a fixed-cache method's slots below what it needs: refused at start, with the sizes
    # (-c 300 -np 2: llama.cpp rounds 300 up to 512 cells, 256 per stream; an unset n_local would fit into them)
    small = subprocess.run([sys.executable, "-m", "farctx.cli.main", "serve", "-m", str(tiny_model), "--method",
                            "lminf", "--n-local", "300", "-ub", "16", "-c", "300", "-np", "2"], capture_output=True,
                           text=True, timeout=120)
    assert small.returncode == 1 and "needs 326 KV cells per stream (300 cells / 2 streams)" in small.stderr, \
        small.stderr


def test_api_key_required(tiny_model, tmp_path):
    """--api-key / --api-key-file: 401 without a valid `Authorization: Bearer` key, /health stays open."""
    port = free_port()
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
    from farctx.serve.app import is_loopback

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
    port = free_port()
    args = ["-m", str(tiny_model), "--port", str(port), "--ssl-key-file", str(key), "--ssl-cert-file", str(cert),
            "--log-level", "warning"]
    with running_server(args, tmp_path / "server.log", f"https://127.0.0.1:{port}", verify=trust) as base:
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        done = httpx.post(f"{base}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, verify=trust, timeout=60)
        assert done.status_code == 200


@pytest.mark.parametrize("method,extra", [
    ("lminf", []), ("streaming", []),
    ("mesa", ["--first-chunk", "4", "--stair-width", "2", "--last-context", "8", "--gen-budget", "2"])])
def test_slots_at_the_default_models_depth_with_flash_attention(deep_model, tmp_path, method, extra):
    """`farctx serve --method M -np 2 -fa on` on a model as deep as the bundled one (30 layers): the graphs of two
    streams per layer fit their budget (a 2-layer model hid an abort at the first request), and two concurrent
    requests, one far past the trained context, get the answers each gets alone."""
    port = free_port()
    args = ["-m", str(deep_model), "--method", method, "--port", str(port), "-ub", "16", "-b", "64", "-np", "2",
            "-fa", "on", "-c", "1024", "-n", "8", "-a", "tiny", "--log-level", "warning", *extra]
    with running_server(args, tmp_path / "server.log", f"http://127.0.0.1:{port}") as base:
        deep = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
        jobs = [("completion", "The river ran", None), ("completion-stream", "Tell me about " + LONG, None)]
        alone = [ask(deep, kind, prompt, farctx=farctx) for kind, prompt, farctx in jobs]
        together = concurrently([lambda j=j: ask(deep, j[0], j[1], farctx=j[2]) for j in jobs])
        assert together == alone and all(isinstance(a, str) for a in alone)
        assert httpx.get(f"{base}/health").json()["status"] == "ok"


def test_slots_as_a_memory_budget_fit_the_window(default_model, tmp_path):
    """`-c` without --n-local on a fixed-cache method: each slot's window is fitted into its share of the cells
    (c / np - n_global - n_ubatch, -ub unset: a quarter of the share, as farctx.Llama and farctx generate fit it),
    said at start and shown in /v1/models, and the slots serve."""
    port = free_port()
    args = ["-m", str(default_model), "--method", "lminf", "--port", str(port), "-c", "2048", "-np", "2",
            "-n", "4", "--log-level", "warning"]
    log = tmp_path / "server.log"
    with running_server(args, log, f"http://127.0.0.1:{port}") as base:
        meta = httpx.get(f"{base}/v1/models").json()["data"][0]["meta"]
        assert meta["n_ctx"] == 1024 and meta["params"]["n_local"] == 1024 - 10 - 256, meta
        done = httpx.post(f"{base}/v1/completions", json={"prompt": "The river ran", "max_tokens": 4}, timeout=60)
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 4
    started = log.read_text()
    assert "n_local 758), 2 slots of 1024 cells; n_local not set: the window fitted into each slot's cells" \
        in started, started
