"""A tiny random-weight llama GGUF written at test time (F32 weights, the bundled model's tokenizer)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter, GGUFValueType


@dataclass(frozen=True)
class TinyConfig:
    n_ctx_train: int = 32
    n_embd: int = 128
    n_layer: int = 2
    n_head: int = 2     # head_dim 64: quantized K caches take llama.cpp's Hadamard path
    n_head_kv: int = 1  # GQA 2:1
    n_ff: int = 192
    rope_base: float = 1000.0
    rms_eps: float = 1e-5
    seed: int = 0
    arch: str = "llama"        # or "gemma3": interleaved sliding-window layers
    sliding_window: int = 8    # gemma3 only

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def _copy_tokenizer(writer: GGUFWriter, source: Path) -> int:
    """Copies the tokenizer.* fields of `source` into `writer`; returns the vocabulary size."""
    reader = GGUFReader(str(source))
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            etype = field.types[1]
            if etype == GGUFValueType.STRING:
                values = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
            else:
                values = [field.parts[i].tolist()[0] for i in field.data]
            writer.add_array(name, values)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(values)
        elif vtype == GGUFValueType.STRING:
            writer.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            value = field.parts[field.data[0]].tolist()[0]
            {
                GGUFValueType.UINT32: writer.add_uint32,
                GGUFValueType.INT32: writer.add_int32,
                GGUFValueType.BOOL: writer.add_bool,
                GGUFValueType.FLOAT32: writer.add_float32,
            }[vtype](name, value)
    return n_vocab


def write_tiny_gguf(path: Path, tokenizer_source: Path, cfg: TinyConfig = TinyConfig()) -> Path:
    rng = np.random.default_rng(cfg.seed)
    writer = GGUFWriter(str(path), cfg.arch)
    writer.add_name("farctx-tiny-test")
    writer.add_context_length(cfg.n_ctx_train)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_base)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    if cfg.arch == "gemma3":
        writer.add_sliding_window(cfg.sliding_window)
    writer.add_file_type(0)  # all F32
    n_vocab = _copy_tokenizer(writer, tokenizer_source)
    writer.add_vocab_size(n_vocab)

    e, hd = cfg.n_embd, cfg.head_dim

    def w(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm_w(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    # numpy shapes are the reverse of ggml's ne: a [n_out, n_in] matrix maps n_in -> n_out
    writer.add_tensor("token_embd.weight", w(n_vocab, e, scale=0.1))
    for il in range(cfg.n_layer):
        p = f"blk.{il}."
        writer.add_tensor(p + "attn_norm.weight", norm_w(e))
        writer.add_tensor(p + "attn_q.weight", w(cfg.n_head * hd, e, scale=(1.2 / e) ** 0.5))
        writer.add_tensor(p + "attn_k.weight", w(cfg.n_head_kv * hd, e, scale=(1.2 / e) ** 0.5))
        writer.add_tensor(p + "attn_v.weight", w(cfg.n_head_kv * hd, e, scale=(1.0 / e) ** 0.5))
        writer.add_tensor(p + "attn_output.weight", w(e, cfg.n_head * hd, scale=(1.0 / e) ** 0.5))
        writer.add_tensor(p + "ffn_norm.weight", norm_w(e))
        writer.add_tensor(p + "ffn_gate.weight", w(cfg.n_ff, e, scale=(1.0 / e) ** 0.5))
        writer.add_tensor(p + "ffn_up.weight", w(cfg.n_ff, e, scale=(1.0 / e) ** 0.5))
        writer.add_tensor(p + "ffn_down.weight", w(e, cfg.n_ff, scale=(1.0 / cfg.n_ff) ** 0.5))
        if cfg.arch == "gemma3":
            for name, n in (("post_attention_norm", e), ("post_ffw_norm", e), ("attn_q_norm", hd), ("attn_k_norm", hd)):
                writer.add_tensor(p + name + ".weight", norm_w(n))
    writer.add_tensor("output_norm.weight", norm_w(e))
    # no output.weight: llama.cpp ties the output to token_embd (halves the file)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
