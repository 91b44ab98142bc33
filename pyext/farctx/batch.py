"""`farctx.SequenceBatch`: several token streams through one model, each under its own method, fed together.

One llama_context holds `n_seq` sequences, one KV stream of `n_ctx_seq` cells each (llama.cpp's
`n_seq_max` with `kv_unified = false`); each stream is a libfarctx session with its own method and
state (positions, eviction, Mesa's chunks and stair). `step` feeds every stream that has tokens in
shared llama_decode calls: N streams decoding together cost about one pass over the weights, which is
what a server with parallel slots needs (continuous batching).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np

from .context import LoadedModel, RuntimeOptions
from .errors import FarctxError
from .methods import DEFAULT_METHOD, ContextPlan, MethodParams
from ._native import native
from .stream import Stream, feed_together

_N = native()


class SequenceBatch:
    """Up to `n_seq` streams of one model (`model_path=None`: the bundled default), `n_ctx_seq` KV cells each.

    Keyword arguments are the runtime options (`farctx.context.RuntimeOptions`: `n_batch`, `n_ubatch`,
    `n_threads`, `flash_attn`, `type_k`, `type_v`, `n_gpu_layers`, `rpc_servers`, ...), and `deterministic`: every
    stream's logits bitwise the same whatever the others fed beside it (batch-invariant kernels, slower;
    `docs/server.md`). A stream is opened with a method and its parameters (`open`), then fed with `step`.
    """

    def __init__(self, model_path: Optional[str] = None, *, n_seq: int, n_ctx_seq: int, **kwargs: Any) -> None:
        deterministic = bool(kwargs.pop("deterministic", False))
        unknown = sorted(set(kwargs) - (set(RuntimeOptions.names()) - {"n_ctx"}))  # the cells are n_ctx_seq's
        if unknown:
            raise FarctxError(f"unexpected keyword argument(s): {', '.join(unknown)}")
        if n_seq < 1 or n_ctx_seq < 1:
            raise FarctxError(f"n_seq ({n_seq}) and n_ctx_seq ({n_ctx_seq}) must be at least 1")
        options = RuntimeOptions.take({**kwargs, "n_ctx": n_seq * n_ctx_seq})
        model = LoadedModel(model_path, options, deterministic=deterministic)
        try:
            # the batch sizes of a context of the caller's cells: the plan's part that no method changes (each
            # stream's method is checked against its cells when it is opened)
            plan = model.plan(MethodParams.from_kwargs("vanilla", {}), n_seq=n_seq)
        except FarctxError:
            model.close()
            raise
        self._attach(model, plan, n_seq)

    @classmethod
    def planned(cls, model: LoadedModel, plan: ContextPlan, n_seq: int) -> "SequenceBatch":
        """n_seq streams on a loaded model, sized by its context plan (the server's slots); the batch owns the
        model from here."""
        batch = cls.__new__(cls)
        batch._attach(model, plan, n_seq)
        return batch

    def _attach(self, model: LoadedModel, plan: ContextPlan, n_seq: int) -> None:
        self._streams: list[Optional[Stream]] = [None] * n_seq
        self._loaded = model
        self.model_path = model.path
        self.rpc_servers = model.options.rpc_servers
        self.deterministic = model.deterministic
        try:
            self._context = model.new_context(plan, n_seq)
        except FarctxError:
            model.close()
            raise
        self._ctx = self._context.ctx
        self._cctx = _N.llama_context_ptr(self._ctx)
        self.n_seq = n_seq
        self.n_ctx_seq = int(_N.llama_cpp.llama_n_ctx_seq(self._ctx))  # rounded up to 256 cells by llama.cpp
        self.n_vocab = model.facts.n_vocab

    # -- streams -------------------------------------------------------------------------------

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq:
            raise FarctxError(f"sequence {seq} is not in the batch (0 .. {self.n_seq - 1})")

    def _stream(self, seq: int) -> Stream:
        self._check_seq(seq)
        stream = self._streams[seq]
        if stream is None:
            raise FarctxError(f"sequence {seq} is not open")
        return stream

    def open(self, seq: int, method: str = DEFAULT_METHOD, **params: int) -> None:
        """(Re)start stream `seq` empty, under `method` and its parameters (farctx.Llama's names)."""
        self._check_seq(seq)
        chosen = MethodParams.from_kwargs(method, params)
        self.release(seq)
        self._streams[seq] = Stream(self._cctx, chosen, self.n_vocab, seq)

    def release(self, seq: int) -> None:
        """Close stream `seq` and free its cells (a no-op for a stream that is not open)."""
        stream = self._streams[seq]
        if stream is not None:
            self._streams[seq] = None
            stream.close()
            mem = _N.llama_cpp.llama_get_memory(self._ctx)
            _N.llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)

    def method(self, seq: int) -> MethodParams:
        """The method and parameters in force for stream `seq` (defaults resolved)."""
        return self._stream(seq).method

    def n_past(self, seq: int) -> int:
        return self._stream(seq).n_past

    def tokens(self, seq: int) -> list[int]:
        """The tokens of stream `seq` so far."""
        return list(self._stream(seq).tokens)

    def rewind(self, seq: int, n_keep: int) -> None:
        """Keep the first `n_keep` tokens of stream `seq` (fed again from the start where the method cannot cut
        its cache there)."""
        self._stream(seq).rewind(n_keep)

    def step(self, feeds: Mapping[int, Sequence[int]]) -> dict[int, np.ndarray]:
        """Append tokens to several streams at once; returns each fed stream's last-token logits.

        A stream that cannot take its tokens (`NoSpaceError`, `FarctxError`) keeps what it had; the
        other streams keep what was decoded before the failure (their `n_past` says how much).
        """
        order = [seq for seq, toks in feeds.items() if len(toks) > 0]
        if not order:
            return {}
        rows = feed_together([self._stream(seq) for seq in order], [feeds[seq] for seq in order])
        return {seq: rows[i] for i, seq in enumerate(order)}

    def stats(self, seq: int) -> dict[str, int]:
        """farctx.Llama.stats() of stream `seq`: its tokens, its cells in use and size, the cache's bytes."""
        return self._stream(seq).stats()

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        for seq, stream in enumerate(getattr(self, "_streams", [])):
            if stream is not None:
                stream.close()  # freed before the context it points into
                self._streams[seq] = None
        if getattr(self, "_loaded", None) is not None:
            self._loaded.close()  # the context with the model (llama-cpp-python frees a context before its model)
            self._loaded = None
            self._ctx = None

    def __enter__(self) -> "SequenceBatch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

