"""Issue 16's table from two `farctx bench --json` runs (before: FARCTX_PER_QUERY_SEG2=0, after: the default):
lminf and streaming prefill and decode as ratios to `window` measured in the same run."""

from __future__ import annotations

import json
import sys


def ratios(path: str) -> dict[tuple[str, int], tuple[float, float]]:
    rows = json.load(open(path))["results"]
    by = {(r["method"], r["length"]): (r["prefill_tps"], r["decode_tps"]) for r in rows}
    out = {}
    for (method, length), (pre, dec) in by.items():
        w_pre, w_dec = by[("window", length)]
        out[(method, length)] = (pre / w_pre, dec / w_dec)
    return out


def main(before: str, after: str) -> None:
    b, a = ratios(before), ratios(after)
    w = {k[1]: v for k, v in ((k, json_row) for k, json_row in _window(after).items())}
    print("| length | window prefill / decode (tok/s, after run) | method | prefill / window: before -> after "
          "| decode / window: before -> after |")
    print("|---|---|---|---|---|")
    for (method, length) in sorted(a, key=lambda k: (k[1], k[0])):
        if method not in ("lminf", "streaming"):
            continue
        pb, db = b[(method, length)]
        pa, da = a[(method, length)]
        wp, wd = w[length]
        print(f"| {length} | {wp:,.0f} / {wd:,.0f} | {method} | {pb:.2f} -> **{pa:.2f}** | {db:.2f} -> **{da:.2f}** |")


def _window(path: str) -> dict[tuple[str, int], tuple[float, float]]:
    rows = json.load(open(path))["results"]
    return {(r["method"], r["length"]): (r["prefill_tps"], r["decode_tps"]) for r in rows if r["method"] == "window"}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
