"""The test oracle: a numpy (float64) forward pass of a llama-architecture GGUF.

A method is given as three arrays over the stream (DESIGN.md section 1):
  allowed[i, j]  bool, query i may attend key j (the oracle adds nothing: causality included)
  relpos[i, j]   the RoPE distance p_q - p_k used for that pair
  lam[i]         a factor on query i
The engine's logits must match `logits(...)` token by token.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader


@dataclass
class AttentionRule:
    allowed: np.ndarray  # [n, n] bool
    relpos: np.ndarray   # [n, n] int
    lam: np.ndarray      # [n] float


def vanilla_rule(n: int) -> AttentionRule:
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    return AttentionRule(allowed=j <= i, relpos=(i - j), lam=np.ones(n))


class OracleModel:
    def __init__(self, path: Path) -> None:
        reader = GGUFReader(str(path))
        arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
        if arch != "llama":
            raise ValueError(f"the oracle implements the llama architecture, not {arch}")

        def scalar(key: str) -> float:
            f = reader.fields[f"llama.{key}"]
            return f.parts[f.data[0]].tolist()[0]

        self.n_head = int(scalar("attention.head_count"))
        self.n_head_kv = int(scalar("attention.head_count_kv"))
        self.n_embd = int(scalar("embedding_length"))
        self.n_layer = int(scalar("block_count"))
        self.eps = float(scalar("attention.layer_norm_rms_epsilon"))
        self.rope_base = float(scalar("rope.freq_base"))
        self.n_ctx_train = int(scalar("context_length"))
        self.head_dim = self.n_embd // self.n_head
        self.t = {}
        for tensor in reader.tensors:
            shape = tuple(int(x) for x in reversed(tensor.shape.tolist()))
            self.t[tensor.name] = np.asarray(tensor.data, dtype=np.float64).reshape(shape)
        if "output.weight" not in self.t:
            self.t["output.weight"] = self.t["token_embd.weight"]
        half = self.head_dim // 2
        self.theta = self.rope_base ** (-2.0 * np.arange(half) / self.head_dim)  # [half]

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def _attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, rule: AttentionRule) -> np.ndarray:
        """q [n, H, d], k/v [n, Hkv, d] (un-rotated): RoPE NORMAL layout (adjacent pairs) by relpos."""
        n, n_head, d = q.shape
        group = n_head // self.n_head_kv
        qc = q[..., 0::2] + 1j * q[..., 1::2]               # [n, H, d/2]
        kc = k[..., 0::2] + 1j * k[..., 1::2]               # [n, Hkv, d/2]
        qc = qc * rule.lam[:, None, None]
        rot = np.exp(1j * rule.relpos[:, :, None] * self.theta[None, None, :])  # [n, n, d/2]
        out = np.zeros((n, n_head, v.shape[-1]))
        for h in range(n_head):
            hk = h // group
            # <R(p) q_i, k_j> = Re(sum_d q_i,d * e^{i p theta_d} * conj(k_j,d))
            scores = np.real(np.einsum("id,ijd,jd->ij", qc[:, h], rot, np.conj(kc[:, hk]))) / np.sqrt(d)
            scores = np.where(rule.allowed, scores, -np.inf)
            scores -= scores.max(axis=1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=1, keepdims=True)
            out[:, h] = p @ v[:, hk]
        return out

    def logits(self, tokens: list[int] | np.ndarray, rule: AttentionRule | None = None) -> np.ndarray:
        tokens = np.asarray(tokens)
        n = len(tokens)
        rule = rule or vanilla_rule(n)
        t = self.t
        x = t["token_embd.weight"][tokens]
        for il in range(self.n_layer):
            p = f"blk.{il}."
            h = self._rms(x, t[p + "attn_norm.weight"])
            q = (h @ t[p + "attn_q.weight"].T).reshape(n, self.n_head, self.head_dim)
            k = (h @ t[p + "attn_k.weight"].T).reshape(n, self.n_head_kv, self.head_dim)
            v = (h @ t[p + "attn_v.weight"].T).reshape(n, self.n_head_kv, -1)
            a = self._attention(q, k, v, rule).reshape(n, -1)
            x = x + a @ t[p + "attn_output.weight"].T
            h = self._rms(x, t[p + "ffn_norm.weight"])
            g = h @ t[p + "ffn_gate.weight"].T
            u = h @ t[p + "ffn_up.weight"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ t[p + "ffn_down.weight"].T
        return self._rms(x, t["output_norm.weight"]) @ t["output.weight"].T


def method_rule(method: str, n: int, n_local: int, n_global: int = 0, n_sink: int = 0) -> AttentionRule:
    """DESIGN.md section 1, literally, for a stream of n tokens (positions 0..n-1)."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    d = i - j
    causal = j <= i
    L, G = n_local, n_global
    if method == "vanilla":
        allowed, relpos = causal, d
    elif method == "window":
        allowed, relpos = causal & (d < L), d
    elif method == "lambda-only":
        allowed, relpos = causal & ((d < L) | (j < G)), d
    elif method == "lminf":
        allowed, relpos = causal & ((d < L) | (j < G)), np.where(d < L, d, L)
    elif method == "rerope":
        allowed, relpos = causal, np.minimum(d, L)
    elif method == "streaming":
        # n_local is the window R (the query included); sink s sits at cache-index distance
        S, R = n_sink, n_local
        allowed = causal & ((j < S) | (d < R))
        relpos = np.where(d < R, d, np.minimum(R - 1, i - S) + (S - j))
    else:
        raise ValueError(f"no oracle rule for {method}")
    return AttentionRule(allowed=allowed, relpos=np.where(allowed, relpos, 0), lam=np.ones(n))


