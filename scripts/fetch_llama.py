#!/usr/bin/env python3
"""Lay out the pinned llama.cpp for a build: fetched, verified, patched.

    python scripts/fetch_llama.py [--stock]

Layout (all under build/, relative to the checkout or the unpacked farctx sdist):
    build/dl/<sdist>          llama-cpp-python's source distribution (sha256-checked)
    build/llama.cpp-stock/    its vendor/llama.cpp, untouched (stock baselines)
    build/llama.cpp/          the same with patches/*.patch applied in order, stamped

Steps are skipped when their result is already there: a patched tree whose stamp matches
patches/ (as in farctx's sdist, which carries it) needs neither the sdist nor the network, and a
tree with a .git folder is a developer's working tree, left alone.

The sdist comes from FARCTX_LLAMA_SDIST (a path) when set, otherwise `pip download` (the
package index pip is configured with). A sha256 mismatch or a patch that does not apply stops
with a message naming the file.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def say(msg: str) -> None:
    print(f"farctx: {msg}", file=sys.stderr, flush=True)


def fail(msg: str) -> None:
    say(msg)
    sys.exit(1)


def read_pin(root: Path) -> dict[str, str]:
    pin = {}
    for line in (root / "scripts" / "llama-pin.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            pin[key] = value
    return pin


def patches_stamp(root: Path) -> str:
    digest = hashlib.sha256()
    for patch in sorted((root / "patches").glob("*.patch")):
        digest.update(patch.read_bytes())
    return digest.hexdigest()[:16]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def patched_tree_ready(root: Path) -> bool:
    tree = root / "build" / "llama.cpp"
    if (tree / ".git").is_dir():
        say("build/llama.cpp is a git working tree (developer mode): patches not re-applied")
        return True
    stamp = tree / ".farctx-patches"
    return stamp.is_file() and stamp.read_text().strip() == patches_stamp(root)


def fetch_sdist(root: Path, pin: dict[str, str]) -> Path:
    dl = root / "build" / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    sdist = dl / pin["LLAMA_CPP_PYTHON_SDIST"]
    want = pin["LLAMA_CPP_PYTHON_SHA256"]
    given = os.environ.get("FARCTX_LLAMA_SDIST")
    if given:
        if sha256_of(Path(given)) != want:
            fail(f"sha256 mismatch for FARCTX_LLAMA_SDIST={given} (expected {want})")
        if Path(given).resolve() != sdist.resolve():
            shutil.copyfile(given, sdist)
        return sdist
    if sdist.is_file() and sha256_of(sdist) == want:
        return sdist
    sdist.unlink(missing_ok=True)
    version = pin["LLAMA_CPP_PYTHON_VERSION"]
    say(f"fetching llama-cpp-python {version} source distribution (the pinned llama.cpp)")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
           "--no-binary=llama-cpp-python", f"llama-cpp-python=={version}", "-d", str(dl)]
    try:
        subprocess.run(cmd, check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        fail(f"could not download llama-cpp-python {version} ({exc}); without network, set "
             f"FARCTX_LLAMA_SDIST to a copy of {sdist.name} or install from farctx's sdist")
    if not sdist.is_file() or sha256_of(sdist) != want:
        fail(f"sha256 mismatch for {sdist} (expected {want})")
    return sdist


def extract_stock(root: Path, sdist: Path, pin: dict[str, str]) -> Path:
    stock = root / "build" / "llama.cpp-stock"
    if (stock / ".farctx-extracted").is_file():
        return stock
    say("extracting vendor/llama.cpp")
    shutil.rmtree(stock, ignore_errors=True)
    extract = root / "build" / "extract"
    shutil.rmtree(extract, ignore_errors=True)
    prefix = pin["LLAMA_CPP_PYTHON_SDIST"].removesuffix(".tar.gz") + "/vendor/llama.cpp"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name == prefix or m.name.startswith(prefix + "/")]
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(extract, members=members, **kwargs)
    (extract / prefix).rename(stock)
    shutil.rmtree(extract)
    git = stock / ".git"  # a submodule pointer (a file) into the sdist author's checkout
    if git.is_dir():
        shutil.rmtree(git)
    elif git.exists():
        git.unlink()
    (stock / ".farctx-extracted").touch()
    return stock


def apply_patches(root: Path, stock: Path) -> None:
    tree = root / "build" / "llama.cpp"
    tmp = tree.with_name("llama.cpp.tmp")
    say("applying patches/ to a fresh copy of llama.cpp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(stock, tmp, symlinks=True)
    # the ceiling keeps git from treating the tree as part of an enclosing repository (where
    # `git apply` would silently skip every path outside the current folder)
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root / "build"))
    for patch in sorted((root / "patches").glob("*.patch")):
        try:
            run = subprocess.run(["git", "apply", "--verbose", "--whitespace=nowarn", str(patch)],
                                 cwd=tmp, env=env, capture_output=True, text=True)
        except OSError:
            fail("git is needed to apply farctx's patches (or install from farctx's sdist, which carries them applied)")
        if run.returncode != 0 or "Skipped" in run.stderr:
            sys.stderr.write(run.stderr)
            shutil.rmtree(tmp, ignore_errors=True)
            fail(f"patch does not apply: patches/{patch.name}")
        say(f"  applied {patch.name}")
    (tmp / ".farctx-patches").write_text(patches_stamp(root) + "\n")
    shutil.rmtree(tree, ignore_errors=True)
    tmp.rename(tree)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stock", action="store_true", help="also lay out build/llama.cpp-stock")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = args.root.resolve()
    pin = read_pin(root)
    ready = patched_tree_ready(root)
    if ready and not args.stock:
        return
    stock = extract_stock(root, fetch_sdist(root, pin), pin)
    if not ready:
        apply_patches(root, stock)


if __name__ == "__main__":
    main()
