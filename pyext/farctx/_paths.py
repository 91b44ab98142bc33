"""Where the native libraries are, and pointing llama-cpp-python at ours.

The build installs libfarctx, the patched libllama/libggml*, farctx.h (the cffi declarations,
kept beside the library they describe) and llama.cpp's RPC server (ggml-rpc-server) into the package's `lib/` folder; they are found relative
to the package, never through a source tree. FARCTX_LIB_DIR overrides the folder (a developer's
build/cmake-cuda/bin, say). Importing this module does nothing; `point_llama_cpp_at_our_build`
sets LLAMA_CPP_LIB_PATH (unless the user set it) so that `llama_cpp` loads our libllama.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .errors import FarctxError

_LIB_NAMES = {"darwin": "libfarctx.dylib", "win32": "farctx.dll"}
HEADER_NAME = "farctx.h"


def _lib_file() -> str:
    return _LIB_NAMES.get(sys.platform, "libfarctx.so")


def _package_lib_dirs() -> list[Path]:
    """farctx/lib in each folder of the package (an editable install spreads it over the source
    folder and the installed one)."""
    from . import __path__ as package_path

    return [Path(folder) / "lib" for folder in package_path]


def lib_dir() -> Path:
    """The folder holding libfarctx, farctx.h and the patched libllama/libggml*."""
    env = os.environ.get("FARCTX_LIB_DIR")
    candidates = [Path(env)] if env else _package_lib_dirs()
    for folder in candidates:
        if (folder / _lib_file()).exists():
            return folder
    if env:
        raise FarctxError(f"FARCTX_LIB_DIR={env} holds no {_lib_file()}")
    raise FarctxError(
        f"farctx's native libraries are not installed (looked in {', '.join(map(str, candidates))}): "
        "reinstall the package (pip install farctx, or scripts/setup.sh in a checkout)"
    )


def farctx_lib_path() -> Path:
    return lib_dir() / _lib_file()


def rpc_server_path() -> Path:
    """llama.cpp's RPC server (ggml-rpc-server), built from the pinned source beside the libraries it loads."""
    path = lib_dir() / ("ggml-rpc-server.exe" if sys.platform == "win32" else "ggml-rpc-server")
    if not path.exists():
        raise FarctxError(f"{path} is missing: this build has no RPC backend (build it with CMAKE_ARGS=-DGGML_RPC=on)")
    return path


def header_path() -> Path:
    path = lib_dir() / HEADER_NAME
    if not path.exists():
        raise FarctxError(f"{path} is missing: the build installs it beside {_lib_file()}")
    return path


def point_llama_cpp_at_our_build() -> None:
    if "llama_cpp" in sys.modules:
        return  # already loaded: _native checks that it is our library
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(lib_dir()))
