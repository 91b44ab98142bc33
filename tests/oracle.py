"""The test oracle: a numpy (float64) forward pass of a GGUF of one of the families farctx runs on
(llama with its RoPE scalings, qwen2, qwen3, phi3, gemma2, gemma3), as llama.cpp's graphs compute them.

A method is given as three arrays over the stream (docs/methods.md):
  allowed[i, j]  bool, query i may attend key j (the oracle adds nothing: causality included)
  relpos[i, j]   the RoPE distance p_q - p_k used for that pair
  lam[i]         a factor on query i
The rule applies to the global layers; the sliding-window layers of gemma2/gemma3 always use
llama.cpp's own rule (causal, keys with i - j < window, true distances, lam 1), whatever the method.
The engine's logits must match `logits(...)` token by token.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader

# RoPE layouts (llama.cpp's llama_model_rope_type): NORM rotates adjacent pairs, NEOX the two halves
NEOX_ARCHS = {"qwen2", "qwen3", "phi3", "gemma2", "gemma3"}
ARCHS = {"llama"} | NEOX_ARCHS
GEMMA_ARCHS = {"gemma2", "gemma3"}
# llama.cpp's hparams defaults (src/llama-hparams.h) and the YaRN corrections it never reads from GGUF here
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0
DEFAULT_SWA_BASE = 10000.0
GEMMA2_ATTN_SOFTCAP, GEMMA2_FINAL_SOFTCAP = 50.0, 30.0


@dataclass
class AttentionRule:
    allowed: np.ndarray  # [n, n] bool
    relpos: np.ndarray   # [n, n] int
    lam: np.ndarray      # [n] float


def vanilla_rule(n: int) -> AttentionRule:
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    return AttentionRule(allowed=j <= i, relpos=(i - j), lam=np.ones(n))


def sliding_window_rule(n: int, window: int) -> AttentionRule:
    """llama.cpp's LLAMA_SWA_TYPE_STANDARD (llama_hparams::is_masked_swa): key j is masked once i - j >= window."""
    rule = vanilla_rule(n)
    rule.allowed &= rule.relpos < window
    rule.relpos = np.where(rule.allowed, rule.relpos, 0)
    return rule


# ---------------------------------------------------------------------------------------------- config


class Fields:
    """The key/value fields of a GGUF, `{arch}.`-prefixed keys by their suffix."""

    def __init__(self, reader: GGUFReader) -> None:
        self.reader = reader
        self.arch = self.string("general.architecture")

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.reader.fields

    def raw(self, key: str) -> list:
        f = self.reader.fields[f"{self.arch}.{key}"]
        return [f.parts[i].tolist()[0] for i in f.data]

    def number(self, key: str, default: float | None = None) -> float:
        if not self.has(key):
            if default is None:
                raise KeyError(f"{self.arch}.{key}")
            return default
        return self.raw(key)[0]

    def string(self, full_key: str) -> str:
        f = self.reader.fields[full_key]
        return bytes(f.parts[f.data[0]]).decode()

    def arch_string(self, key: str, default: str) -> str:
        return self.string(f"{self.arch}.{key}") if self.has(key) else default


@dataclass(frozen=True)
class Rope:
    n_rot: int            # rotated dimensions (the first n_rot of a head)
    neox: bool            # pairs (d, d + n_rot/2) instead of (2d, 2d + 1)
    freqs: np.ndarray     # [n_rot/2] angle per position of each pair
    magnitude: float      # ggml's mscale on the rotated q and k: YaRN's 1 + 0.1 ln(1/freq_scale), else 1


@dataclass(frozen=True)
class Layer:
    rope: Rope
    window: int | None    # a sliding-window layer (keys with i - j < window), None for a global layer


