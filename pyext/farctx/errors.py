"""The one exception type farctx raises for bad input and failed runs."""

from __future__ import annotations


class FarctxError(Exception):
    """A clear, one-line reason why farctx could not do what was asked."""


class NoSpaceError(FarctxError):
    """The tokens do not fit in the KV cache under the chosen method."""
