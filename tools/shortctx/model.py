"""A small llama (RMSNorm, RoPE, SwiGLU, untied output) in torch, laid out like llama.cpp's `llama`.

RoPE rotates adjacent pairs (x[2i], x[2i+1]), llama.cpp's NORMAL layout, so the exported q/k
weights need no permutation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Config:
    n_vocab: int = 4096
    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_ff: int = 688
    n_ctx_train: int = 256
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def rope_tables(cfg: Config, n_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    half = cfg.head_dim // 2
    theta = cfg.rope_base ** (-2.0 * torch.arange(half, dtype=torch.float64) / cfg.head_dim)
    angle = torch.arange(n_pos, dtype=torch.float64)[:, None] * theta[None, :]
    return angle.cos().float(), angle.sin().float()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [batch, head, pos, head_dim]; pairs (2i, 2i+1) rotated by pos * theta_i."""
    pairs = x.float().unflatten(-1, (-1, 2))
    even, odd = pairs[..., 0], pairs[..., 1]
    n = x.shape[-2]
    c, s = cos[:n], sin[:n]
    out = torch.stack((even * c - odd * s, even * s + odd * c), dim=-1)
    return out.flatten(-2).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Layer(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        d, f = cfg.n_embd, cfg.n_ff
        self.cfg = cfg
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.attn_q = nn.Linear(d, d, bias=False)
        self.attn_k = nn.Linear(d, d, bias=False)
        self.attn_v = nn.Linear(d, d, bias=False)
        self.attn_output = nn.Linear(d, d, bias=False)
        self.ffn_norm = RMSNorm(d, cfg.norm_eps)
        self.ffn_gate = nn.Linear(d, f, bias=False)
        self.ffn_up = nn.Linear(d, f, bias=False)
        self.ffn_down = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.attn_norm(x)

        def heads(proj: nn.Linear) -> torch.Tensor:
            return proj(h).view(b, t, self.cfg.n_head, self.cfg.head_dim).transpose(1, 2)

        q, k, v = rope(heads(self.attn_q), cos, sin), rope(heads(self.attn_k), cos, sin), heads(self.attn_v)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_output(att.transpose(1, 2).reshape(b, t, -1))
        h = self.ffn_norm(x)
        return x + self.ffn_down(F.silu(self.ffn_gate(h)) * self.ffn_up(h))


class ShortCtxLlama(nn.Module):
    def __init__(self, cfg: Config, max_pos: int = 8192) -> None:
        super().__init__()
        self.cfg = cfg
        self.token_embd = nn.Embedding(cfg.n_vocab, cfg.n_embd)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layer))
        self.output_norm = RMSNorm(cfg.n_embd, cfg.norm_eps)
        self.output = nn.Linear(cfg.n_embd, cfg.n_vocab, bias=False)
        cos, sin = rope_tables(cfg, max_pos)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = residual_std if name.endswith(("attn_output.weight", "ffn_down.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.token_embd(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.output(self.output_norm(x))
