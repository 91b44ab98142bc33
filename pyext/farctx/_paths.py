"""Where the native libraries are, and pointing llama-cpp-python at ours.

Importing this module sets LLAMA_CPP_LIB_PATH (unless the user set it) so that the
`llama_cpp` package loads the patched libllama that libfarctx links against.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .errors import FarctxError

REPO_ROOT = Path(__file__).resolve().parents[2]
_LIB_NAMES = {"darwin": "libfarctx.dylib", "win32": "farctx.dll"}


def lib_dir() -> Path:
    """The folder holding libfarctx and the patched libllama/libggml*."""
    env = os.environ.get("FARCTX_LIB_DIR")
    candidates = [Path(env)] if env else [REPO_ROOT / "build" / "cmake" / "bin"]
    for folder in candidates:
        if (folder / _lib_file()).exists():
            return folder
    raise FarctxError(
        f"farctx native libraries not found in {candidates[0]}: build them with scripts/build.sh "
        "(or set FARCTX_LIB_DIR)"
    )


def _lib_file() -> str:
    return _LIB_NAMES.get(sys.platform, "libfarctx.so")


def farctx_lib_path() -> Path:
    return lib_dir() / _lib_file()


def point_llama_cpp_at_our_build() -> None:
    if "llama_cpp" in sys.modules:
        return  # already loaded: _native checks that it is our library
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(lib_dir()))
