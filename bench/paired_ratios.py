"""Paired per-repetition prefill ratios from `farctx bench`'s progress lines (its stderr).

Each repetition runs stock, vanilla and the methods back to back, so the ratio within one
repetition cancels the slow drifts of a shared machine that the medians of separate rows keep.

    .venv/bin/python bench/paired_ratios.py BENCH_STDERR_LOG METHOD
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"rep (\d+)/\d+ (\S+)\s+(\d+): prefill ([\d.]+)")


def main(log: str, method: str) -> None:
    reps: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    with open(log) as f:
        for line in f:
            m = LINE.search(line)
            if m:
                reps[(int(m.group(1)), int(m.group(3)))][m.group(2)] = float(m.group(4))
    print("\npaired per-repetition prefill ratios (each repetition runs stock, vanilla and the method back to back):")
    for length in sorted({k[1] for k in reps}):
        rows = [v for k, v in reps.items() if k[1] == length and method in v]
        for base in ("stock", "vanilla"):
            r = [v[method] / v[base] for v in rows if base in v]
            if r:
                print(f"{method}/{base} at {length}: min {min(r):.2f}, median {statistics.median(r):.2f}, "
                      f"max {max(r):.2f} ({sum(x >= 2.0 for x in r)} of {len(r)} repetitions >= 2.0)")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
