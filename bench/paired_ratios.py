"""Ratios paired per repetition from `farctx bench`'s progress lines (its stderr).

Each repetition runs stock, vanilla and the methods back to back, so the ratio within one
repetition cancels the slow drifts of a shared machine that the medians of separate rows keep
(a method's medians move by 10-20% between runs on these cores).

    .venv/bin/python bench/paired_ratios.py BENCH_STDERR_LOG METHOD
        METHOD's prefill over stock's and vanilla's (with how many repetitions reach 2x)
    .venv/bin/python bench/paired_ratios.py BENCH_STDERR_LOG METHOD[,METHOD...] --table BASE
        a markdown table: each METHOD's prefill and decode over BASE's, median [range] per length
"""

from __future__ import annotations

import argparse
import re
import statistics

LINE = re.compile(r"rep (\d+)/\d+ (\S+)\s+(\d+): prefill ([\d.]+)(?: tok/s)?(?:, decode ([\d.]+))?")


def read(log: str) -> dict[tuple[int, str, int], tuple[float, float | None]]:
    """(repetition, method, length) -> (prefill, decode) tok/s."""
    rows: dict[tuple[int, str, int], tuple[float, float | None]] = {}
    with open(log) as f:
        for line in f:
            m = LINE.search(line)
            if m:
                rows[(int(m[1]), m[2], int(m[3]))] = (float(m[4]), float(m[5]) if m[5] else None)
    return rows


def paired(rows: dict, method: str, base: str, length: int, i: int) -> list[float]:
    """Field i (0 prefill, 1 decode) of method over base, one ratio per repetition that ran both."""
    reps = sorted({k[0] for k in rows})
    pairs = [(rows.get((r, method, length)), rows.get((r, base, length))) for r in reps]
    return [m[i] / b[i] for m, b in pairs if m and b and m[i] is not None and b[i] is not None]


def summary(rows: dict, method: str) -> None:
    print("\npaired per-repetition prefill ratios (each repetition runs stock, vanilla and the method back to back):")
    for length in sorted({k[2] for k in rows}):
        for base in ("stock", "vanilla"):
            r = paired(rows, method, base, length, 0)
            if r:
                print(f"{method}/{base} at {length}: min {min(r):.2f}, median {statistics.median(r):.2f}, "
                      f"max {max(r):.2f} ({sum(x >= 2.0 for x in r)} of {len(r)} repetitions >= 2.0)")


def table(rows: dict, methods: list[str], base: str) -> None:
    print(f"| length | method | prefill / {base}: median [range] | decode / {base}: median [range] |")
    print("|---|---|---|---|")
    for length in sorted({k[2] for k in rows if k[1] == base}):
        for method in methods:
            cells = []
            for i in (0, 1):
                v = paired(rows, method, base, length, i)
                cells.append(f"{statistics.median(v):.3f} [{min(v):.2f}-{max(v):.2f}]" if v else "-")
            if cells != ["-", "-"]:
                print(f"| {length} | {method} | {cells[0]} | {cells[1]} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log", help="the stderr of one `farctx bench` run")
    ap.add_argument("methods", help="a method, or (with --table) methods separated by commas")
    ap.add_argument("--table", metavar="BASE", help="a table of prefill and decode over BASE's")
    args = ap.parse_args()
    rows = read(args.log)
    if args.table:
        table(rows, args.methods.split(","), args.table)
    else:
        summary(rows, args.methods)


if __name__ == "__main__":
    main()
