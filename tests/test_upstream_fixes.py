"""The reproducers of the stock llama.cpp defects that the first patches fix (patches/README.md marks them as
upstream candidates). Each case (tests/upstream_repro.py) runs in a child process through llama-cpp-python's own
binding, once against the
stock library built from the pinned source (build/cmake-stock: `scripts/setup.sh --full`, or built here on first use)
and once against ours:
it must fail on stock (a wrong result or a crash) and pass on ours. A case that stopped failing on stock says the
defect is gone upstream, and the patch can leave the series at the next rebase.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPRO = Path(__file__).with_name("upstream_repro.py")

# case -> (the largest logit difference that is a pass, extra environment)
CASES = {
    "seq_div": (1e-4, {}),
    "yarn_shift": (1e-4, {}),
    "bf16_shift": (0.5, {}),
    "q8_0_shift": (0.5, {"LLAMA_ATTN_ROT_DISABLE": "1"}),
}


def run_case(model: Path, case: str, libs: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARCTX_")}
    env.update(CASES[case][1], LLAMA_CPP_LIB_PATH=str(libs))
    return subprocess.run([sys.executable, str(REPRO), str(model), case], env=env, capture_output=True, text=True,
                          timeout=300)


def outcome(run: subprocess.CompletedProcess[str], case: str) -> str:
    if run.returncode != 0:
        return f"crashed (exit {run.returncode}): {run.stderr.strip().splitlines()[-1:] if run.stderr else ''}"
    diff = json.loads(run.stdout.strip().splitlines()[-1])["diff"]
    return "pass" if diff <= CASES[case][0] else f"wrong: logits off by {diff:.3g}"


@pytest.mark.parametrize("case", list(CASES))
def test_fails_on_stock_and_passes_here(tiny_model: Path, case: str) -> None:
    """seq_div's sign (the seq-div patch); the K-shift re-applying YaRN's magnitude factor, aborting on a BF16
    cache and dereferencing a missing Hadamard rotation (the K-shift patches 0002-0004: yarn-attn-factor,
    hadamard-optional, bf16)."""
    import farctx
    from farctx.bench.harness import stock_lib_dir

    ours = outcome(run_case(tiny_model, case, farctx._paths.lib_dir()), case)
    stock = outcome(run_case(tiny_model, case, stock_lib_dir()), case)
    assert ours == "pass", f"{case} on the patched library: {ours}"
    assert stock != "pass", f"{case} passes on stock llama.cpp: the defect is fixed upstream (drop the patch)"
    print(f"{case}: stock {stock}; patched: pass")
