"""The patched llama.h's attention-extrapolation API reached directly (ctypes), without libfarctx: what
llama_set_attn_extrap accepts and refuses, and what llama_decode does with a fill callback written here."""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from helpers import random_tokens

import farctx  # noqa: F401  (first: points llama_cpp at the patched library)
import llama_cpp

OK, ERR_MODE, ERR_PARAM, ERR_MODEL, ERR_CONTEXT = 0, -1, -2, -3, -4
NONE, CUSTOM = 0, 1
I32P, F32P = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)


class Ubatch(ctypes.Structure):
    """struct llama_attn_extrap_ubatch"""

    _fields_ = [
        ("n_tokens", ctypes.c_int32), ("n_kv", ctypes.c_int32), ("n_seg2", ctypes.c_int32),
        ("q_pos", I32P), ("kv_pos", I32P), ("mask", F32P),
        ("q_delta", I32P), ("k_delta", I32P), ("q_scale", F32P),
        ("seg2_mask", F32P), ("seg2_q_delta", I32P), ("seg2_k_delta", I32P), ("seg2_pos", I32P),
        ("seq_id", ctypes.c_int32), ("n_k_move", ctypes.c_int32), ("k_move_cell", I32P), ("k_move_delta", I32P),
    ]


FILL = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.POINTER(Ubatch))


class Params(ctypes.Structure):
    """struct llama_attn_extrap_params"""

    _fields_ = [
        ("mode", ctypes.c_int32), ("n_seg2", ctypes.c_int32), ("kv_first", ctypes.c_int32),
        ("use_q_delta", ctypes.c_bool), ("use_k_delta", ctypes.c_bool), ("use_q_scale", ctypes.c_bool),
        ("use_seg2_k_delta", ctypes.c_bool), ("n_k_move", ctypes.c_int32), ("fill", FILL),
        ("user_data", ctypes.c_void_p),
    ]


def _bind(name: str, restype: object, *argtypes: object) -> Callable[..., object]:
    fn = getattr(llama_cpp.llama_cpp._lib, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


set_attn_extrap = _bind("llama_set_attn_extrap", ctypes.c_int32, ctypes.c_void_p, ctypes.POINTER(Params))
default_params = _bind("llama_attn_extrap_default_params", Params)


def causal(q_pos: np.ndarray, kv_pos: np.ndarray) -> np.ndarray:
    return np.where((kv_pos[None, :] >= 0) & (kv_pos[None, :] <= q_pos[:, None]), 0.0, -math.inf)


def vanilla_rows(ub: Ubatch, seg2_cells: int) -> None:
    """Vanilla attention through the CUSTOM path: the causal mask over the main segment and, in the second
    segment, over its first seg2_cells cells (those below the main segment's first cell, kv_first)."""
    n_tok, n_kv, n_seg2 = ub.n_tokens, ub.n_kv, ub.n_seg2
    q_pos = np.ctypeslib.as_array(ub.q_pos, shape=(n_tok,))
    np.ctypeslib.as_array(ub.mask, shape=(n_tok, n_kv))[:] = causal(q_pos, np.ctypeslib.as_array(ub.kv_pos, shape=(n_kv,)))
    if n_seg2:
        seg2 = causal(q_pos, np.ctypeslib.as_array(ub.seg2_pos, shape=(n_seg2,)))
        seg2[:, seg2_cells:] = -math.inf
        np.ctypeslib.as_array(ub.seg2_mask, shape=(n_tok, n_seg2))[:] = seg2


class Fill:
    """A fill callback in Python: vanilla rows, or an error (non-zero) for the calls listed in `fail_calls`."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail_calls: set[int] = set()
        self.seg2_cells = 0  # cells of the second segment that vanilla attention reads (kv_first)
        self.c_fn = FILL(self._fill)  # kept alive as long as this object

    def _fill(self, _user_data: object, ub_p: object) -> int:
        call = self.calls
        self.calls += 1
        if call in self.fail_calls:
            return 1
        vanilla_rows(ub_p.contents, self.seg2_cells)
        return 0

    def params(self, **fields: object) -> Params:
        p = default_params()
        p.mode, p.fill = CUSTOM, self.c_fn
        for name, value in fields.items():
            setattr(p, name, value)
        return p


@contextmanager
def raw_context(model_path: Path, **cparams: object) -> Iterator[tuple[object, object]]:
    """A llama_model and llama_context made with llama.cpp's own C API; cparams are llama_context_params fields."""
    mparams = llama_cpp.llama_model_default_params()
    model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mparams)
    assert model
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 128, 128, 128, 1
    for name, value in cparams.items():
        setattr(params, name, value)
    ctx = llama_cpp.llama_init_from_model(model, params)
    assert ctx
    try:
        yield model, ctx
    finally:
        llama_cpp.llama_free(ctx)
        llama_cpp.llama_model_free(model)