@dataclass(frozen=True)
class Family:
    arch: str
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ctx_train: int
    eps: float
    embd_scale: float             # gemma: sqrt(n_embd) on the token embeddings
    q_scale: float                # the factor on q.k
    attn_softcap: float | None    # gemma2: cap * tanh(logit / cap) before the softmax
    final_softcap: float | None   # gemma2 (gemma3 if set): the same on the output logits
    gelu: bool                    # gemma: GELU-gated FFN (else SiLU)
    layers: list[Layer]


def rope_freq_scale(fields: Fields) -> float:
    """cparams.rope_freq_scale: 1/rope.scaling.factor (or the old rope.scale_linear), 1 for scaling type none."""
    if fields.arch_string("rope.scaling.type", "linear") == "none":
        return 1.0
    factor = fields.number("rope.scaling.factor", 0.0) or fields.number("rope.scale_linear", 0.0)
    return 1.0 if factor == 0.0 else 1.0 / factor


def yarn_ext_factor(fields: Fields) -> float:
    return 1.0 if fields.arch_string("rope.scaling.type", "linear") == "yarn" else 0.0


def rope_attn_factor(fields: Fields, freq_scale: float) -> float:
    """cparams.yarn_attn_factor (llama-context.cpp): with YaRN, get_mscale(factor) / (1 + 0.1 ln factor),
    which cancels ggml's own magnitude correction (= 1 here); times rope.scaling.attn_factor."""
    attn_factor = 1.0
    if yarn_ext_factor(fields) != 0.0:
        factor = 1.0 / freq_scale
        mscale = 1.0 if factor <= 1.0 else 0.1 * math.log(factor) + 1.0
        attn_factor = mscale / (1.0 + 0.1 * math.log(factor))
    return attn_factor * fields.number("rope.scaling.attn_factor", 1.0)


