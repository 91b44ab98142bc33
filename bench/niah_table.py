"""The table of one or more `farctx eval niah` JSONs: a row per grid (its protocol), a column per method and length,
each cell right/samples, then every wrong answer. Usage: python bench/niah_table.py A.json [B.json ...]"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(paths: list[str]) -> None:
    grids = [(Path(p).stem, json.loads(Path(p).read_text())) for p in paths]
    columns = sorted({(s["method"], s["length"]) for _, g in grids for s in g["samples"]}, key=lambda c: (c[1], c[0]))
    print("| grid | protocol | " + " | ".join(f"{m} {n // 1024}k" for m, n in columns) + " |")
    print("|---|---|" + "---:|" * len(columns))
    for name, g in grids:
        cells = []
        for m, n in columns:
            got = [s for s in g["samples"] if s["method"] == m and s["length"] == n]
            cells.append(f"{sum(s['correct'] for s in got)}/{len(got)}" if got else "-")
        print(f"| {name} | {g['protocol_text']} | " + " | ".join(cells) + " |")
    print()
    print("Wrong answers (grid, method, length, depth, key: answer):")
    for name, g in grids:
        for s in g["samples"]:
            if not s["correct"]:
                print(f"- {name}, {s['method']}, {s['length']}, {s['depth']}, {s['key']}: {s['answer']!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
