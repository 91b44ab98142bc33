"""`SequenceBatch`: several token streams through one model, each under its own method, fed together.

STAND-IN. This file is replaced, whole, by the native SequenceBatch (one llama_context with
n_seq_max = N, one KV stream per sequence, one llama_decode per step for all sequences), which
keeps exactly this API. Here each sequence is its own `farctx.Llama` (the same model file, a cache
of `n_ctx_seq` cells, the method of its last `open`), and `step` feeds them one after the other:
correct, not batched. Loading an engine is what a method switch costs here (the native batch switches
in place), so each stream keeps its last few engines, one per method.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import numpy as np

from .engine import Llama
from .errors import FarctxError
from .methods import MethodParams
from .models import resolve_model_path

_NOT_LLAMA_KWARGS = {"n_ctx", "method", "model_path", "progress"}
_ENGINES_PER_STREAM = 3

MethodKey = tuple[str, tuple[tuple[str, int], ...]]


class SequenceBatch:
    """`n_seq` token streams of one model, each in a cache region of `n_ctx_seq` cells."""

    def __init__(self, model_path: str, *, n_seq: int, n_ctx_seq: int, **llama_kwargs: Any) -> None:
        if n_seq < 1:
            raise FarctxError(f"n_seq must be at least 1 (got {n_seq})")
        if n_ctx_seq < 1:
            raise FarctxError(f"n_ctx_seq must be at least 1 (got {n_ctx_seq})")
        bad = sorted(set(llama_kwargs) & (_NOT_LLAMA_KWARGS | set(MethodParams.names())))
        if bad:
            raise FarctxError(f"SequenceBatch: not a llama.cpp keyword argument here: {', '.join(bad)} "
                              "(the cache is n_ctx_seq; the method and its parameters go to open)")
        self.model_path = str(resolve_model_path(model_path))
        self.n_seq = n_seq
        self.n_ctx_seq = n_ctx_seq
        self._kwargs = dict(llama_kwargs)
        self._seqs: list[Optional[Llama]] = [None] * n_seq
        self._opened: list[Optional[MethodKey]] = [None] * n_seq
        self._spare: list[dict[MethodKey, Llama]] = [{} for _ in range(n_seq)]  # engines kept for a switch back
        self.n_vocab = self._engine_for(0, "vanilla", {}).n_vocab()

    # -- streams ---------------------------------------------------------------------------------

    def open(self, seq: int, method: str = "vanilla", **params: int) -> None:
        """(Re)start stream `seq` empty under `method` and its parameters."""
        self._check_seq(seq)
        self._engine_for(seq, method, params)

    def n_past(self, seq: int) -> int:
        return int(self._llm(seq).n_tokens)

    def tokens(self, seq: int) -> list[int]:
        llm = self._llm(seq)
        return [int(t) for t in llm.input_ids[: llm.n_tokens]]

    def rewind(self, seq: int, n_keep: int) -> None:
        """Keep the first n_keep tokens (the engine replays the stream at its next feed when the method
        cannot cut in place)."""
        llm = self._llm(seq)
        if not 0 <= n_keep <= llm.n_tokens:
            raise FarctxError(f"rewind: n_keep {n_keep} outside 0..{llm.n_tokens}")
        llm.n_tokens = n_keep

    def step(self, feeds: Mapping[int, Sequence[int]]) -> dict[int, np.ndarray]:
        """Append tokens to several streams; each fed stream's last-token logits (a copy).

        A stream that cannot take its tokens raises NoSpaceError (it keeps what it had; streams fed
        before it in this call keep their new tokens)."""
        lc = self._llama_cpp()
        out: dict[int, np.ndarray] = {}
        for seq, tokens in feeds.items():
            llm = self._llm(seq)
            if len(tokens) == 0:
                raise FarctxError(f"step: no tokens for stream {seq}")
            llm.eval([int(t) for t in tokens])
            row = lc.llama_get_logits_ith(llm._ctx.ctx, -1)
            out[seq] = np.ctypeslib.as_array(row, shape=(self.n_vocab,)).copy()
        return out

    def stats(self, seq: int) -> dict[str, int]:
        llm = self._llm(seq)
        stats = llm.stats()
        stats["n_past"] = int(llm.n_tokens)
        return stats

    def close(self) -> None:
        for i, llm in enumerate(self._seqs):
            if llm is not None:
                llm.close()
            for spare in self._spare[i].values():
                spare.close()
            self._spare[i].clear()
            self._seqs[i] = None
            self._opened[i] = None

    # -- internals -------------------------------------------------------------------------------

    def _engine_for(self, seq: int, method: str, params: Mapping[str, int]) -> Llama:
        key = (method, tuple(sorted((k, int(v)) for k, v in params.items() if v is not None)))
        llm = self._seqs[seq]
        if llm is not None and self._opened[seq] == key:
            llm.n_tokens = 0
            return llm
        MethodParams.from_kwargs(method, dict(params))  # names and types, before anything is unloaded
        spare = self._spare[seq]
        if llm is not None and self._opened[seq] is not None:
            spare[self._opened[seq]] = llm  # kept, most recent last
            self._seqs[seq] = None
            self._opened[seq] = None
        kept = spare.pop(key, None)
        while len(spare) >= _ENGINES_PER_STREAM:
            spare.pop(next(iter(spare))).close()
        if kept is not None:
            kept.n_tokens = 0
            llm = kept
        else:
            llm = Llama(self.model_path, method=method, n_ctx=self.n_ctx_seq, **dict(key[1]), **self._kwargs)
        self._seqs[seq] = llm
        self._opened[seq] = key
        return llm

    def _llm(self, seq: int) -> Llama:
        self._check_seq(seq)
        llm = self._seqs[seq]
        if llm is None:
            raise FarctxError(f"stream {seq} is not open")
        return llm

    def _check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq:
            raise FarctxError(f"stream {seq} outside 0..{self.n_seq - 1}")

    @staticmethod
    def _llama_cpp() -> Any:
        from ._native import native

        return native().llama_cpp
