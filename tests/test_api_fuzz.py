"""No input breaks the API: schemathesis (PyPI) generates requests from the server's own OpenAPI schema, valid
and invalid, for every endpoint, and each must be answered without a 5xx, an abort or a hang, every error as a
JSON body in llama-server's shape (tests/fuzz/error_shape_hooks.py). Run once without an API key and once with
one (the key sent: the generated requests reach the model; not sent: every endpoint but /health answers 401).
A fixed seed keeps CI repeatable; `FARCTX_FUZZ_EXAMPLES` sets the examples per endpoint (default 50)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from helpers import free_port, running_server

EXAMPLES = int(os.environ.get("FARCTX_FUZZ_EXAMPLES", "50"))
HOOKS = Path(__file__).with_name("fuzz")
KEY = "fuzz-key"


def schemathesis(base: str, schema: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail("schemathesis is not installed: scripts/setup.sh --full installs it")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "error_shape_hooks", "PYTHONPATH": str(HOOKS)}
    # the coverage phase trips a CPython 3.11 AST bug inside hypothesis's reprs; examples and fuzzing cover
    # every endpoint's schema
    cmd = [exe, "run", str(schema), "--url", base, "--checks", "not_a_server_error,llama_server_error_shape",
           "--phases", "examples,fuzzing", "--max-examples", str(EXAMPLES), "--seed", "1", "-w", "1",
           "--request-timeout", "60", "--no-color", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("keyed", [False, True], ids=["open", "api-key"])
def test_no_generated_request_gets_a_5xx(tiny_model, tmp_path, keyed):
    port = free_port()
    args = ["-m", str(tiny_model), "--method", "lminf", "--port", str(port), "-np", "2", "-c", "1024", "-b", "64",
            "-ub", "16", "-n", "4", "-to", "30", "--metrics", "--log-level", "warning"]
    if keyed:
        args += ["--api-key", KEY]
    base = f"http://127.0.0.1:{port}"
    with running_server(args, tmp_path / "server.log", base):
        auth = {"Authorization": f"Bearer {KEY}"} if keyed else {}
        schema = tmp_path / "openapi.json"  # read with the key: without it the schema too answers 401
        schema.write_bytes(httpx.get(f"{base}/openapi.json", headers=auth, timeout=10).content)
        runs = [schemathesis(base, schema, "-H", f"Authorization: Bearer {KEY}"), schemathesis(base, schema)] \
            if keyed else [schemathesis(base, schema)]
        assert httpx.get(f"{base}/health", timeout=10).status_code == 200  # still up: nothing aborted it
    for run in runs:
        report = run.stdout[-6000:]
        assert run.returncode == 0, f"schemathesis found failures\n{report}\n{run.stderr[-2000:]}"
        assert "generated" in report and " 0 generated" not in report, report
    log = (tmp_path / "server.log").read_text()
    assert "request failed" not in log and "Traceback" not in log, log[-4000:]
