"""Long public-domain texts from registry packages: Jane Austen's six novels (Debian r-cran-janeaustenr).

The R package keeps them in a lazy-load database (Rdata.rdx index + Rdata.rdb chunks); PyPI's
`rdata` reads the serialized R objects, so no R is needed.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

from ..errors import FarctxError

AUSTEN_DIR = Path("/usr/lib/R/site-library/janeaustenr/data")
NOVELS = ("emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility")


def _convert(data: bytes) -> object:
    import warnings

    try:
        import rdata
    except ImportError:
        raise FarctxError("reading Jane Austen's novels needs rdata: pip install 'farctx[eval]'") from None

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Unknown file type: assumed RDS": it is one
        return rdata.conversion.convert(rdata.parser.parse_data(data))


def austen(novel: str = "emma", folder: Path = AUSTEN_DIR) -> str:
    """One novel as plain text (paragraphs separated by blank lines)."""
    if novel not in NOVELS:
        raise FarctxError(f"unknown novel '{novel}' (choose from {', '.join(NOVELS)})")
    index_file, db_file = folder / "Rdata.rdx", folder / "Rdata.rdb"
    if not index_file.exists():
        raise FarctxError(f"Jane Austen's novels are not installed ({folder}): apt-get install r-cran-janeaustenr")
    index = _convert(gzip.decompress(index_file.read_bytes()))
    offset, length = (int(x) for x in index["variables"][novel])  # type: ignore[index]
    with open(db_file, "rb") as fh:
        fh.seek(offset)
        chunk = fh.read(length)
    lines = _convert(zlib.decompress(chunk[4:]))  # 4 bytes: uncompressed length
    return "\n".join(str(line) for line in lines)  # type: ignore[union-attr]