def decode(ctx: object, tokens: list[int], pos0: int) -> int:
    """llama_decode of tokens at positions pos0.. in sequence 0, logits for the last one."""
    batch = llama_cpp.llama_batch_init(len(tokens), 0, 1)
    try:
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos0 + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        return llama_cpp.llama_decode(ctx, batch)
    finally:
        llama_cpp.llama_batch_free(batch)


def last_logits(model: object, ctx: object) -> np.ndarray:
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()


def test_several_sequences_in_one_unified_cache_refused(tiny_model):
    """Several sequences in one unified cache are refused: their cells would share each query's mask row. One
    KV stream per sequence is accepted (patch 0016: the callback is called per stream; tests/test_oracle_batch.py
    holds it to the oracle)."""
    fill = Fill()
    with raw_context(tiny_model, n_seq_max=2, kv_unified=True) as (_, ctx):
        assert set_attn_extrap(ctx, fill.params()) == ERR_CONTEXT
        assert set_attn_extrap(ctx, default_params()) == OK  # mode NONE: the stock graph, any context
    with raw_context(tiny_model, n_seq_max=2, kv_unified=False) as (_, ctx):
        assert set_attn_extrap(ctx, fill.params()) == OK
    for kv_unified in (True, False):
        with raw_context(tiny_model, n_seq_max=1, kv_unified=kv_unified) as (_, ctx):
            assert set_attn_extrap(ctx, fill.params()) == OK


def test_custom_vanilla_matches_stock(tiny_model):
    """The CUSTOM path with a vanilla mask written in Python gives stock's logits (the binding is right)."""
    tokens = random_tokens(40, seed=61)
    with raw_context(tiny_model) as (model, ctx):
        assert decode(ctx, tokens, 0) == 0
        stock = last_logits(model, ctx)
    fill = Fill()
    with raw_context(tiny_model) as (model, ctx):
        assert set_attn_extrap(ctx, fill.params(use_k_delta=True)) == OK
        assert decode(ctx, tokens, 0) == 0
        assert fill.calls == 1
        np.testing.assert_allclose(last_logits(model, ctx), stock, atol=1e-4)


@contextmanager
def reserve_count() -> Iterator[Callable[[], int]]:
    """Counts llama.cpp's compute-buffer reservations while open: its log lines "sched_reserve: reserving ..."
    (every graph again) and "extrap_reserve_added: reserving ..." (patch 0017: settings the context has not run
    before, reserved in place). farctx's own log receiver is put back afterwards."""
    from farctx.engine import _LOG

    lines: list[str] = []
    callback = llama_cpp.llama_log_callback(lambda _level, text, _data: lines.append(text.decode(errors="replace")))
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    try:
        yield lambda: sum(": reserving ..." in line and line.startswith(("sched_reserve", "extrap_reserve_added"))
                          for line in lines)
    finally:
        llama_cpp.llama_log_set(_LOG._callback, ctypes.c_void_p(0))


# kv_first is not one: the buffers hold every first cell of the main segment, 0 included
# (test_kv_first_moves_without_reserving)
GRAPH_FIELDS = {"n_seg2": 12, "use_q_delta": True, "use_k_delta": True, "use_q_scale": True}


