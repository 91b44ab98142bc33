"""Which ggml backends (and devices) the installed build has, asked of ggml itself."""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from . import _paths

_GGML = {"darwin": "libggml.dylib", "win32": "ggml.dll"}


@dataclass
class Device:
    name: str
    description: str
    backend: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@lru_cache(maxsize=1)
def _ggml() -> Any:
    from ._native import native

    native()  # llama_cpp and libfarctx first: the same libggml, backends registered
    lib = ctypes.CDLL(str(_paths.lib_dir() / _GGML.get(sys.platform, "libggml.so")))
    return declare(lib, (
        ("ggml_backend_reg_count", ctypes.c_size_t, []),
        ("ggml_backend_reg_get", ctypes.c_void_p, [ctypes.c_size_t]),
        ("ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_backend_reg", ctypes.c_void_p, [ctypes.c_void_p]),
    ))


def declare(lib: Any, signatures: Iterable[tuple[str, Any, list[Any]]]) -> Any:
    """Set the result and argument types of lib's functions (name, restype, argtypes); returns lib."""
    for name, restype, argtypes in signatures:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def backends() -> list[str]:
    """The backends compiled into this build ("CPU", "CUDA", "Vulkan", "Metal", "RPC", ...)."""
    lib = _ggml()
    return [lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i)).decode()
            for i in range(lib.ggml_backend_reg_count())]


def devices() -> list[Device]:
    """The devices those backends found on this machine (a CUDA build on a machine without a GPU lists none)."""
    lib = _ggml()
    found = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        reg = lib.ggml_backend_dev_backend_reg(dev)
        found.append(Device(
            name=(lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
            description=(lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
            backend=(lib.ggml_backend_reg_name(reg) or b"").decode() if reg else "",
        ))
    return found
