"""farctx: run GGUF language models past their trained context inside llama.cpp.

    import farctx
    llm = farctx.Llama()      # the bundled default model; auto: stock inside its trained context, dca past it
    print(llm("Once upon a time", max_tokens=32)["choices"][0]["text"])
"""

from __future__ import annotations

from typing import Any

from . import _paths
from .errors import FarctxError, NoSpaceError
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
    # the engine and the method table load the native libraries: only when asked for
    if name == "Llama":
        from .engine import Llama

        return Llama
    if name == "method_support":
        from .context import method_support

        return method_support
    if name in ("METHODS", "MethodParams", "native_mesa_schedule"):
        from . import methods

        return getattr(methods, name)
    raise AttributeError(name)
