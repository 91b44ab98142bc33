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
