"""The soak of `farctx serve --parallel` (bench/soak.py), short: 3 minutes on the tiny model
(FARCTX_SOAK_MINUTES overrides; 0 skips). No 5xx, no crash, no unexpected error, every greedy answer
under load equal to the same request alone; RSS growth after warm-up is reported (an expected failure
while it is above the soak's bound: see README, "Serving at scale")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MINUTES = float(os.environ.get("FARCTX_SOAK_MINUTES", "3"))


@pytest.mark.skipif(MINUTES <= 0, reason="FARCTX_SOAK_MINUTES=0")
def test_soak_no_5xx_no_crash_flat_memory_answers_as_alone(tmp_path):
    out = tmp_path / "soak.json"
    # memory: 3 minutes end inside the warm-up the 30-minute run shows (RSS rises for about 5 minutes, by less
    # each minute, then stays flat: bench/soak/), so the bound here is 10 MB/min over the second half of the
    # load (measured 5.2); a leak per request or per step grows faster and without end
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--tiny", "--minutes", str(MINUTES),
                          "--max-slope", "10", "--out", str(out)], capture_output=True, text=True,
                         timeout=60 * MINUTES + 900)
    assert out.exists(), run.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["n_5xx"] == 0 and summary["server_alive"], summary
    assert not summary["failures"], summary["failures"]
    assert summary["greedy_requests_compared"] > 0 and not summary["greedy_mismatches"], summary["greedy_mismatches"]
    assert summary["outcomes"].get("left", 0) > 0 and summary["statuses"].get("400", 0) > 0
    assert summary["passed"], {k: v for k, v in summary.items() if k not in ("rss_samples", "metrics", "server")}
