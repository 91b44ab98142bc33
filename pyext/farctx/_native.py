"""cffi binding of libfarctx; the declarations are read from its farctx.h (installed beside it)."""

from __future__ import annotations

import ctypes
import re
from functools import lru_cache
from typing import Any

import cffi

from . import _paths
from .errors import FarctxError


def cdef_source(header: str) -> str:
    """farctx.h without the preprocessor: C++ guards dropped, '#' lines dropped, FARCTX_API erased."""
    header = re.sub(r"#ifdef __cplusplus.*?#endif", "", header, flags=re.S)
    header = re.sub(r"#if defined\(_WIN32\).*?#endif", "", header, flags=re.S)
    lines = [ln for ln in header.splitlines() if not ln.lstrip().startswith("#")]
    return "\n".join(lines).replace("FARCTX_API ", "")


class Native:
    """The loaded libfarctx: `ffi` and `lib`, plus the llama_cpp module bound to the same libllama."""

    def __init__(self) -> None:
        _paths.point_llama_cpp_at_our_build()
        import llama_cpp  # noqa: F401  (loads the patched libllama first)

        llama_lib = llama_cpp.llama_cpp._lib
        if not hasattr(llama_lib, "llama_set_attn_extrap"):
            raise FarctxError(
                f"llama_cpp loaded a libllama without farctx's patches ({getattr(llama_lib, '_name', '?')}): "
                "import farctx before llama_cpp, or set LLAMA_CPP_LIB_PATH to farctx's build"
            )
        self.llama_cpp = llama_cpp
        self.ffi = cffi.FFI()
        self.ffi.cdef(cdef_source(_paths.header_path().read_text()))
        self.lib: Any = self.ffi.dlopen(str(_paths.farctx_lib_path()))

    def llama_context_ptr(self, ctx: Any) -> Any:
        """A ctypes llama_context pointer as a cffi pointer."""
        address = ctypes.cast(ctx, ctypes.c_void_p).value
        if not address:
            raise FarctxError("the llama context is not initialised")
        return self.ffi.cast("struct llama_context *", address)

    def llama_model_ptr(self, model: Any) -> Any:
        address = ctypes.cast(model, ctypes.c_void_p).value
        return self.ffi.cast("struct llama_model *", address)


@lru_cache(maxsize=1)
def native() -> Native:
    return Native()


@lru_cache(maxsize=1)
def llama_log() -> Any:
    """llama.cpp's log receiver (farctx._log.LlamaLog), installed once per process."""
    from ._log import LlamaLog

    return LlamaLog(native().llama_cpp)