@pytest.mark.parametrize("field", sorted(GRAPH_FIELDS))
def test_every_graph_field_reserves(tiny_model, field):
    """A change of any field that shapes the graph makes the next llama_decode reserve the compute buffers
    again, and only such a change (not kv_first: test_kv_first_moves_without_reserving)."""
    tokens = random_tokens(24, seed=62)
    fill = Fill()
    base = dict(n_seg2=16, kv_first=4)
    with raw_context(tiny_model) as (_, ctx), reserve_count() as reserves:
        assert set_attn_extrap(ctx, fill.params(**base)) == OK
        assert decode(ctx, tokens[:20], 0) == 0
        before = reserves()
        other = Fill()  # another callback and user_data: the same graph
        assert set_attn_extrap(ctx, other.params(**base, user_data=1)) == OK
        assert decode(ctx, tokens[20:21], 20) == 0
        assert reserves() == before
        assert set_attn_extrap(ctx, fill.params(**{**base, field: GRAPH_FIELDS[field]})) == OK
        assert decode(ctx, tokens[21:22], 21) == 0
        assert reserves() == before + 1, f"a change of {field} alone did not reserve"


def test_settings_run_before_keep_the_buffers(tiny_model):
    """Patch 0017: the buffers hold every setting the context has run, so switching back to one (Mesa: the last
    chunk's key deltas and query scale after a prompt's middle chunks, then the next prompt's middle chunks
    again) reserves nothing; a setting not run before reserves once, for itself alone."""
    tokens = random_tokens(40, seed=66)
    fill = Fill()
    middle = dict(n_seg2=16, kv_first=4)
    last = dict(use_k_delta=True, use_q_scale=True)
    with raw_context(tiny_model) as (_, ctx), reserve_count() as reserves:
        assert set_attn_extrap(ctx, fill.params(**middle)) == OK
        assert decode(ctx, tokens[:20], 0) == 0
        before = reserves()
        assert set_attn_extrap(ctx, fill.params(**last)) == OK
        assert decode(ctx, tokens[20:24], 20) == 0
        assert reserves() == before + 1, "a setting not run before did not reserve"
        for a, b, settings in ((24, 28, middle), (28, 32, last), (32, 36, middle), (36, 40, last)):
            assert set_attn_extrap(ctx, fill.params(**settings)) == OK
            assert decode(ctx, tokens[a:b], a) == 0
        assert reserves() == before + 1


def test_kv_first_moves_without_reserving(tiny_model):
    """Patch 0017: the main segment's first cell moving (kv_first 4 -> 8 -> 12, Mesa's middle chunks) or coming
    and going (0 for a prompt's ubatches, n_global for lminf's decoded tokens, 0 for the next prompt) keeps the
    compute buffers, sized for kv_first = 0 and 1; the graph is rebuilt and the logits stay exact
    (test_kv_first_changes_between_ubatches). Before, each switch between 0 and > 0 reserved again: measured
    10-20 ms on the default model, once per prompt and once per reply."""
    tokens = random_tokens(40, seed=62)
    fill = Fill()
    with raw_context(tiny_model) as (_, ctx), reserve_count() as reserves:
        assert set_attn_extrap(ctx, fill.params(n_seg2=16, kv_first=4)) == OK
        assert decode(ctx, tokens[:20], 0) == 0
        before = reserves()
        for a, b, kv_first in ((20, 21, 8), (21, 22, 12), (22, 30, 0), (30, 31, 4), (31, 40, 0)):
            assert set_attn_extrap(ctx, fill.params(n_seg2=16, kv_first=kv_first)) == OK
            assert decode(ctx, tokens[a:b], a) == 0
        assert reserves() == before
    with raw_context(tiny_model) as (_, ctx), reserve_count() as reserves:
        # the same when the first settings have kv_first = 0
        assert set_attn_extrap(ctx, fill.params(n_seg2=16)) == OK
        assert decode(ctx, tokens[:20], 0) == 0
        before = reserves()
        assert set_attn_extrap(ctx, fill.params(n_seg2=16, kv_first=4)) == OK
        assert decode(ctx, tokens[20:21], 20) == 0
        assert reserves() == before


