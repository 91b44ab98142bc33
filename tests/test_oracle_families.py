"""Every method on every model family equals the numpy oracle, token by token (prefill, then one-token
decodes), for the KV cache types, flash attention on/off and several ubatch sizes.

Families: tiny_gguf.FAMILIES (llama and its linear / YaRN / llama3 RoPE scalings, qwen2, qwen3, phi3) and,
apart, tiny_gguf.FAMILIES_ISWA (gemma2, gemma3: interleaved sliding-window layers, where the sliding layers
keep llama.cpp's own window whatever the method). `vanilla` runs llama.cpp's stock graph: its cases prove
the oracle itself on each family.

CI runs a deterministic sample: each (family, method) pair once, except that each method runs on one of
llama's three RoPE scalings (vanilla on all three), with a KV configuration and ubatch size that rotate over the
pairs. FARCTX_FULL_MATRIX=1 (scripts/family-matrix) runs every family x method x KV configuration x ubatch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from helpers import KV_CONFIGS, Tolerance, engine_logits, kv_id, random_tokens, tolerance
from oracle import (AttentionRule, OracleModel, auto_rule, dca_rule, mesa_rule, mesa_schedule, method_rule,
                    selfextend_rule, string_rule, vanilla_rule)
from test_oracle_mesa import MESA, N_DECODE, decode_tolerance
from tiny_gguf import FAMILIES, FAMILIES_ISWA, family_config, write_tiny_gguf

FULL_MATRIX = os.environ.get("FARCTX_FULL_MATRIX", "") not in ("", "0")
UBATCHES = [1, 7, 64]
# one thread: the tiny models are overhead-bound, and ggml's thread barriers spin badly on shared cores
# (measured on 2 busy cores: 6 s for a 160-token ubatch-7 run with 2 batch threads, 0.5 s with 1)
THREADS = dict(n_threads=1, n_threads_batch=1)
L_TR = 32        # every tiny family's n_ctx_train: the methods' defaults derive from it
N_GLOBAL = 10    # lminf's default n_global
N_SINK = 4       # streaming's default n_sink (its window is then L_TR - N_SINK)
SELFEXTEND = dict(group=4, neighbor=8)
DCA = dict(chunk_size=12, local_window=4)  # chunks of 8: prompts of many chunks, the previous chunk's query clamped
STRING = dict(shifted_offset=12, local_value=4)  # most keys of a 128-token stream shifted


@dataclass(frozen=True)
class MethodCase:
    """A method's stream: n_tokens, the first n_prefill in one eval, its engine parameters and its oracle rule."""

    method: str
    n_tokens: int
    n_prefill: int
    rule: Callable[[int], AttentionRule]
    params: dict[str, int] = field(default_factory=dict)


def _mesa_rule(n: int) -> AttentionRule:
    return mesa_rule(n, MESA_PROMPT, L_TR, **MESA)


MESA_PROMPT = 100  # 3 middle chunks with a remainder
CASES: dict[str, MethodCase] = {
    "vanilla": MethodCase("vanilla", 96, 61, vanilla_rule),
    "lminf": MethodCase("lminf", 160, 100, lambda n: method_rule("lminf", n, L_TR, N_GLOBAL)),
    "window": MethodCase("window", 160, 100, lambda n: method_rule("window", n, L_TR, N_GLOBAL)),
    "lambda-only": MethodCase("lambda-only", 160, 100, lambda n: method_rule("lambda-only", n, L_TR, N_GLOBAL)),
    "rerope": MethodCase("rerope", 160, 100, lambda n: method_rule("rerope", n, L_TR, N_GLOBAL)),
    "streaming": MethodCase("streaming", 160, 100, lambda n: method_rule("streaming", n, L_TR - N_SINK, n_sink=N_SINK)),
    "mesa": MethodCase("mesa", MESA_PROMPT + N_DECODE, MESA_PROMPT, _mesa_rule, dict(MESA)),
    "selfextend": MethodCase("selfextend", 128, 96, lambda n: selfextend_rule(n, **SELFEXTEND), dict(SELFEXTEND)),
    "dca": MethodCase("dca", 128, 96, lambda n: dca_rule(n, **DCA), dict(DCA)),
    "string": MethodCase("string", 128, 96, lambda n: string_rule(n, **STRING), dict(STRING)),
    "auto": MethodCase("auto", 128, 96, lambda n: auto_rule(n, L_TR, **DCA), dict(DCA)),
}
METHODS = list(CASES)


