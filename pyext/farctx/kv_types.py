"""KV cache types by llama.cpp's -ctk/-ctv names, and the rule llama.cpp puts on them."""

from __future__ import annotations

from typing import Optional

from .errors import FarctxError

# llama.cpp's cache type names -> ggml type ids (enum ggml_type)
KV_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
UNQUANTIZED = ("f32", "f16", "bf16")


def kv_type_id(value: Optional[int | str]) -> Optional[int]:
    """A cache type given by name ("q8_0") or ggml id, as the id (None: llama.cpp's default, F16)."""
    if value is None or isinstance(value, int):
        return value
    if value not in KV_TYPES:
        raise FarctxError(f"unknown KV cache type '{value}' (choose from {', '.join(KV_TYPES)})")
    return KV_TYPES[value]


def check_kv_types(type_k: Optional[int], type_v: Optional[int], flash_attn: bool) -> None:
    """llama.cpp's rule, refused before a context is made: a quantized V cache needs flash attention."""
    quantized_v = type_v is not None and type_v not in (KV_TYPES[name] for name in UNQUANTIZED)
    if quantized_v and not flash_attn:
        raise FarctxError("a quantized V cache (-ctv) needs flash attention (-fa on)")
