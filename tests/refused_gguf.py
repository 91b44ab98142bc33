"""Tiny random-weight GGUFs of architectures the methods cannot run: the refusals' test models.

`gpt2` has learned absolute positions (no RoPE: no relative distance to bound or to move) and `mamba`
is recurrent (no KV cache at all). Both load and run vanilla in llama.cpp; every other method must be
refused with the reason, the same from `farctx info` and from loading.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from tiny_gguf import _copy_tokenizer

N_EMBD = 64
N_CTX_TRAIN = 32


def _writer(path: Path, arch: str, tokenizer_source: Path) -> tuple[GGUFWriter, int]:
    writer = GGUFWriter(str(path), arch)
    writer.add_name(f"farctx-tiny-{arch}")
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(1)
    writer.add_file_type(0)
    n_vocab = _copy_tokenizer(writer, tokenizer_source)
    writer.add_vocab_size(n_vocab)
    return writer, n_vocab


def _finish(writer: GGUFWriter, path: Path) -> Path:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _w(rng: np.random.Generator, *shape: int, scale: float = 0.05) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def write_gpt2_gguf(path: Path, tokenizer_source: Path) -> Path:
    """GPT-2: learned position embeddings, fused QKV, LayerNorm with biases (no RoPE)."""
    rng = np.random.default_rng(0)
    writer, n_vocab = _writer(path, "gpt2", tokenizer_source)
    e, ff = N_EMBD, 4 * N_EMBD
    writer.add_head_count(2)
    writer.add_feed_forward_length(ff)
    writer.add_layer_norm_eps(1e-5)
    ones, zeros = np.ones(e, np.float32), np.zeros(e, np.float32)
    writer.add_tensor("token_embd.weight", _w(rng, n_vocab, e))
    writer.add_tensor("position_embd.weight", _w(rng, N_CTX_TRAIN, e))
    writer.add_tensor("blk.0.attn_norm.weight", ones)
    writer.add_tensor("blk.0.attn_norm.bias", zeros)
    writer.add_tensor("blk.0.attn_qkv.weight", _w(rng, 3 * e, e))
    writer.add_tensor("blk.0.attn_qkv.bias", np.zeros(3 * e, np.float32))
    writer.add_tensor("blk.0.attn_output.weight", _w(rng, e, e))
    writer.add_tensor("blk.0.attn_output.bias", zeros)
    writer.add_tensor("blk.0.ffn_norm.weight", ones)
    writer.add_tensor("blk.0.ffn_norm.bias", zeros)
    writer.add_tensor("blk.0.ffn_up.weight", _w(rng, ff, e))
    writer.add_tensor("blk.0.ffn_up.bias", np.zeros(ff, np.float32))
    writer.add_tensor("blk.0.ffn_down.weight", _w(rng, e, ff))
    writer.add_tensor("blk.0.ffn_down.bias", zeros)
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output_norm.bias", zeros)
    return _finish(writer, path)


def write_mamba_gguf(path: Path, tokenizer_source: Path) -> Path:
    """Mamba: a selective state-space layer (recurrent state, no attention)."""
    rng = np.random.default_rng(0)
    writer, n_vocab = _writer(path, "mamba", tokenizer_source)
    e, d_inner, d_state, d_conv, dt_rank = N_EMBD, 2 * N_EMBD, 8, 4, 4
    writer.add_head_count(0)
    writer.add_feed_forward_length(0)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(dt_rank)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tensor("token_embd.weight", _w(rng, n_vocab, e))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(e, np.float32))
    writer.add_tensor("blk.0.ssm_in.weight", _w(rng, 2 * d_inner, e))
    writer.add_tensor("blk.0.ssm_conv1d.weight", _w(rng, d_inner, d_conv))
    writer.add_tensor("blk.0.ssm_conv1d.bias", np.zeros(d_inner, np.float32))
    writer.add_tensor("blk.0.ssm_x.weight", _w(rng, dt_rank + 2 * d_state, d_inner))
    writer.add_tensor("blk.0.ssm_dt.weight", _w(rng, d_inner, dt_rank))
    writer.add_tensor("blk.0.ssm_dt.bias", np.zeros(d_inner, np.float32))
    writer.add_tensor("blk.0.ssm_a", -np.ones((d_inner, d_state), np.float32))
    writer.add_tensor("blk.0.ssm_d", np.ones(d_inner, np.float32))
    writer.add_tensor("blk.0.ssm_out.weight", _w(rng, e, d_inner))
    writer.add_tensor("output_norm.weight", np.ones(e, np.float32))
    return _finish(writer, path)
