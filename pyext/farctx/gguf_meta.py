"""Reading a GGUF file's metadata (header and key/value section only, never the tensors).

gguf's GGUFReader parses every array of the file (a 49k-entry vocabulary takes seconds); farctx
needs a dozen scalars, so it walks the key/value section and skips what it does not keep.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, BinaryIO

from .errors import FarctxError

# GGUF value types: struct format of the scalars; 8 = string, 9 = array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_MAX_KEPT_ARRAY = 4096  # numeric arrays up to this length are kept (per-layer values), longer ones skipped


class _Truncated(Exception):
    pass


def _read(fh: BinaryIO, n: int) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise _Truncated
    return data


def _unpack(fh: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, _read(fh, struct.calcsize(fmt)))[0]


def _string(fh: BinaryIO) -> str:
    return _read(fh, _unpack(fh, "<Q")).decode("utf-8", errors="replace")


def _value(fh: BinaryIO, vtype: int) -> Any:
    if vtype in _SCALARS:
        return _unpack(fh, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(fh)
    if vtype == _ARRAY:
        etype, count = _unpack(fh, "<I"), _unpack(fh, "<Q")
        if etype in _SCALARS:
            size = struct.calcsize(_SCALARS[etype])
            if count > _MAX_KEPT_ARRAY:
                fh.seek(size * count, 1)
                return None
            return [_unpack(fh, _SCALARS[etype]) for _ in range(count)]
        if etype == _STRING:
            for _ in range(count):
                fh.seek(_unpack(fh, "<Q"), 1)
            return None
        raise ValueError(f"unknown GGUF array element type {etype}")
    raise ValueError(f"unknown GGUF value type {vtype}")


def check_gguf(path: Path) -> None:
    """Cheap check before llama.cpp opens the file (it validates the rest and says why it fails)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise FarctxError(f"cannot read model file {path}: {exc.strerror}") from None
    if head[:4] != b"GGUF":
        raise FarctxError(f"not a GGUF file (bad magic {head[:4]!r}): {path}")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise FarctxError(f"unsupported GGUF version {version}: {path}")


def read_metadata(path: Path) -> dict[str, Any]:
    """Every key of the file with its value (None for the long arrays, e.g. the vocabulary)."""
    check_gguf(path)
    meta: dict[str, Any] = {}
    try:
        with open(path, "rb") as fh:
            fh.seek(8)
            _unpack(fh, "<Q")  # tensor count
            n_kv = _unpack(fh, "<Q")
            for _ in range(n_kv):
                key = _string(fh)
                meta[key] = _value(fh, _unpack(fh, "<I"))
    except _Truncated:
        raise FarctxError(f"truncated GGUF file (its metadata ends early): {path}") from None
    except ValueError as exc:
        raise FarctxError(f"corrupt GGUF file: {path} ({exc})") from None
    return meta
