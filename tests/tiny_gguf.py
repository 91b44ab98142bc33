"""Tiny random-weight GGUFs written at test time (F32 weights, the bundled model's tokenizer), one per
model family the methods must run on: llama (and its RoPE scalings), qwen2, qwen3, phi3, gemma2, gemma3.

Each family has the features of the real one that touch attention (RoPE layout, biases, q/k norms,
fused projections, soft-capping, sliding-window layers, per-layer RoPE base) at a tiny size:
n_ctx_train 32, head_dim 64, a sliding window of 8."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, RopeScalingType

# what each architecture's llama.cpp loader expects beyond llama's tensors
QKV_BIAS = {"qwen2"}
QK_NORM = {"qwen3", "gemma3"}
FUSED_QKV_FFN = {"phi3"}     # attn_qkv, and ffn_up holding [gate; up] (no ffn_gate)
POST_NORMS = {"gemma2", "gemma3"}
SWA_ARCHS = {"gemma2", "gemma3"}


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
    arch: str = "llama"        # or qwen2, qwen3, phi3, gemma2, gemma3
    sliding_window: int = 8    # gemma2/gemma3 only
    key_length: int | None = None         # head_dim when it is not n_embd / n_head (qwen3, gemma)
    rope_scaling: str = "none"            # linear, yarn, or llama3 (a rope_freqs.weight tensor)
    rope_scaling_factor: float = 1.0
    rope_orig_ctx: int | None = None      # YaRN's original context (llama3: the one of its formula)
    rope_base_swa: float | None = None    # gemma: the sliding layers' RoPE base
    attn_softcap: float | None = None     # gemma2
    final_softcap: float | None = None    # gemma2

    @property
    def head_dim(self) -> int:
        return self.key_length or self.n_embd // self.n_head


# the families the oracle covers, shaped like the real models (GQA, head_dim 64), tiny
FAMILIES: dict[str, TinyConfig] = {
    "llama": TinyConfig(),
    "llama-linear": TinyConfig(rope_scaling="linear", rope_scaling_factor=4.0, seed=31),
    "llama-yarn": TinyConfig(rope_scaling="yarn", rope_scaling_factor=4.0, rope_orig_ctx=32, seed=32),
    "llama3": TinyConfig(rope_scaling="llama3", rope_scaling_factor=8.0, rope_orig_ctx=32, seed=33),
    "qwen2": TinyConfig(arch="qwen2", rope_base=10000.0, rms_eps=1e-6, seed=34),
    "qwen3": TinyConfig(arch="qwen3", n_head=4, n_head_kv=2, key_length=64, rms_eps=1e-6, seed=35),
    "phi3": TinyConfig(arch="phi3", n_head=2, n_head_kv=2, seed=36),
}
# interleaved sliding-window attention: gemma2 alternates (even layers slide), gemma3 slides 5 of 6
FAMILIES_ISWA: dict[str, TinyConfig] = {
    "gemma2": TinyConfig(arch="gemma2", n_layer=4, n_head=4, n_head_kv=2, key_length=64, rms_eps=1e-6,
                         attn_softcap=8.0, final_softcap=4.0, seed=37),
    "gemma3": TinyConfig(arch="gemma3", n_layer=6, n_head=4, n_head_kv=1, key_length=64, rms_eps=1e-6,
                         rope_base=10000.0, rope_base_swa=100.0, rope_scaling="linear", rope_scaling_factor=4.0,
                         seed=38),
}
# llama3's frequency-factor formula (its converter's): low/high frequency factors
LLAMA3_LOW_FREQ_FACTOR = 1.0
LLAMA3_HIGH_FREQ_FACTOR = 4.0


@lru_cache(maxsize=4)
def _tokenizer_fields(source: Path) -> tuple[tuple[str, GGUFValueType, Any], ...]:
    """The tokenizer.* fields of `source` as (name, type, value), read once per process: parsing the 49k-token
    vocabulary is most of a tiny model's writing time, and a suite writes a dozen of them."""
    reader = GGUFReader(str(source))
    fields = []
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            if field.types[1] == GGUFValueType.STRING:
                value: Any = [bytes(field.parts[i]).decode("utf-8", errors="surrogateescape") for i in field.data]
            else:
                value = [field.parts[i].tolist()[0] for i in field.data]
        elif vtype == GGUFValueType.STRING:
            value = bytes(field.parts[field.data[0]]).decode("utf-8")
        else:
            value = field.parts[field.data[0]].tolist()[0]
        fields.append((name, vtype, value))
    return tuple(fields)


