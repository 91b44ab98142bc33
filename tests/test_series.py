"""scripts/series: the patch series laid out as a git history and exported again gives patches/ byte for byte, so
that a patch edited as code comes back with its header and nothing else changed (patches/README.md)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "series"
needs_stock = pytest.mark.skipif(not (ROOT / "build" / "llama.cpp-stock" / "CMakeLists.txt").is_file(),
                                 reason="no stock tree (scripts/fetch_llama.py --stock)")


def series_module():
    loader = SourceFileLoader("farctx_series", str(SCRIPT))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


@needs_stock
def test_series_round_trip_reproduces_the_patches():
    run = subprocess.run([sys.executable, str(SCRIPT), "check"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    n = len(list((ROOT / "patches").glob("*.patch")))
    assert f"reproduces all {n} patches byte for byte" in run.stderr


@needs_stock
def test_series_check_names_a_patch_that_does_not_come_back(tmp_path):
    """A header the history cannot give back (a blank line before '---' that git drops) is named."""
    patches = tmp_path / "patches"
    shutil.copytree(ROOT / "patches", patches)
    last = sorted(patches.glob("*.patch"))[-1]
    last.write_text(last.read_text(encoding="utf-8").replace("\n---\n", "\n\n---\n", 1), encoding="utf-8")
    assert series_module().check(patches) == [last.name]


def test_subjects_and_names(tmp_path):
    series = series_module()
    folded = tmp_path / "p.patch"
    folded.write_text("From: x\nSubject: [PATCH] area: a long subject\n folded over two lines\n\nbody\n")
    assert series.subject_of(folded) == "area: a long subject folded over two lines"
    assert series.slug("kv-cache: The K-shift, in blocks") == "kv-cache-the-k-shift-in-blocks.patch"
