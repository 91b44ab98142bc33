"""farctx: run GGUF language models past their trained context inside llama.cpp.

    import farctx
    llm = farctx.Llama(method="vanilla")          # the bundled default model
    print(llm("Once upon a time", max_tokens=32)["choices"][0]["text"])
"""

from __future__ import annotations

from typing import Any

from . import _paths
from .errors import FarctxError, NoSpaceError
from .methods import METHODS, MethodParams
from .models import ModelInfo, default_model_path, model_info

__all__ = [
    "METHODS",
    "FarctxError",
    "Llama",
    "MethodParams",
    "ModelInfo",
    "NoSpaceError",
    "default_model_path",
    "model_info",
    "method_support",
    "native_mesa_schedule",
]

__version__ = "0.1.0"

try:  # so that a later `import llama_cpp` loads the patched libllama too
    _paths.point_llama_cpp_at_our_build()
except FarctxError:
    pass  # not built yet: farctx.Llama says so when asked for


def __getattr__(name: str) -> Any:
    # the engine loads the native libraries: only when asked for
    if name == "Llama":
        from .engine import Llama

        return Llama
    raise AttributeError(name)


def method_support(info: ModelInfo) -> dict[str, str]:
    """For each method: "yes", or why it cannot run on this model in this build."""
    from ._native import native

    n = native()
    result = {}
    for method in METHODS:
        code = n.lib.farctx_method_from_name(method.encode())
        if not n.lib.farctx_method_available(code):
            result[method] = "not available in this build"
        elif method != "vanilla" and info.sliding_window:
            result[method] = "no: sliding-window layers"
        else:
            result[method] = "yes"
    return result


def native_mesa_schedule(n: int, **params: int) -> tuple[bool, int, int]:
    """libfarctx's Mesa split of an n-token prompt: (chunked, chunk width C, middle chunks N)."""
    from ._native import native

    nat = native()
    c = MethodParams.from_kwargs("mesa", params).to_c(nat.ffi, nat.lib)
    chunk, n_middle = nat.ffi.new("int64_t *"), nat.ffi.new("int64_t *")
    chunked = nat.lib.farctx_mesa_schedule(c, n, chunk, n_middle)
    return bool(chunked), int(chunk[0]), int(n_middle[0])
