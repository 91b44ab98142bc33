"""Issue 16's ratios paired per repetition: from the progress log of one `farctx bench` run (its stderr, one line
per repetition, method and length), lminf and streaming prefill and decode over `window`'s of the same
repetition, then the median and range over the repetitions. On these shared cores a method's medians move by
10-20% between runs; a ratio within one repetition (the methods run back to back) moves less.

    .venv/bin/python bench/perf/seg2_paired.py bench/perf/seg2-merge/run1.log
"""

from __future__ import annotations

import re
import statistics
import sys

LINE = re.compile(r"farctx bench: rep (\d+)/\d+ (\S+)\s+(\d+): prefill ([\d.]+) tok/s, decode ([\d.]+) tok/s")


def main(path: str) -> None:
    rows: dict[tuple[int, str, int], tuple[float, float]] = {}
    for line in open(path):
        m = LINE.match(line)
        if m:
            rows[(int(m[1]), m[2], int(m[3]))] = (float(m[4]), float(m[5]))
    reps = sorted({k[0] for k in rows})
    lengths = sorted({k[2] for k in rows if k[1] == "window"})
    print("| length | method | prefill / window: median [range] | decode / window: median [range] |")
    print("|---|---|---|---|")
    for length in lengths:
        for method in ("lminf", "streaming"):
            pairs = [(rows[(r, method, length)], rows[(r, "window", length)]) for r in reps
                     if (r, method, length) in rows and (r, "window", length) in rows]
            if not pairs:
                continue
            cells = []
            for i in (0, 1):
                v = [m[i] / w[i] for m, w in pairs]
                cells.append(f"{statistics.median(v):.3f} [{min(v):.2f}-{max(v):.2f}]")
            print(f"| {length} | {method} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main(sys.argv[1])