def _copy_tokenizer(writer: GGUFWriter, source: Path) -> int:
    """Copies the tokenizer.* fields of `source` into `writer`; returns the vocabulary size."""
    n_vocab = 0
    for name, vtype, value in _tokenizer_fields(Path(source).resolve()):
        if vtype == GGUFValueType.ARRAY:
            writer.add_array(name, value)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        elif vtype == GGUFValueType.STRING:
            writer.add_string(name, value)
        else:
            {
                GGUFValueType.UINT32: writer.add_uint32,
                GGUFValueType.INT32: writer.add_int32,
                GGUFValueType.BOOL: writer.add_bool,
                GGUFValueType.FLOAT32: writer.add_float32,
            }[vtype](name, value)
    return n_vocab


def llama3_freq_factors(cfg: TinyConfig) -> np.ndarray:
    """The divisor of each rotary pair's frequency in llama3's RoPE scaling (rope_freqs.weight)."""
    n_rot = cfg.head_dim
    inv_freq = cfg.rope_base ** (-np.arange(0, n_rot, 2) / n_rot)
    wavelen = 2 * np.pi / inv_freq
    old_ctx = cfg.rope_orig_ctx or cfg.n_ctx_train
    low_wavelen = old_ctx / LLAMA3_LOW_FREQ_FACTOR
    high_wavelen = old_ctx / LLAMA3_HIGH_FREQ_FACTOR
    smooth = (old_ctx / wavelen - LLAMA3_LOW_FREQ_FACTOR) / (LLAMA3_HIGH_FREQ_FACTOR - LLAMA3_LOW_FREQ_FACTOR)
    blended = 1.0 / ((1 - smooth) / cfg.rope_scaling_factor + smooth)
    factors = np.where(wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, cfg.rope_scaling_factor, blended))
    return factors.astype(np.float32)


