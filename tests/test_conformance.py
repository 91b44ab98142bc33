"""llama-cpp-python's own test suite, from the pinned sdist, with `llama_cpp.Llama` replaced by `farctx.Llama`.

Each method runs the upstream tests in a pytest process of its own (tests/conformance/farctx_conformance.py swaps
the class in; stand_in.py answers the downloads with the bundled model and rewrites the model-specific expectations
to what stock llama_cpp.Llama gives on it). Any failure but the listed model-specific ones fails here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGIN_DIR = Path(__file__).with_name("conformance")
sys.path.insert(0, str(PLUGIN_DIR))

from stand_in import adapt  # noqa: E402

METHODS = ["stock", "default", "vanilla", "lminf", "mesa", "dca", "string"]  # default: farctx.Llama's (auto)
MIN_PASSED = 15  # the upstream tests that run here: fewer means they were not collected


def _sdist() -> Path:
    pin = dict(line.split("=", 1) for line in (ROOT / "scripts" / "llama-pin.env").read_text().splitlines()
               if "=" in line and not line.startswith("#"))
    path = ROOT / "build" / "dl" / pin["LLAMA_CPP_PYTHON_SDIST"].strip()
    if not path.exists():
        pytest.fail(f"{path} is missing: scripts/setup.sh downloads it")
    return path


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> Path:
    """The sdist's tests/ and the vocabulary GGUF they read, in a folder of their own, adapted to the stand-in."""
    root = tmp_path_factory.mktemp("llama-cpp-python")
    with tarfile.open(_sdist()) as tar:
        top = tar.getnames()[0].split("/")[0]
        wanted = [m for m in tar.getmembers()
                  if m.name.startswith(f"{top}/tests/") or m.name == f"{top}/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf"]
        for m in wanted:
            m.name = m.name[len(top) + 1 :]
        tar.extractall(root, members=wanted, filter="data")
    for line in adapt(root / "tests", default_model):
        print("stand-in:", line)
    return root


def run_upstream(root: Path, method: str, *args: str, env: dict[str, str] | None = None
                 ) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "FARCTX_CONFORMANCE_METHOD": method, "PYTHONPATH": str(PLUGIN_DIR), **(env or {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfEsxX", "-p", "farctx_conformance",
                           "-p", "no:cacheprovider", "tests", *args],
                          cwd=root, env=full_env, capture_output=True, text=True, timeout=900)


def counts(output: str) -> dict[str, int]:
    summary = output.strip().splitlines()[-1]
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|error|errors|xfailed|xpassed|skipped)",
                                                   summary)}


@pytest.mark.parametrize("method", METHODS)
def test_upstream_suite(upstream: Path, method: str) -> None:
    run = run_upstream(upstream, method)
    tail = "\n".join(line for line in run.stdout.splitlines() if not line.startswith(("SKIPPED", "XFAIL")))[-4000:]
    print(run.stdout[-3000:])
    assert run.returncode == 0, f"{method}: llama-cpp-python's tests failed\n{tail}\n{run.stderr[-2000:]}"
    got = counts(run.stdout)
    assert got.get("passed", 0) >= MIN_PASSED, got
    assert not got.get("failed") and not got.get("xpassed"), got


def test_upstream_suite_catches_a_lost_stream(upstream: Path) -> None:
    """The run can fail: farctx.Llama.load_state without the stream (as before it was restored) fails the upstream
    prompt-cache tests."""
    run = run_upstream(upstream, "lminf", "-k", "cache", env={"FARCTX_CONFORMANCE_BREAK": "load_state"})
    failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED")]
    assert run.returncode != 0, run.stdout[-3000:]
    assert any("test_ram_cache_exact_prompt_hit_matches_fresh" in line for line in failed), run.stdout[-3000:]