def stock_logits(model_path: Path, fa: dict[str, int], tokens: list[int], cuts: list[tuple[int, int, int]]) -> list:
    """The stock graph's last logits after each ubatch [a, b) of `cuts`."""
    stock = []
    with raw_context(model_path, **fa) as (model, ctx):
        for a, b, _ in cuts:
            assert decode(ctx, tokens[a:b], a) == 0
            stock.append(last_logits(model, ctx))
    return stock


def assert_as_stock(got: np.ndarray, ref: np.ndarray, flash_attn: bool) -> None:
    """Without flash attention to 1e-4; with it to 0.5% of the logit scale (test_kv_first_changes_between_ubatches
    says why)."""
    if flash_attn:
        assert np.abs(got - ref).max() <= 5e-3 * np.abs(ref).max()
    else:
        np.testing.assert_allclose(got, ref, atol=1e-4)


@pytest.mark.parametrize("flash_attn", [False, True], ids=["faoff", "faon"])
def test_kv_first_changes_between_ubatches(tiny_model, flash_attn):
    """Vanilla attention split at kv_first into two segments (cells below it as the second segment), with
    kv_first moving between ubatches of one stream: the logits of every ubatch equal stock's. Without flash
    attention to 1e-4. With it (an F16 cache) the segments go through two flash-attention calls merged by their
    log-sum-exps (native/llama), while stock makes one call; the CPU kernel for fewer than 64 queries accumulates
    V.P in F16, so the two round differently: measured 0.18% of the logit scale, held to 0.5%."""
    fa = dict(flash_attn_type=llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
              else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    tokens = random_tokens(48, seed=63)
    cuts = [(0, 16, 0), (16, 24, 16), (24, 32, 8), (32, 48, 24)]  # ubatch [a, b) with kv_first k
    stock = stock_logits(tiny_model, fa, tokens, cuts)
    fill = Fill()
    with raw_context(tiny_model, **fa) as (model, ctx):
        for (a, b, k), ref in zip(cuts, stock):
            params = fill.params(n_seg2=32, kv_first=k) if k else fill.params()
            fill.seg2_cells = k
            assert set_attn_extrap(ctx, params) == OK
            assert decode(ctx, tokens[a:b], a) == 0
            assert_as_stock(last_logits(model, ctx), ref, flash_attn)


@pytest.mark.parametrize("flash_attn", [False, True], ids=["faoff", "faon"])
def test_second_segment_read_as_cached(tiny_model, flash_attn):
    """use_seg2_k_delta off (dca keeps its keys in place and rotates only the query): the callback gets no
    seg2_k_delta, the second segment reads the cached keys as they are, and the logits are stock's (vanilla split
    at kv_first; tolerances as test_kv_first_changes_between_ubatches). The buffers reserved for the graph with the
    rotated copy hold the graph without it: no second reservation."""
    fa = dict(flash_attn_type=llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
              else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    tokens = random_tokens(40, seed=64)
    cuts = [(0, 16, 0), (16, 24, 16), (24, 25, 8), (25, 40, 24)]
    stock = stock_logits(tiny_model, fa, tokens, cuts)
    seen: list[bool] = []

    class Seen(Fill):
        def _fill(self, user_data: object, ub_p: object) -> int:
            seen.append(bool(ub_p.contents.seg2_k_delta))
            return super()._fill(user_data, ub_p)

    fill = Seen()
    with raw_context(tiny_model, **fa) as (model, ctx), reserve_count() as reserves:
        for n, ((a, b, k), ref) in enumerate(zip(cuts, stock)):
            fill.seg2_cells = k
            params = fill.params(n_seg2=32, kv_first=k, use_seg2_k_delta=n < 2)
            assert set_attn_extrap(ctx, params) == OK
            if n == 2:
                before = reserves()
            assert decode(ctx, tokens[a:b], a) == 0
            assert_as_stock(last_logits(model, ctx), ref, flash_attn)
        assert reserves() == before
    assert seen[:1] == [True] and seen[-1] is False


def test_failed_fill_aborts_decode(tiny_model):
    """A fill callback that returns non-zero makes llama_decode fail (-3) without computing the ubatch, its
    tokens leave the memory, and the same tokens decoded again give stock's logits (the stream is as before)."""
    tokens = random_tokens(28, seed=64)
    with raw_context(tiny_model) as (model, ctx):
        assert decode(ctx, tokens[:20], 0) == 0
        assert decode(ctx, tokens[20:], 20) == 0
        stock = last_logits(model, ctx)
    fill = Fill()
    fill.fail_calls = {1}
    with raw_context(tiny_model) as (model, ctx):
        mem = llama_cpp.llama_get_memory(ctx)
        assert set_attn_extrap(ctx, fill.params(use_k_delta=True)) == OK
        assert decode(ctx, tokens[:20], 0) == 0
        assert decode(ctx, tokens[20:], 20) == -3
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == 19
        assert decode(ctx, tokens[20:], 20) == 0
        assert fill.calls == 3
        np.testing.assert_allclose(last_logits(model, ctx), stock, atol=1e-4)


get_attn_extrap = _bind("llama_get_attn_extrap", Params, ctypes.c_void_p)


def test_session_keeps_its_stream_when_the_fill_fails(tiny_model):
    """libfarctx's own fill refusing a ubatch (here: the global tokens' cells swapped positions behind the
    session's back): the feed reports the fill's reason, the stream keeps its length, and once the
    positions are back the same token gives the logits of an untouched run (an F32 cache: the two K-shifts
    rotate the keys there and back exactly enough)."""
    from farctx.stream import _ffi, _lib

    tokens = random_tokens(42, seed=65)
    kwargs = dict(method="lminf", n_global=4, n_local=16, n_ubatch=8, n_batch=8, type_k=0, type_v=0)
    clean = farctx.Llama(str(tiny_model), **kwargs)
    try:
        clean.eval(tokens[:41])
        expected = clean.score(tokens[41:])[0]
    finally:
        clean.close()
    llm = farctx.Llama(str(tiny_model), **kwargs)
    try:
        llm.eval(tokens[:41])
        n_past = llm.stats()["n_past"]
        ctx = llm.ctx
        mem = llama_cpp.llama_get_memory(ctx)
        def swap_head_pairs() -> None:  # positions 0 1 | 2 3 of the global cells become 2 3 | 0 1 (or back)
            llama_cpp.llama_memory_seq_add(mem, 0, 0, 2, 1000)
            llama_cpp.llama_memory_seq_add(mem, 0, 2, 4, -2)
            llama_cpp.llama_memory_seq_add(mem, 0, 1000, 1002, -998)

        swap_head_pairs()
        token = np.array(tokens[41:], dtype=np.int32)
        rc = _lib.farctx_session_feed(llm._stream._session, _ffi.from_buffer("int32_t[]", token), 1, False, _ffi.NULL,
                                      _ffi.NULL, _ffi.NULL)
        assert rc == _lib.FARCTX_ERR_PARAM
        assert "not in the first cells" in _ffi.string(_lib.farctx_session_error(llm._stream._session)).decode()
        assert llm.stats()["n_past"] == n_past
        assert llama_cpp.llama_memory_seq_pos_max(mem, 0) == n_past - 1
        swap_head_pairs()
        got = llm.score(tokens[41:])[0]
    finally:
        llm.close()
    np.testing.assert_allclose(got, expected, atol=1e-4)


model_supported = _bind("llama_model_attn_extrap_supported", ctypes.c_bool, ctypes.c_void_p, ctypes.c_char_p,
                        ctypes.c_size_t)


def test_model_supported_without_a_context(tiny_model, default_model, tmp_path):
    """llama_model_attn_extrap_supported answers from the model alone (what `farctx info` needs), with the
    reason on refusal, and llama_set_attn_extrap refuses exactly those models (ERR_MODEL). Interleaved
    sliding-window models (Gemma 3) are supported; no RoPE and recurrent layers are not."""
    from refused_gguf import write_gpt2_gguf, write_mamba_gguf
    from tiny_gguf import TinyConfig, write_tiny_gguf

    gemma3 = write_tiny_gguf(tmp_path / "gemma3.gguf", default_model, TinyConfig(arch="gemma3"))
    gpt2 = write_gpt2_gguf(tmp_path / "gpt2.gguf", default_model)
    mamba = write_mamba_gguf(tmp_path / "mamba.gguf", default_model)
    fill = Fill()
    for path, supported, reason in [(tiny_model, True, ""), (gemma3, True, ""), (gpt2, False, "no RoPE"),
                                    (mamba, False, "recurrent layers")]:
        with raw_context(path) as (model, ctx):
            err = ctypes.create_string_buffer(256)
            assert model_supported(model, err, len(err)) is supported
            assert err.value.decode() == reason
            assert model_supported(model, None, 0) is supported  # no message wanted
            assert set_attn_extrap(ctx, fill.params()) == (OK if supported else ERR_MODEL)
    short = ctypes.create_string_buffer(8)
    with raw_context(mamba) as (model, _):
        assert not model_supported(model, short, len(short))
    assert short.value == b"recurre"  # truncated to the buffer, terminated


rotate_k = _bind("llama_memory_seq_rotate_k", ctypes.c_bool, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                 ctypes.c_int32, I32P)


def test_keys_moved_by_the_graph_are_the_k_shifts(tiny_model):
    """Patch 0028: keys that a ubatch's own graph rotates in place (n_k_move, the cells and deltas the callback
    names) score as the same keys rotated by the K-shift (llama_memory_seq_rotate_k), in that ubatch and in the next
    one, which moves nothing; a callback that names a cell twice fails the ubatch (-3)."""
    tokens = random_tokens(24, seed=68)
    first, deltas = 3, np.array([-3, 5, -1, 2, 7], dtype=np.int32)

    class Move(Fill):
        cells: list[int] = []

        def _fill(self, user_data: object, ub_p: object) -> int:
            ub = ub_p.contents
            for m in range(ub.n_k_move):
                ub.k_move_cell[m], ub.k_move_delta[m] = self.cells[m], int(deltas[m])
            return super()._fill(user_data, ub_p)

    def run(move_in_graph: bool) -> list[np.ndarray]:
        fill = Move()
        with raw_context(tiny_model) as (model, ctx):
            assert set_attn_extrap(ctx, fill.params()) == OK
            assert decode(ctx, tokens[:20], 0) == 0
            if move_in_graph:
                kv_pos = list(range(20))  # one sequence fed in order: cell c holds position c
                fill.cells = [kv_pos.index(first + m) for m in range(len(deltas))]
                assert set_attn_extrap(ctx, fill.params(n_k_move=len(deltas))) == OK
            else:
                mem = llama_cpp.llama_get_memory(ctx)
                assert rotate_k(mem, 0, first, first + len(deltas), deltas.ctypes.data_as(I32P))
            assert decode(ctx, tokens[20:22], 20) == 0
            out = [last_logits(model, ctx)]
            assert set_attn_extrap(ctx, fill.params()) == OK
            assert decode(ctx, tokens[22:24], 22) == 0
            return out + [last_logits(model, ctx)]

    for got, ref in zip(run(True), run(False)):
        np.testing.assert_allclose(got, ref, atol=1e-5)
    unmoved = Fill()
    with raw_context(tiny_model) as (model, ctx):
        assert set_attn_extrap(ctx, unmoved.params()) == OK
        assert decode(ctx, tokens[:22], 0) == 0
        assert np.abs(last_logits(model, ctx) - run(True)[0]).max() > 1e-2  # the moves change the logits

    twice = Move()
    twice.cells = [3, 3, 4, 5, 6]
    with raw_context(tiny_model) as (_, ctx):
        assert set_attn_extrap(ctx, twice.params()) == OK
        assert decode(ctx, tokens[:20], 0) == 0
        assert set_attn_extrap(ctx, twice.params(n_k_move=len(deltas))) == OK
        assert decode(ctx, tokens[20:22], 20) == -3