def _add_hparams(writer: GGUFWriter, cfg: TinyConfig) -> None:
    writer.add_name("farctx-tiny-test")
    writer.add_context_length(cfg.n_ctx_train)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    writer.add_feed_forward_length(cfg.n_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    if cfg.key_length is not None:
        writer.add_key_length(cfg.key_length)
        writer.add_value_length(cfg.key_length)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(cfg.rope_base)
    writer.add_layer_norm_rms_eps(cfg.rms_eps)
    if cfg.arch in SWA_ARCHS:
        writer.add_sliding_window(cfg.sliding_window)
    if cfg.rope_base_swa is not None:
        writer.add_rope_freq_base_swa(cfg.rope_base_swa)
    if cfg.attn_softcap is not None:
        writer.add_attn_logit_softcapping(cfg.attn_softcap)
    if cfg.final_softcap is not None:
        writer.add_final_logit_softcapping(cfg.final_softcap)
    if cfg.rope_scaling in ("linear", "yarn"):
        writer.add_rope_scaling_type(RopeScalingType(cfg.rope_scaling))
        writer.add_rope_scaling_factor(cfg.rope_scaling_factor)
    if cfg.rope_scaling == "yarn" and cfg.rope_orig_ctx is not None:
        writer.add_rope_scaling_orig_ctx_len(cfg.rope_orig_ctx)
    writer.add_file_type(0)  # all F32


class _Weights:
    """Random F32 tensors, drawn in call order from one seeded generator."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def matrix(self, n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        # numpy shapes are the reverse of ggml's ne: a [n_out, n_in] matrix maps n_in -> n_out
        return (self.rng.standard_normal((n_out, n_in)) * (gain / n_in) ** 0.5).astype(np.float32)

    def norm(self, n: int) -> np.ndarray:
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)

    def bias(self, n: int) -> np.ndarray:
        return (0.3 * self.rng.standard_normal(n)).astype(np.float32)


def _layer_tensors(cfg: TinyConfig, w: _Weights) -> list[tuple[str, np.ndarray]]:
    """One block's tensors (without the blk.N. prefix), in the draw order of the original llama fixture."""
    e, hd = cfg.n_embd, cfg.head_dim
    n_q, n_kv = cfg.n_head * hd, cfg.n_head_kv * hd
    out = [("attn_norm.weight", w.norm(e))]
    q, k, v = w.matrix(n_q, e, 1.2), w.matrix(n_kv, e, 1.2), w.matrix(n_kv, e)
    if cfg.arch in FUSED_QKV_FFN:
        out.append(("attn_qkv.weight", np.concatenate([q, k, v])))
    else:
        out += [("attn_q.weight", q), ("attn_k.weight", k), ("attn_v.weight", v)]
    out += [("attn_output.weight", w.matrix(e, n_q)), ("ffn_norm.weight", w.norm(e))]
    gate, up, down = w.matrix(cfg.n_ff, e), w.matrix(cfg.n_ff, e), w.matrix(e, cfg.n_ff)
    if cfg.arch in FUSED_QKV_FFN:
        out.append(("ffn_up.weight", np.concatenate([gate, up])))
    else:
        out += [("ffn_gate.weight", gate), ("ffn_up.weight", up)]
    out.append(("ffn_down.weight", down))
    if cfg.arch in QKV_BIAS:
        out += [("attn_q.bias", w.bias(n_q)), ("attn_k.bias", w.bias(n_kv)), ("attn_v.bias", w.bias(n_kv))]
    if cfg.arch in QK_NORM:
        out += [("attn_q_norm.weight", w.norm(hd)), ("attn_k_norm.weight", w.norm(hd))]
    if cfg.arch in POST_NORMS:
        out += [("post_attention_norm.weight", w.norm(e)), ("post_ffw_norm.weight", w.norm(e))]
    return out


def write_tiny_gguf(path: Path, tokenizer_source: Path, cfg: TinyConfig = TinyConfig()) -> Path:
    writer = GGUFWriter(str(path), cfg.arch)
    _add_hparams(writer, cfg)
    n_vocab = _copy_tokenizer(writer, tokenizer_source)
    writer.add_vocab_size(n_vocab)

    w = _Weights(cfg.seed)
    writer.add_tensor("token_embd.weight", (w.rng.standard_normal((n_vocab, cfg.n_embd)) * 0.1).astype(np.float32))
    for il in range(cfg.n_layer):
        for name, tensor in _layer_tensors(cfg, w):
            writer.add_tensor(f"blk.{il}.{name}", tensor)
    writer.add_tensor("output_norm.weight", w.norm(cfg.n_embd))
    if cfg.rope_scaling == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_freq_factors(cfg))
    # no output.weight: llama.cpp ties the output to token_embd (halves the file)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def family_config(name: str) -> TinyConfig:
    """The tiny model of a family by name (FAMILIES, then FAMILIES_ISWA)."""
    return FAMILIES.get(name) or FAMILIES_ISWA[name]


# the default model's depth and attention layout (SmolLM2-135M: 30 layers, GQA 3:1, head_dim 64), narrow: graphs
# as large as the real model's (per layer and per stream), computed in milliseconds
DEEP = TinyConfig(n_embd=192, n_layer=30, n_head=3, n_head_kv=1, n_ff=256, seed=40)
# a few layers more than the 2 of the oracle's tiny model, for exactness against the numpy oracle beyond two layers
NARROW6 = TinyConfig(n_embd=192, n_layer=6, n_head=3, n_head_kv=1, n_ff=256, seed=41)
