"""Write a ShortCtxLlama and its byte-level BPE tokenizer as a llama-architecture GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from model import Config, ShortCtxLlama

EOT = "<|endoftext|>"


def _tokenizer_tables(tokenizer_json: Path) -> tuple[list[str], list[int], list[str], int]:
    spec = json.loads(tokenizer_json.read_text())
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = [""] * len(vocab)
    for text, idx in vocab.items():
        tokens[idx] = text
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    types = [int(gguf.TokenType.CONTROL if t in specials else gguf.TokenType.NORMAL) for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, types, merges, specials[EOT]


def export(model: ShortCtxLlama, tokenizer_json: Path, out: Path, name: str) -> None:
    cfg: Config = model.cfg
    tokens, types, merges, eot = _tokenizer_tables(tokenizer_json)
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(name)
    w.add_context_length(cfg.n_ctx_train)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_ff)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    w.add_rope_freq_base(cfg.rope_base)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")  # byte-level BPE
    w.add_tokenizer_pre("gpt-2")  # the GPT-2 split regex, as the trainer's ByteLevel(use_regex=True)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(eot)
    w.add_eos_token_id(eot)
    w.add_add_bos_token(False)

    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}

    def put(gguf_name: str, key: str) -> None:
        a = state[key]
        # matrices in F16, norms in F32; torch's [out, in] is ggml's ne = [in, out]
        w.add_tensor(gguf_name, a.astype(np.float16) if a.ndim == 2 else a.astype(np.float32))

    put("token_embd.weight", "token_embd.weight")
    put("output_norm.weight", "output_norm.weight")
    put("output.weight", "output.weight")
    for i in range(cfg.n_layer):
        for part in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                     "ffn_norm", "ffn_gate", "ffn_up", "ffn_down"):
            put(f"blk.{i}.{part}.weight", f"layers.{i}.{part}.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def f16_rounded(model: ShortCtxLlama) -> ShortCtxLlama:
    """A copy whose matrices hold exactly the F16 values the GGUF holds (for the logit check)."""
    twin = ShortCtxLlama(model.cfg)
    state = {k: (v.half().float() if v.dim() == 2 else v.float()) for k, v in model.state_dict().items()}
    twin.load_state_dict(state)
    return twin.eval()


@torch.no_grad()
def torch_logits(model: ShortCtxLlama, ids: list[int]) -> np.ndarray:
    return model(torch.tensor([ids]))[0].double().numpy()
