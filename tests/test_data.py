"""The long texts come from the Debian package, read without R."""

from __future__ import annotations

import pytest

import farctx
from farctx.eval.data import NOVELS, austen


def test_austen_novels_read_from_the_debian_package():
    text = austen("persuasion")
    assert text.startswith("Persuasion")
    assert "Anne Elliot" in text and len(text) > 400_000
    assert austen("emma").startswith("EMMA")
    assert len(NOVELS) == 6


def test_unknown_novel():
    with pytest.raises(farctx.FarctxError, match="unknown novel"):
        austen("ulysses")


def test_first_use_unpacks_the_debian_package_without_r(tmp_path, monkeypatch):
    """A cache without the texts is filled from Debian's package, downloaded alone: no R, no root."""
    from farctx.eval import data

    monkeypatch.setenv("FARCTX_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(data, "SYSTEM_DIR", tmp_path / "no-system-install")
    folder = data.install_austen(quiet=True)
    assert folder == tmp_path / "janeaustenr" and (folder / "Rdata.rdx").is_file()
    assert data.austen("persuasion", folder) == austen("persuasion")
    assert data.install_austen(quiet=True) == folder  # once: the second call finds it
    assert not list(tmp_path.glob("tmp*")), "a staging folder was left behind"


def test_no_apt_names_what_to_unpack_where(tmp_path, monkeypatch):
    from farctx.eval import data

    monkeypatch.setenv("FARCTX_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(data, "SYSTEM_DIR", tmp_path / "no-system-install")
    monkeypatch.setattr(data.shutil, "which", lambda name: None)
    with pytest.raises(farctx.FarctxError, match="r-cran-janeaustenr.*janeaustenr/data into .*janeaustenr"):
        data.austen("emma")