def yarn_ramp(n_rot: int, base: float, n_ctx_orig: int) -> np.ndarray:
    """ggml's rope_yarn_ramp over the pairs: 1 where YaRN extrapolates (keeps the trained frequency),
    0 where it interpolates, linear between the correction dims (ggml_rope_yarn_corr_dims)."""

    def corr_dim(beta: float) -> float:
        return n_rot * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr_dim(YARN_BETA_FAST)))
    high = min(n_rot - 1.0, math.ceil(corr_dim(YARN_BETA_SLOW)))
    y = (np.arange(n_rot // 2) - low) / max(0.001, high - low)
    return 1.0 - np.clip(y, 0.0, 1.0)


def rope_frequencies(n_rot: int, base: float, freq_scale: float, ext_factor: float, n_ctx_orig: int,
                     factors: np.ndarray | None) -> np.ndarray:
    """The angle per position of each pair, as ggml_rope_cache_init: theta_d = base^(-2d/n_rot) / factor_d,
    scaled by freq_scale, with YaRN's ramp mixing the scaled and unscaled angle."""
    extrap = base ** (-2.0 * np.arange(n_rot // 2) / n_rot)
    if factors is not None:
        extrap = extrap / factors
    interp = freq_scale * extrap
    if ext_factor == 0.0:
        return interp
    mix = yarn_ramp(n_rot, base, n_ctx_orig) * ext_factor
    return interp * (1 - mix) + extrap * mix


def swa_layers(fields: Fields, n_layer: int) -> list[bool]:
    """Which layers slide (llama_hparams::set_swa_pattern): gemma2's period 2, gemma3's period 6 (only with a
    sliding_window), the last layer of each period global; attention.sliding_window_pattern overrides it."""
    period = {"gemma2": 2, "gemma3": 6}.get(fields.arch)
    if period is None or (fields.arch == "gemma3" and fields.number("attention.sliding_window", 0) <= 0):
        return [False] * n_layer
    if fields.has("attention.sliding_window_pattern"):
        values = fields.raw("attention.sliding_window_pattern")
        if len(values) == n_layer:
            return [bool(v) for v in values]
        period = int(values[0])
    return [period == 0 or il % period < period - 1 for il in range(n_layer)]


def sliding_window(fields: Fields) -> int:
    return int(fields.number("attention.sliding_window", 4096))  # gemma2's default


def swa_rope_base(fields: Fields, base: float) -> float:
    """hparams.rope_freq_base_train_swa: gemma2 starts from the global base, gemma3 from llama.cpp's default."""
    return fields.number("rope.freq_base_swa", base if fields.arch == "gemma2" else DEFAULT_SWA_BASE)


def query_scale(fields: Fields, n_layer: int, n_embd: int, n_head: int, head_dim: int) -> float:
    """1/sqrt(head_dim); gemma's 27B (query_pre_attn_scalar = n_embd / n_head) is told by its layer count."""
    if (fields.arch, n_layer) in (("gemma2", 46), ("gemma3", 62)):
        return 1.0 / math.sqrt(n_embd // n_head)
    return 1.0 / math.sqrt(head_dim)


def softcaps(fields: Fields) -> tuple[float | None, float | None]:
    if fields.arch == "gemma2":
        return (fields.number("attn_logit_softcapping", GEMMA2_ATTN_SOFTCAP),
                fields.number("final_logit_softcapping", GEMMA2_FINAL_SOFTCAP))
    if fields.arch == "gemma3":
        return None, fields.number("final_logit_softcapping", 0.0) or None
    return None, None


def layer_ropes(fields: Fields, is_swa: list[bool], n_rot: int, factors: np.ndarray | None) -> list[Rope]:
    """Each layer's RoPE: global layers use rope.freq_base and the scaling; gemma's sliding layers their own base
    and no scaling (llama_model::get_rope_freq_base/scale)."""
    base = fields.number("rope.freq_base", 10000.0)
    freq_scale = rope_freq_scale(fields)
    ext_factor = yarn_ext_factor(fields)
    attn_factor = rope_attn_factor(fields, freq_scale)
    n_ctx_orig = int(fields.number("rope.scaling.original_context_length", fields.number("context_length")))
    neox = fields.arch in NEOX_ARCHS

    def rope(layer_base: float, layer_scale: float) -> Rope:
        freqs = rope_frequencies(n_rot, layer_base, layer_scale, ext_factor, n_ctx_orig, factors)
        magnitude = attn_factor * (1.0 + 0.1 * math.log(1.0 / layer_scale)) if ext_factor != 0.0 else attn_factor
        return Rope(n_rot=n_rot, neox=neox, freqs=freqs, magnitude=magnitude)

    swa_scale = freq_scale if fields.arch == "gemma2" else 1.0
    return [rope(swa_rope_base(fields, base), swa_scale) if s else rope(base, freq_scale) for s in is_swa]


def read_family(reader: GGUFReader, tensors: dict[str, np.ndarray]) -> Family:
    fields = Fields(reader)
    if fields.arch not in ARCHS:
        raise ValueError(f"the oracle implements {sorted(ARCHS)}, not {fields.arch}")
    n_embd = int(fields.number("embedding_length"))
    n_head = int(fields.number("attention.head_count"))
    n_layer = int(fields.number("block_count"))
    head_dim = int(fields.number("attention.key_length", n_embd // n_head))
    n_rot = int(fields.number("rope.dimension_count", head_dim))
    factors = tensors.get("rope_freqs.weight") if fields.arch == "llama" else None
    is_swa = swa_layers(fields, n_layer)
    ropes = layer_ropes(fields, is_swa, n_rot, factors)
    window = sliding_window(fields) if any(is_swa) else None
    attn_cap, final_cap = softcaps(fields)
    return Family(
        arch=fields.arch, n_embd=n_embd, n_head=n_head,
        n_head_kv=int(fields.number("attention.head_count_kv", n_head)), head_dim=head_dim,
        n_ctx_train=int(fields.number("context_length")), eps=float(fields.number("attention.layer_norm_rms_epsilon")),
        embd_scale=math.sqrt(n_embd) if fields.arch in GEMMA_ARCHS else 1.0,
        q_scale=query_scale(fields, n_layer, n_embd, n_head, head_dim),
        attn_softcap=attn_cap, final_softcap=final_cap, gelu=fields.arch in GEMMA_ARCHS,
        layers=[Layer(rope=r, window=window if s else None) for r, s in zip(ropes, is_swa)],
    )


def read_tensors(reader: GGUFReader) -> dict[str, np.ndarray]:
    """Every tensor in float64, numpy shape = reversed ggml ne; the output tied to token_embd when absent."""
    t = {}
    for tensor in reader.tensors:
        shape = tuple(int(x) for x in reversed(tensor.shape.tolist()))
        t[tensor.name] = np.asarray(tensor.data, dtype=np.float64).reshape(shape)
    t.setdefault("output.weight", t["token_embd.weight"])
    return t


# ---------------------------------------------------------------------------------------------- math


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_ggml_cpu(x: np.ndarray) -> np.ndarray:
    """ggml's CPU GELU (tanh approximation) under GGML_GELU_FP16: the input rounded to F16, the result read
    from an F16 table; identity above 10, 0 below -10."""
    xh = x.astype(np.float16).astype(np.float64)
    y = 0.5 * xh * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * xh * (1.0 + 0.044715 * xh * xh)))
    y = y.astype(np.float16).astype(np.float64)
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y))


def softcap(x: np.ndarray, cap: float | None) -> np.ndarray:
    return x if cap is None else cap * np.tanh(x / cap)


def rope_pairs(x: np.ndarray, rope: Rope) -> tuple[np.ndarray, np.ndarray]:
    """x [..., d] -> (rotated pairs as complex [..., n_rot/2], the unrotated rest [..., d - n_rot])."""
    r = rope.n_rot
    if rope.neox:
        pairs = x[..., : r // 2] + 1j * x[..., r // 2 : r]
    else:
        pairs = x[..., 0:r:2] + 1j * x[..., 1:r:2]
    return pairs, x[..., r:]


# ---------------------------------------------------------------------------------------------- model


class OracleModel:
    def __init__(self, path: Path) -> None:
        reader = GGUFReader(str(path))
        self.t = read_tensors(reader)
        self.family = read_family(reader, self.t)
        f = self.family
        self.arch = f.arch
        self.n_head, self.n_head_kv, self.head_dim = f.n_head, f.n_head_kv, f.head_dim
        self.n_embd, self.n_layer, self.n_ctx_train = f.n_embd, len(f.layers), f.n_ctx_train
        self.eps = f.eps

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return rms_norm(x, w, self.eps)

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        y = x @ self.t[name + ".weight"].T
        bias = self.t.get(name + ".bias")
        return y if bias is None else y + bias

    def _rotations(self, rule: AttentionRule, rope: Rope) -> np.ndarray:
        """e^{i relpos w_d} for every pair (i, j) [n, n, n_rot/2], times ggml's magnitude on q and on k."""
        distances = np.arange(rule.relpos.min(), rule.relpos.max() + 1)
        table = np.exp(1j * distances[:, None] * rope.freqs[None, :]) * rope.magnitude**2
        return table[rule.relpos - distances[0]]

    def _scores(self, q: np.ndarray, k: np.ndarray, rule: AttentionRule, rope: Rope, rot: np.ndarray) -> np.ndarray:
        """q [n, d], k [n, d] (un-rotated, one head each) -> the logits [n, n] with RoPE at rule.relpos:
        <R(p_i) q, R(p_j) k> = Re(sum_d q_d e^{i (p_i - p_j) w_d} conj(k_d))."""
        qc, q_rest = rope_pairs(q * rule.lam[:, None], rope)
        kc, k_rest = rope_pairs(k, rope)
        rotated = np.real(qc[:, None, :] * rot * np.conj(kc)[None, :, :]).sum(axis=-1)
        return (rotated + q_rest @ k_rest.T) * self.family.q_scale

    def _attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, rule: AttentionRule, rope: Rope) -> np.ndarray:
        """q [n, H, d], k/v [n, Hkv, d] (un-rotated) -> [n, H, d_v]."""
        n, n_head, _ = q.shape
        group = n_head // self.n_head_kv
        rot = self._rotations(rule, rope)
        out = np.zeros((n, n_head, v.shape[-1]))
        for h in range(n_head):
            hk = h // group
            scores = softcap(self._scores(q[:, h], k[:, hk], rule, rope, rot), self.family.attn_softcap)
            scores = np.where(rule.allowed, scores, -np.inf)
            scores -= scores.max(axis=1, keepdims=True)
            p = np.exp(scores)
            p /= p.sum(axis=1, keepdims=True)
            out[:, h] = p @ v[:, hk]
        return out

    def _qkv(self, h: np.ndarray, p: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, d = len(h), self.head_dim
        n_q, n_kv = self.n_head * d, self.n_head_kv * d
        if p + "attn_qkv.weight" in self.t:  # phi3: one fused projection, [q; k; v]
            qkv = self._linear(h, p + "attn_qkv")
            q, k, v = qkv[:, :n_q], qkv[:, n_q : n_q + n_kv], qkv[:, n_q + n_kv :]
        else:
            q, k, v = self._linear(h, p + "attn_q"), self._linear(h, p + "attn_k"), self._linear(h, p + "attn_v")
        q, k, v = q.reshape(n, self.n_head, d), k.reshape(n, self.n_head_kv, d), v.reshape(n, self.n_head_kv, -1)
        if p + "attn_q_norm.weight" in self.t:  # qwen3, gemma3: RMS norm per head, before RoPE
            q = self._rms(q, self.t[p + "attn_q_norm.weight"])
            k = self._rms(k, self.t[p + "attn_k_norm.weight"])
        return q, k, v

    def _ffn(self, h: np.ndarray, p: str) -> np.ndarray:
        if p + "ffn_gate.weight" in self.t:
            gate, up = self._linear(h, p + "ffn_gate"), self._linear(h, p + "ffn_up")
        else:  # phi3: ffn_up holds [gate; up]
            both = self._linear(h, p + "ffn_up")
            gate, up = np.split(both, 2, axis=-1)
        act = gelu_ggml_cpu(gate) if self.family.gelu else silu(gate)
        return self._linear(act * up, p + "ffn_down")

    def _post_norm(self, x: np.ndarray, name: str) -> np.ndarray:
        """gemma's post_attention_norm / post_ffw_norm on a branch output (absent elsewhere)."""
        w = self.t.get(name)
        return x if w is None else self._rms(x, w)

    def layer_rule(self, il: int, rule: AttentionRule) -> AttentionRule:
        """The method's rule on a global layer, llama.cpp's own sliding window on a sliding layer."""
        window = self.family.layers[il].window
        return rule if window is None else sliding_window_rule(len(rule.lam), window)

    def logits(self, tokens: list[int] | np.ndarray, rule: AttentionRule | None = None) -> np.ndarray:
        tokens = np.asarray(tokens)
        n = len(tokens)
        rule = rule or vanilla_rule(n)
        t = self.t
        x = t["token_embd.weight"][tokens] * self.family.embd_scale
        for il, layer in enumerate(self.family.layers):
            p = f"blk.{il}."
            q, k, v = self._qkv(self._rms(x, t[p + "attn_norm.weight"]), p)
            a = self._attention(q, k, v, self.layer_rule(il, rule), layer.rope).reshape(n, -1)
            x = x + self._post_norm(self._linear(a, p + "attn_output"), p + "post_attention_norm.weight")
            h = self._rms(x, t[p + "ffn_norm.weight"])
            x = x + self._post_norm(self._ffn(h, p), p + "post_ffw_norm.weight")
        out = self._rms(x, t["output_norm.weight"]) @ t["output.weight"].T
        return softcap(out, self.family.final_softcap)


def method_rule(method: str, n: int, n_local: int, n_global: int = 0, n_sink: int = 0) -> AttentionRule:
    """docs/methods.md, literally, for a stream of n tokens (positions 0..n-1)."""
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


def rule_for(method: str, n: int, params: dict[str, int], n_ctx_train: int, n_prompt: int = 0) -> AttentionRule | None:
    """The rule of any method under its parameters (resolved: n_local given where the method reads it) for a stream
    of n tokens whose prompt is the first n_prompt (mesa); None for vanilla (the model's own causal mask)."""
    if method == "vanilla":
        return None
    if method == "mesa":
        return mesa_rule(n, n_prompt, n_ctx_train, **params)
    if method == "selfextend":
        return selfextend_rule(n, params["group"], params["neighbor"])
    if method == "dca":
        return dca_rule(n, params["chunk_size"], params["local_window"])
    if method == "string":
        return string_rule(n, params["shifted_offset"], params["local_value"])
    if method == "auto":
        return auto_rule(n, n_ctx_train, params["chunk_size"], params["local_window"])
    return method_rule(method, n, params["n_local"], params.get("n_global", 0), params.get("n_sink", 0))


def mesa_schedule(n: int, n_ctx_train: int, first_chunk: int = 100, last_context: int = 512,
                  gen_budget: int = 50) -> tuple[bool, int, int]:
    """docs/methods.md 1.2, the authors' split rule: (chunked, C, N)."""
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


def dca_rule(n: int, chunk_size: int, local_window: int) -> AttentionRule:
    """Dual Chunk Attention (docs/methods.md, 1.4): chunks of s = chunk_size - local_window; a key at j mod s; the
    query at i mod s (same chunk), min(i mod s + s, chunk_size) (previous chunk), min(2s - 1, chunk_size) (earlier)."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    s = chunk_size - local_window
    ci, cj = i // s, j // s
    q_succ = np.minimum(i % s + s, chunk_size)
    q_inter = min(2 * s - 1, chunk_size)
    relpos = np.where(cj == ci, i - j, np.where(cj == ci - 1, q_succ - j % s, q_inter - j % s))
    allowed = j <= i
    return AttentionRule(allowed=allowed, relpos=np.where(allowed, relpos, 0), lam=np.ones(n))


def auto_rule(n: int, n_ctx_train: int, chunk_size: int, local_window: int) -> AttentionRule:
    """auto (docs/methods.md, 1.6): the queries before n_ctx_train at true distances, the later ones by dca_rule."""
    rule = dca_rule(n, chunk_size, local_window)
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    relpos = np.where(i < n_ctx_train, i - j, rule.relpos)
    return AttentionRule(allowed=rule.allowed, relpos=np.where(rule.allowed, relpos, 0), lam=rule.lam)


def selfextend_rule(n: int, group: int, neighbor: int) -> AttentionRule:
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    d = i - j
    W, G = neighbor, group
    relpos = np.where(d < W, d, i // G - j // G + W - W // G)
    allowed = j <= i
    return AttentionRule(allowed=allowed, relpos=np.where(allowed, relpos, 0), lam=np.ones(n))


# STRING's factor on the reference's rotary tables, 0.1 ln 2 + 1, reaches a logit twice (query and key)
STRING_LOGIT_SCALE = (0.1 * np.log(2.0) + 1.0) ** 2


def string_rule(n: int, shifted_offset: int, local_value: int) -> AttentionRule:
    """STRING (docs/methods.md, 1.5): distances below S true, from S on d - S + W; every logit times the factor."""
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    d = i - j
    S, W = shifted_offset, local_value
    relpos = np.where(d < S, d, d - S + W)
    allowed = j <= i
    return AttentionRule(allowed=allowed, relpos=np.where(allowed, relpos, 0), lam=np.full(n, STRING_LOGIT_SCALE))