def mesa_schedule(n: int, n_ctx_train: int, first_chunk: int = 100, last_context: int = 512,
                  gen_budget: int = 50) -> tuple[bool, int, int]:
    """DESIGN.md 1.2, the authors' split rule: (chunked, C, N)."""
    c0 = n_ctx_train - 2 * first_chunk
    if n < n_ctx_train - gen_budget:
        return False, c0, 0
    t = n + gen_budget - last_context - first_chunk
    if t <= 0:
        return True, c0, 0
    n_mid, rem = divmod(t, c0)
    if rem < 200:
        return True, c0, n_mid
    c = t // (n_mid + 1)
    return True, c, t // c


def stair_pos(j: np.ndarray, s: int, e: int) -> np.ndarray:
    return np.where(j >= s, j, (s - 1) - (s - 1 - j) // e)


def mesa_rule(n: int, n_prompt: int, n_ctx_train: int, first_chunk: int, stair_width: int, last_context: int,
              gen_budget: int) -> AttentionRule:
    """Mesa-Extrapolation over a stream of n tokens whose first n_prompt were the prompt (the rest generated)."""
    F, E, L = first_chunk, stair_width, n_ctx_train
    chunked, C, N = mesa_schedule(n_prompt, L, F, last_context, gen_budget)
    j = np.arange(n)
    allowed = np.zeros((n, n), dtype=bool)
    relpos = np.zeros((n, n), dtype=np.int64)
    lam = np.ones(n)
    for i in range(n):
        causal = j <= i
        if chunked and F <= i < F + N * C and i < n_prompt:  # middle chunk
            s_k = F + ((i - F) // C) * C
            allowed[i] = causal & ((j < F) | (j >= s_k))
            relpos[i] = np.where(j >= s_k, i - j, F + (i - s_k) - j)
            continue
        allowed[i] = causal
        relpos[i] = i - j
        n_kv = n_prompt if (chunked and i < n_prompt) else i + 1
        if (i >= n_prompt or (chunked and i >= F)) and n_kv > L:  # last chunk and later tokens
            s = n_kv - ((n_kv - 1) % C)
            relpos[i] = i - stair_pos(j, s, E)
            lam[i] = max(1.0, np.log(i + 1) / np.log(L))
    return AttentionRule(allowed=allowed, relpos=np.where(allowed, relpos, 0), lam=lam)


def selfextend_rule(n: int, group: int, neighbor: int) -> AttentionRule:
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    d = i - j
    W, G = neighbor, group
    relpos = np.where(d < W, d, i // G - j // G + W - W // G)
    allowed = j <= i
    return AttentionRule(allowed=allowed, relpos=np.where(allowed, relpos, 0), lam=np.ones(n))