# llama's RoPE scalings: the sample gives each of them vanilla and every third other method, in turn
SCALINGS = ["llama-linear", "llama-yarn", "llama3"]


def sample_pairs(families: list[str]) -> list[tuple[str, str]]:
    """The (family, method) pairs of the CI sample: every pair, except that a RoPE scaling of llama runs vanilla
    (the oracle on that scaling) and the methods i = its index mod 3 (each method on one scaling)."""
    return [(f, m) for f in families for i, m in enumerate(METHODS)
            if f not in SCALINGS or m == "vanilla" or (i - 1) % len(SCALINGS) == SCALINGS.index(f)]


def matrix(families: list[str]) -> list[tuple[str, str, tuple[int, int, bool], int]]:
    """(family, method, kv, ubatch): all of them with FARCTX_FULL_MATRIX, else each pair of the sample once, the
    KV configuration and the ubatch rotating over the pairs (deterministic)."""
    if FULL_MATRIX:
        return [(f, m, kv, ub) for f in families for m in METHODS for kv in KV_CONFIGS for ub in UBATCHES]
    out = []
    for k, (f, m) in enumerate(sample_pairs(families)):
        out.append((f, m, KV_CONFIGS[k % len(KV_CONFIGS)], UBATCHES[k % len(UBATCHES)]))
    return out


def case_id(case: tuple[str, str, tuple[int, int, bool], int]) -> str:
    family, method, kv, ubatch = case
    return f"{family}-{method}-{kv_id(kv)}-ub{ubatch}"


def family_tolerance(family: str, type_k: int, type_v: int, flash_attn: bool) -> Tolerance:
    """The suite's tolerance; with F32 K/V and no flash attention the gemma families get a relative bound:
    llama.cpp's CPU GELU reads an F16 table (modelled by oracle.gelu_ggml_cpu), and where an input sits on an
    F16 rounding boundary a 1e-7 difference upstream moves that activation by one F16 step (measured:
    2.1e-4 max, 1.1e-5 mean, relative to the logit scale)."""
    tol = tolerance(type_k, type_v, flash_attn)
    if family_config(family).arch in ("gemma2", "gemma3") and tol.max_abs is not None:
        return Tolerance(max_rel=1e-3, mean_rel=5e-5)
    return tol


class References:
    """The families' GGUFs and oracle logits, made once per session on first use."""

    def __init__(self, directory: Path, tokenizer_source: Path) -> None:
        self.directory, self.tokenizer_source = directory, tokenizer_source
        self.paths: dict[str, Path] = {}
        self.oracles: dict[str, OracleModel] = {}
        self.logits: dict[tuple[str, str], tuple[list[int], np.ndarray]] = {}

    def path(self, family: str) -> Path:
        if family not in self.paths:
            self.paths[family] = write_tiny_gguf(self.directory / f"{family}.gguf", self.tokenizer_source,
                                                 family_config(family))
        return self.paths[family]

    def oracle(self, family: str) -> OracleModel:
        if family not in self.oracles:
            self.oracles[family] = OracleModel(self.path(family))
        return self.oracles[family]

    def tokens(self, method: str) -> list[int]:
        """One stream for every family and method; each method reads its first n_tokens."""
        return random_tokens(max(c.n_tokens for c in CASES.values()), seed=40)[: CASES[method].n_tokens]

    def reference(self, family: str, method: str) -> tuple[list[int], np.ndarray]:
        if (family, method) not in self.logits:
            case = CASES[method]
            tokens = self.tokens(method)
            self.logits[family, method] = tokens, self.oracle(family).logits(tokens, case.rule(case.n_tokens))
        return self.logits[family, method]

    def vanilla(self, family: str, n_tokens: int) -> np.ndarray:
        """The vanilla logits of the stream's first n_tokens (causal: a prefix of the longest stream's)."""
        longest = max(CASES, key=lambda m: CASES[m].n_tokens)
        if (family, "vanilla-longest") not in self.logits:
            tokens = self.tokens(longest)
            self.logits[family, "vanilla-longest"] = tokens, self.oracle(family).logits(tokens)
        return self.logits[family, "vanilla-longest"][1][:n_tokens]


