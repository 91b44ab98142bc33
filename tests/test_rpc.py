"""A model split across ggml RPC servers (llama.cpp's own, `farctx rpc-server`): every method equals the
numpy oracle through two CPU servers on loopback as it does locally, the layers really run there (the
scheduler's split log), and a server that cannot be used is a FarctxError naming it, within seconds."""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import F16, F32, engine_logits, kv_id, random_tokens, tolerance
from helpers import run_cli
from oracle import rule_for
from test_oracle_dca import DCA
from test_oracle_mesa import L_TR, MESA, SELFEXTEND
from test_oracle_string import STRING
from test_oracle_methods import rule as methods_rule

import farctx
from farctx import _paths, rpc

# per method: tokens, prefill (the rest decoded one at a time), token seed, method parameters; the streams of
# the local oracle suites (past n_local, several mesa chunks and a stair move, selfextend's groups)
CASES = {
    "vanilla": (96, 61, 1, {}),
    "lminf": (160, 100, 11, {}),
    "window": (160, 100, 11, {}),
    "lambda-only": (160, 100, 11, {}),
    "streaming": (160, 100, 11, {}),
    "rerope": (160, 100, 11, {}),
    "mesa": (130, 100, 100, MESA),
    "selfextend": (128, 96, 21, SELFEXTEND),
    "dca": (128, 96, 25, DCA),
    "string": (128, 96, 27, STRING),
    "auto": (128, 96, 29, DCA),  # stock up to the trained context (32), dca's chunks past it
}
# layer 0 on the first server, layer 1 and the output on the second (llama.cpp's -ts: n_layer + 1 slots)
TENSOR_SPLIT = [1.0, 2.0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(endpoint: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            rpc.check_server(endpoint, timeout=2)
            return
        except farctx.FarctxError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"RPC server {endpoint} did not start: {log.read_text()}") from None
            time.sleep(0.1)


@contextlib.contextmanager
def running_servers(folder: Path, argv_of, n: int = 2):
    """n RPC servers on free loopback ports: (endpoints, their stdout logs); stopped on exit."""
    procs, endpoints, logs = [], [], []
    try:
        for i in range(n):
            port = free_port()
            log = folder / f"rpc-{port}.log"
            with open(log, "w") as out:
                procs.append(subprocess.Popen(argv_of(port), stdout=out, stderr=subprocess.STDOUT))
            endpoints.append(f"127.0.0.1:{port}")
            logs.append(log)
        for endpoint, proc, log in zip(endpoints, procs, logs):
            wait_ready(endpoint, proc, log)
        yield endpoints, logs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    binary = str(_paths.rpc_server_path())
    with running_servers(tmp_path_factory.mktemp("rpc"),
                         lambda port: rpc.server_argv(binary, "127.0.0.1", port, None, 1, False)) as (endpoints, _):
        yield endpoints


def test_the_build_has_the_rpc_backend():
    """The package build includes ggml-rpc and its server (GGML_RPC on by default), so CI runs this suite."""
    if os.environ.get("FARCTX_LIB_DIR"):
        pytest.skip("FARCTX_LIB_DIR: a developer's other build")
    from farctx.backends import backends

    assert "RPC" in backends()
    assert os.access(_paths.rpc_server_path(), os.X_OK)


def test_protocol_constants_match_the_pinned_source():
    """farctx.rpc's HELLO (its own check, before ggml-rpc, which aborts on failure) is the pinned protocol's."""
    src = Path(__file__).resolve().parents[1] / "build" / "llama.cpp" / "ggml"
    if not src.is_dir():
        pytest.skip("no llama.cpp source tree (an installed package's tests)")
    header = (src / "include" / "ggml-rpc.h").read_text()
    body = (src / "src" / "ggml-rpc" / "ggml-rpc.cpp").read_text()
    transport = (src / "src" / "ggml-rpc" / "transport.h").read_text()
    assert re.search(rf"#define RPC_PROTO_MAJOR_VERSION\s+{rpc.PROTO_MAJOR}\b", header)
    assert re.search(rf"#define RPC_PROTO_MINOR_VERSION\s+{rpc.PROTO_MINOR}\b", header)
    assert re.search(rf"RPC_CMD_HELLO == {rpc.CMD_HELLO}\b", body)
    assert re.search(rf"RPC_CONN_CAPS_SIZE = {rpc.CONN_CAPS_SIZE}\b", transport)
    assert re.search(r"struct rpc_msg_hello_req \{\s*uint8_t conn_caps\[RPC_CONN_CAPS_SIZE\];\s*\}", body)


def splits_per_graph(log: str) -> list[list[str]]:
    """The backends of each graph's splits in the scheduler's log (GGML_SCHED_DEBUG=1)."""
    graphs: list[list[str]] = []
    for index, backend in re.findall(r"## SPLIT #(\d+): (\S+) #", log):
        if index == "0":
            graphs.append([])
        graphs[-1].append(backend)
    return graphs


def check_placement(log: str, endpoints: list[str]) -> None:
    """Each token graph: the token embeddings' CPU split (llama.cpp keeps that lookup on the CPU), then layer 0
    on the first server and layer 1 and the output on the second; graphs without tokens (mesa's rotations of
    the cache in place) on the servers alone. No other split on the CPU."""
    graphs = splits_per_graph(log)
    assert graphs, "no graph seen in the scheduler's log"
    want = ["CPU", *(f"[{e}]" for e in endpoints)]
    for splits in graphs:
        where = [s if s == "CPU" else s[s.index("["):] for s in splits]
        if where[0] == "CPU":
            assert where == want, splits
        else:
            assert set(where) <= set(want[1:]), splits


class References(dict):
    """method -> (tokens, oracle logits), computed when a test first asks (a -k selection pays for its own)."""

    def __init__(self, oracle) -> None:
        super().__init__()
        self.oracle = oracle

    def __missing__(self, method: str):
        n, n_prefill, seed, params = CASES[method]
        tokens = random_tokens(n, seed=seed)
        # the window family at the local suite's settings (test_oracle_methods.rule), the others by their parameters
        rule = rule_for(method, n, params, L_TR, n_prefill) if params or method == "vanilla" else methods_rule(method, n)
        self[method] = tokens, self.oracle.logits(tokens, rule)
        return self[method]


@pytest.fixture(scope="module")
def references(oracle):
    return References(oracle)


# flash attention off with F32 K/V (the tightest bound), on with F16 K/V (where the mechanism's fast paths are:
# native/llama); on the servers' non-host buffers the graph takes the branches it takes on a GPU
KV = [(F32, F32, False), (F16, F16, True)]


@pytest.mark.parametrize("kv", KV, ids=kv_id)
@pytest.mark.parametrize("method", list(CASES))
def test_method_matches_oracle_through_rpc(tiny_model, references, servers, monkeypatch, method, kv):
    type_k, type_v, fa = kv
    tokens, ref = references[method]
    _, n_prefill, _, params = CASES[method]
    monkeypatch.setenv("GGML_SCHED_DEBUG", "1")  # read when the context's scheduler is made
    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        got = engine_logits(tiny_model, tokens, n_prefill, n_ubatch=7, type_k=type_k, type_v=type_v, flash_attn=fa,
                            method=method, n_ctx=256, rpc_servers=servers, n_gpu_layers=-1,
                            tensor_split=TENSOR_SPLIT, verbose=True, **params)
    tolerance(type_k, type_v, fa).check(got, ref, f"{method} through RPC {kv_id(kv)}")
    check_placement(log.getvalue(), servers)
    devices = re.findall(r"using device (RPC\d+) \(([^)]*)\)", log.getvalue())
    assert [endpoint for _, endpoint in devices] == servers
    for layer, (name, _) in enumerate(devices):
        assert f"layer   {layer} assigned to device {name}," in log.getvalue()


def test_two_engines_on_the_same_servers(tiny_model, servers):
    """A second engine while the first holds its connections (a server serves one client at a time: ggml
    shares the process's connection, and farctx does not check a server this process is connected to)."""
    first = farctx.Llama(str(tiny_model), rpc_servers=servers, n_gpu_layers=-1, n_ctx=64)
    started = time.monotonic()
    second = farctx.Llama(str(tiny_model), rpc_servers=servers, n_gpu_layers=-1, n_ctx=64)
    assert time.monotonic() - started < rpc.CONNECT_TIMEOUT
    try:
        texts = [llm("Hello", max_tokens=4, temperature=0)["choices"][0]["text"] for llm in (first, second)]
        assert texts[0] == texts[1]
    finally:
        first.close()
        second.close()


def test_deterministic_is_refused_with_layers_on_rpc_servers(tiny_model, servers):
    """Batch-invariant kernels are the CPU backend's: a context that computes layers elsewhere is refused with
    the reason, and the servers stay usable."""
    from farctx.batch import SequenceBatch

    with pytest.raises(farctx.FarctxError, match="deterministic needs every layer on the CPU backend"):
        SequenceBatch(str(tiny_model), n_seq=2, n_ctx_seq=64, rpc_servers=servers, n_gpu_layers=-1,
                      deterministic=True)
    with SequenceBatch(str(tiny_model), n_seq=2, n_ctx_seq=64, rpc_servers=servers, n_gpu_layers=-1) as batch:
        batch.open(0)
        assert batch.step({0: [1, 2, 3]})[0].shape == (batch.n_vocab,)


def test_layers_stay_local_without_rpc_servers(tiny_model, servers, monkeypatch):
    """The servers' devices are never registered process-wide: a model loaded afterwards without
    rpc_servers offloads nothing to them."""
    monkeypatch.setenv("GGML_SCHED_DEBUG", "1")
    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        engine_logits(tiny_model, random_tokens(20), 20, n_ubatch=7, n_gpu_layers=-1, verbose=True)
    graphs = splits_per_graph(log.getvalue())
    assert graphs and all(set(g) == {"CPU"} for g in graphs), graphs[:3]


def test_unreachable_server_is_an_error_within_seconds(tiny_model):
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    with pytest.raises(farctx.FarctxError, match=re.escape(endpoint)):
        farctx.Llama(str(tiny_model), rpc_servers=endpoint, n_gpu_layers=-1)
    assert time.monotonic() - started < 5


@contextlib.contextmanager
def fake_server(answer: bytes | None):
    """A listener that reads a HELLO and sends `answer` (None: never answers)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(1 + 8 + rpc.CONN_CAPS_SIZE)
            if answer is not None:
                conn.sendall(answer)
            stop.wait(10)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


def test_protocol_version_mismatch_is_an_error(tiny_model):
    old = rpc.PROTO_MAJOR - 1
    hello = struct.pack("<Q", 4 + rpc.CONN_CAPS_SIZE) + bytes([old, 0, 0, 0]) + bytes(rpc.CONN_CAPS_SIZE)
    with fake_server(hello) as endpoint:
        with pytest.raises(farctx.FarctxError, match=rf"{re.escape(endpoint)} speaks ggml RPC protocol {old}\.0\.0"):
            farctx.Llama(str(tiny_model), rpc_servers=[endpoint], n_gpu_layers=-1)


def test_silent_server_is_an_error_after_the_timeout(tiny_model, monkeypatch):
    monkeypatch.setattr(rpc, "CONNECT_TIMEOUT", 1.0)
    with fake_server(None) as endpoint:
        started = time.monotonic()
        with pytest.raises(farctx.FarctxError, match=rf"{re.escape(endpoint)}: no answer to HELLO within 1 s"):
            farctx.Llama(str(tiny_model), rpc_servers=endpoint, n_gpu_layers=-1)
        assert time.monotonic() - started < 4


@pytest.mark.parametrize("spec", ["127.0.0.1", "127.0.0.1:0", "127.0.0.1:x", ":50052", "h:1,h:1"])
def test_malformed_server_lists_are_refused(spec):
    with pytest.raises(farctx.FarctxError):
        rpc.parse_servers(spec)


def test_cli_generate_across_two_rpc_servers(tmp_path, tiny_model):
    """`farctx rpc-server` twice, then `farctx generate --rpc ... --method mesa -ngl all` (a prompt of several
    chunks): the text of a local run, and both servers served the run."""
    cli = [sys.executable, "-m", "farctx.cli.main"]
    prompt = "It is a truth universally acknowledged, that a single man in possession of a good fortune, " * 3
    args = ["generate", "-m", str(tiny_model), "--method", "mesa", "--first-chunk", "4", "--last-context", "8",
            "--gen-budget", "2", "--stair-width", "2", "-p", prompt, "-n", "12", "--temp", "0", "-c", "256"]
    local = run_cli(*args)
    assert local.returncode == 0, local.stderr
    with running_servers(tmp_path, lambda port: [*cli, "rpc-server", "--port", str(port), "-t", "1"]) as (eps, logs):
        remote = run_cli(*args, "--rpc", ",".join(eps), "-ngl", "all")
        assert remote.returncode == 0, remote.stderr
        time.sleep(0.2)
        for log in logs:
            text = log.read_text()
            assert "farctx: rpc-server on 127.0.0.1" in text and text.count("Accepted client connection") >= 2, text
    assert remote.stdout == local.stdout and remote.stdout.strip()


def test_cli_rpc_server_warns_beyond_loopback(monkeypatch):
    """Listening on every interface prints the no-authentication warning (the server itself is not started)."""
    from click.testing import CliRunner

    from farctx.cli.main import main

    started: list[list[str]] = []

    def no_exec(path, argv):
        started.append(list(argv))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", no_exec)
    port = str(free_port())
    result = CliRunner().invoke(main, ["rpc-server", "-H", "0.0.0.0", "-p", port, "-d", "CPU", "-c"])
    assert "no authentication" in result.stderr
    assert started and started[0][1:] == ["--host", "0.0.0.0", "--port", port, "--device", "CPU", "--cache"]
    result = CliRunner().invoke(main, ["rpc-server", "-p", port])
    assert "no authentication" not in result.stderr
    assert started[1][1:] == ["--host", "127.0.0.1", "--port", port]


def test_rpc_option_checks_its_value():
    result = run_cli("generate", "--rpc", "localhost", "-p", "x")
    assert result.returncode == 2 and "HOST:PORT" in result.stderr
