"""farctx: run GGUF language models past their trained context inside llama.cpp.

    import farctx
    llm = farctx.Llama(method="vanilla")          # the bundled default model
    print(llm("Once upon a time", max_tokens=32)["choices"][0]["text"])
"""

from __future__ import annotations

import os
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
    if name in ("METHODS", "MethodParams"):
        from . import methods

        return getattr(methods, name)
    raise AttributeError(name)


def method_support(model: ModelInfo | str | os.PathLike[str] | None = None) -> dict[str, str]:
    """For each method: "yes", or libfarctx's reason why it cannot run on this model in this build
    (farctx_method_supported, the check farctx_session_init makes), as "no: <reason>"."""
    from .engine import load_model_params_only

    path = model.path if isinstance(model, ModelInfo) else model
    with load_model_params_only(path) as (nat, c_model):
        err = nat.ffi.new("char[]", 512)
        result = {}
        for code in range(nat.lib.farctx_method_count()):
            name = nat.ffi.string(nat.lib.farctx_method_name(code)).decode()
            rc = nat.lib.farctx_method_supported(code, c_model, err, 512)
            result[name] = "yes" if rc == nat.lib.FARCTX_OK else "no: " + nat.ffi.string(err).decode()
    return result


def native_mesa_schedule(n: int, **params: int) -> tuple[bool, int, int]:
    """libfarctx's Mesa split of an n-token prompt: (chunked, chunk width C, middle chunks N)."""
    from ._native import native
    from .methods import MethodParams

    nat = native()
    c = MethodParams.from_kwargs("mesa", params).to_c(nat.ffi, nat.lib)
    chunk, n_middle = nat.ffi.new("int64_t *"), nat.ffi.new("int64_t *")
    chunked = nat.lib.farctx_mesa_schedule(c, n, chunk, n_middle)
    return bool(chunked), int(chunk[0]), int(n_middle[0])