@pytest.fixture(scope="session")
def refs(tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> References:
    return References(tmp_path_factory.mktemp("families"), default_model)


def check_method(refs: References, family: str, method: str, kv: tuple[int, int, bool], n_ubatch: int) -> None:
    case = CASES[method]
    tokens, ref = refs.reference(family, method)
    type_k, type_v, fa = kv
    stats: dict[str, int] = {}
    got = engine_logits(refs.path(family), tokens, case.n_prefill, n_ubatch=n_ubatch, type_k=type_k, type_v=type_v,
                        flash_attn=fa, method=method, n_ctx=256, stats=stats, **THREADS, **case.params)
    what = f"{family} {method} {kv_id(kv)} ubatch {n_ubatch}"
    tol = family_tolerance(family, type_k, type_v, fa)
    if method in ("dca", "auto"):
        # dca (and auto past the trained context) rotates each cached key in place at most twice: a quantized K is rounded again each time
        # (measured on llama-yarn, K Q8_0: 6.2% of the logit scale against the 6% bound of one rounding)
        tol = decode_tolerance(tol, type_k, 2)
    if method != "mesa":
        tol.check(got, ref, what)
        return
    # from mesa's last chunk on the cache is read rotated in place: a quantized K is rounded again each time
    _, chunk, n_middle = mesa_schedule(MESA_PROMPT, L_TR, MESA["first_chunk"], MESA["last_context"],
                                       MESA["gen_budget"])
    last = MESA["first_chunk"] + n_middle * chunk
    tol.check(got[:last], ref[:last], f"{what} first and middle chunks")
    decode_tolerance(tol, type_k, stats["n_cache_rotations"]).check(got[last:], ref[last:], f"{what} last chunk on")


@pytest.mark.parametrize("case", matrix(list(FAMILIES)), ids=case_id)
def test_family_method_matches_oracle(refs, case):
    check_method(refs, *case)


# gemma2 / gemma3: the methods on the global layers, llama.cpp's window on the sliding ones
@pytest.mark.parametrize("case", matrix(list(FAMILIES_ISWA)), ids=case_id)
def test_iswa_family_method_matches_oracle(refs, case):
    check_method(refs, *case)


@pytest.mark.parametrize("family", list(FAMILIES) + list(FAMILIES_ISWA))
def test_methods_differ_from_vanilla_in_the_oracle(refs, family):
    """Past n_ctx_train every method moves each family's logits far past any tolerance: the checks can fail."""
    for method in METHODS[1:]:
        tokens, ref = refs.reference(family, method)
        vanilla = refs.vanilla(family, len(tokens))
        n_same = SELFEXTEND["neighbor"]  # every method is vanilla over its first tokens (selfextend: W of them)
        if method != "string":  # string scales every logit
            assert np.abs(ref[:n_same] - vanilla[:n_same]).max() < 1e-9, (family, method)
        assert np.abs(ref - vanilla).max() > 0.05 * np.abs(vanilla).max(), (family, method)


@pytest.mark.parametrize("family", list(FAMILIES) + list(FAMILIES_ISWA))
def test_oracle_is_sensitive_to_each_family_feature(refs, family):
    """Positions matter on every family: a bounded distance moves the logits well past every tolerance."""
    tokens, ref = refs.reference(family, "vanilla")
    assert np.abs(refs.vanilla(family, len(tokens)) - ref).max() < 1e-9  # the prefix property the others rely on
    rule = vanilla_rule(len(tokens))
    rule.relpos = np.minimum(rule.relpos, 4)
    moved = refs.oracle(family).logits(tokens, rule)
    assert np.abs(moved - ref)[5:].max() > 0.05 * np.abs(ref).max()


def test_full_matrix_size():
    """The sample covers every (family, method) pair but the scalings', each method on one scaling and vanilla on
    all; the full matrix every combination."""
    n_pairs = (len(FAMILIES) + len(FAMILIES_ISWA)) * len(METHODS)
    n = len(matrix(list(FAMILIES))) + len(matrix(list(FAMILIES_ISWA)))
    n_sample = n_pairs - (len(SCALINGS) - 1) * (len(METHODS) - 1)
    assert n == (n_pairs * len(KV_CONFIGS) * len(UBATCHES) if FULL_MATRIX else n_sample)
    on_scalings = [m for f, m in sample_pairs(SCALINGS) if m != "vanilla"]
    assert sorted(on_scalings) == sorted(METHODS[1:])
