#!/usr/bin/env python3
"""The suite's time per file and its slowest tests, as Markdown tables, from pytest's JUnit XML.

    .venv/bin/python -m pytest --junitxml=build/suite.xml
    python3 scripts/suite_times.py build/suite.xml [--slowest 30]

A test's time is its setup, call and teardown together, so a module fixture's cost lands on the first test
that asks for it. docs/testing.md keeps the latest tables.
"""

from __future__ import annotations

import argparse
import collections
import xml.etree.ElementTree as ET
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--slowest", type=int, default=30)
    args = parser.parse_args()
    cases = []
    for case in ET.parse(args.junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[-1]
        cases.append((module, case.get("name", ""), float(case.get("time", 0))))
    seconds: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for module, _, t in cases:
        seconds[module] += t
        count[module] += 1
    total = sum(seconds.values())
    print(f"{len(cases)} tests, {total:.0f} s ({total / 60:.1f} min) in tests\n")
    print("| file | tests | seconds | share |\n|---|---:|---:|---:|")
    for module, t in seconds.most_common():
        print(f"| `{module}.py` | {count[module]} | {t:.1f} | {100 * t / total:.1f}% |")
    print(f"\n| slowest tests | seconds |\n|---|---:|")
    for module, name, t in sorted(cases, key=lambda c: -c[2])[: args.slowest]:
        print(f"| `{module}::{name}` | {t:.1f} |")


if __name__ == "__main__":
    main()
