"""The soak of `farctx serve --parallel` (bench/soak.py), short: 3 minutes on the tiny model
(FARCTX_SOAK_MINUTES overrides; 0 skips). No 5xx, no crash, no unexpected error, every greedy answer
under load equal to the same request alone, and no RSS growth over rounds of the same requests after the
load (the leak check; docs/testing.md)."""

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
    # memory: 3 minutes end inside the warm-up of the timed load (RSS rises for minutes in steps, as new batch
    # shapes come), so its slope is reported, not judged; the leak check is the rounds that follow: the same
    # requests round after round, RSS at idle after each, at most 16 KB per request (a leak of 50 KB per request
    # put into the server fails it)
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "soak.py"), "--tiny", "--minutes", str(MINUTES),
                          "--max-slope", "inf", "--rounds", "10", "--max-growth", "16", "--out", str(out)],
                         capture_output=True, text=True, timeout=60 * MINUTES + 1200)
    assert out.exists(), run.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["n_5xx"] == 0 and summary["server_alive"], summary
    assert not summary["failures"], summary["failures"]
    assert summary["greedy_requests_compared"] > 0 and not summary["greedy_mismatches"], summary["greedy_mismatches"]
    assert summary["outcomes"].get("left", 0) > 0 and summary["statuses"].get("400", 0) > 0
    assert summary["rounds"] == 10 and summary["rounds_rss_kb_per_request"] <= 16, summary["rounds_rss"]
    assert summary["passed"], {k: v for k, v in summary.items() if k not in ("rss_samples", "metrics", "server")}
