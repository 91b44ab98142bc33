"""scripts/gpu-check on the CPU (GPU_CHECK_DRY_RUN=1: the same steps on build/cmake).

A session lent a GPU has 15 minutes of device time for this script (bench/results/gpu/README.md); a defect in
the script itself must show up here, not there.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check"


def run_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ)
    full.pop("FARCTX_TEST_NGL", None)
    full.update(
        OUT=str(tmp_path / "out"),
        GPU_CHECK_WORK=str(tmp_path / "work"),
        GPU_CHECK_MODEL_DIR=str(tmp_path / "no-model"),
        GPU_CHECK_DRY_RUN="1",
        **env,
    )
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=ROOT, env=full, capture_output=True, text=True, timeout=600
    )


@pytest.mark.skipif(not (ROOT / "build" / "cmake" / "bin" / "libfarctx.so").exists(), reason="no CPU build")
def test_placement_and_oracle_steps_run_and_report(tmp_path: Path) -> None:
    r = run_check(
        tmp_path,
        GPU_CHECK_STEPS="placement,oracle",
        GPU_CHECK_PYTEST_ARGS="-k test_vanilla_matches_oracle",
    )
    out = tmp_path / "out"
    summary = (out / "summary.md").read_text()
    assert r.returncode == 0, r.stderr[-3000:] + summary
    assert "| placement | passed" in summary and "| oracle | passed" in summary
    assert "| bench-" not in summary and "## farctx bench" not in summary, "bench rows without the bench step"
    placement = (out / "placement.txt").read_text()
    rows = [line for line in placement.splitlines() if "kf16-vf16-faon" in line]
    assert len(rows) >= 5 and all(" ok " in row for row in rows), placement
    assert "not in stock" not in placement
    oracle = (out / "oracle.txt").read_text()
    assert " passed" in oracle and " failed" not in oracle.split("== diagnosis")[0], oracle[-2000:]
    # step 4b: stock's in-place F16 K-shift (alone, without PDL, without CUDA graphs) and the patched one
    assert oracle.count("== diagnosis:") == 4 and oracle.count('"case": "f16_shift_fa"') == 4, oracle[-2000:]


@pytest.mark.parametrize(
    "env, message",
    [
        ({"GPU_CHECK_STEPS": "oracle,everything"}, "unknown step 'everything'"),
        ({"GPU_CHECK_BENCH_FA": "on,auto"}, "'auto' is not on or off"),
    ],
)
def test_unknown_settings_are_refused_before_any_step(tmp_path: Path, env: dict[str, str], message: str) -> None:
    r = run_check(tmp_path, **env)
    assert r.returncode == 2
    assert message in r.stderr
    assert "start (limit" not in r.stderr
