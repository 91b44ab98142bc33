"""`farctx.SequenceBatch`: several token streams through one model, each under its own method, fed together.

One llama_context holds `n_seq` sequences, one KV stream of `n_ctx_seq` cells each (llama.cpp's
`n_seq_max` with `kv_unified = false`); each stream is a libfarctx session with its own method and
state (positions, eviction, Mesa's chunks and stair). `step` feeds every stream that has tokens in
shared llama_decode calls: N streams decoding together cost about one pass over the weights, which is
what a server with parallel slots needs (continuous batching).
"""

from __future__ import annotations

import ctypes
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from . import rpc
from .errors import FarctxError
from .kv_types import check_kv_types, kv_type_id
from .methods import MethodParams, default_batch_sizes
from .models import check_gguf, resolve_model_path
from .stream import LOG as _LOG
from .stream import Stream, _N, feed_together


class SequenceBatch:
    """Up to `n_seq` streams of one model (`model_path=None`: the bundled default), `n_ctx_seq` KV cells each.

    Keyword arguments are llama.cpp's, named as in `farctx.Llama` (`n_batch`, `n_ubatch`, `n_threads`,
    `n_threads_batch`, `flash_attn`, `type_k`, `type_v`, `n_gpu_layers`, `offload_kqv`, `use_mmap`,
    `verbose`, `rpc_servers`, `tensor_split`), and `deterministic`: every stream's logits bitwise the same whatever
    the others fed beside it (batch-invariant kernels, slower; `docs/server.md`). A stream is opened with a method and its parameters (`open`), then fed with
    `step`.
    """

    _CONTEXT_KEYS = ("n_batch", "n_ubatch", "n_threads", "n_threads_batch", "flash_attn", "type_k", "type_v",
                     "offload_kqv", "swa_full", "deterministic")
    _MODEL_KEYS = ("n_gpu_layers", "use_mmap", "verbose", "rpc_servers", "tensor_split")

    def __init__(self, model_path: Optional[str] = None, *, n_seq: int, n_ctx_seq: int, **kwargs: Any) -> None:
        unknown = sorted(set(kwargs) - set(self._CONTEXT_KEYS) - set(self._MODEL_KEYS))
        if unknown:
            raise FarctxError(f"unexpected keyword argument(s): {', '.join(unknown)}")
        if n_seq < 1 or n_ctx_seq < 1:
            raise FarctxError(f"n_seq ({n_seq}) and n_ctx_seq ({n_ctx_seq}) must be at least 1")
        default_batch, default_ubatch = default_batch_sizes()
        n_batch = int(kwargs.get("n_batch", default_batch))
        n_ubatch = int(kwargs.get("n_ubatch", default_ubatch))
        if n_ubatch < 1 or n_batch < n_seq:
            # llama.cpp keeps an output row per sequence in a buffer of n_batch rows (it aborts past it)
            raise FarctxError(f"n_batch ({n_batch}) must be at least n_seq ({n_seq}) and n_ubatch ({n_ubatch}) "
                              "at least 1: each decode holds an output row per sequence")
        for key in ("type_k", "type_v"):
            if kwargs.get(key) is not None:
                kwargs[key] = kv_type_id(kwargs[key])
        check_kv_types(kwargs.get("type_k"), kwargs.get("type_v"), bool(kwargs.get("flash_attn")))
        llama_cpp = _N.llama_cpp
        path = resolve_model_path(model_path)
        check_gguf(path)
        self.model_path = str(path)
        self._streams: list[Optional[Stream]] = [None] * n_seq

        verbose = bool(kwargs.get("verbose", False))
        _LOG.clear()
        _LOG.verbose = verbose
        mparams = llama_cpp.llama_model_default_params()
        n_gpu_layers = int(kwargs.get("n_gpu_layers", 0))
        mparams.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers == -1 else n_gpu_layers
        mparams.use_mmap = bool(kwargs.get("use_mmap", True))
        if kwargs.get("deterministic"):
            mparams.use_extra_bufts = False  # repacked weights take other kernels by the batch's column count
        self.rpc_servers = rpc.parse_servers(kwargs.get("rpc_servers"))
        self._model_devices = rpc.model_devices(self.rpc_servers) if self.rpc_servers else None
        if self._model_devices is not None:
            mparams.devices = ctypes.addressof(self._model_devices)
        split = kwargs.get("tensor_split")
        if split:
            self._tensor_split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*split)
            mparams.tensor_split = self._tensor_split
        self._model = llama_cpp.llama_model_load_from_file(self.model_path.encode(), mparams)
        if not self._model:
            raise FarctxError(f"llama.cpp could not load {self.model_path}: {_LOG.reason() or 'see the log'}")

        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_seq * n_ctx_seq
        cparams.n_seq_max = n_seq
        cparams.kv_unified = False  # one KV stream per sequence: the attention methods fill a mask per stream
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(n_ubatch, n_batch)
        threads = kwargs.get("n_threads")
        if threads:
            cparams.n_threads = int(threads)
            cparams.n_threads_batch = int(kwargs.get("n_threads_batch") or threads)
        cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if kwargs.get("flash_attn")
                                   else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        for key in ("type_k", "type_v"):
            if kwargs.get(key) is not None:
                setattr(cparams, key, int(kwargs[key]))
        cparams.offload_kqv = bool(kwargs.get("offload_kqv", True))
        cparams.swa_full = bool(kwargs.get("swa_full", False))
        cparams.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            self._model = None
            raise FarctxError(f"llama.cpp could not create a context for {self.model_path}: "
                              f"{_LOG.reason() or 'see the log'}")
        rpc.hold(self, self.rpc_servers)
        self.deterministic = bool(kwargs.get("deterministic", False))
        if self.deterministic and not _batch_invariant(self._ctx):
            self.close()
            raise FarctxError("deterministic needs every layer on the CPU backend: a GPU or RPC backend computes "
                              "part of this context's graph, and only the CPU has batch-invariant kernels "
                              "(use -ngl 0 on a CPU-only build)")
        self._cctx = _N.llama_context_ptr(self._ctx)
        self.n_seq = n_seq
        self.n_ctx_seq = int(llama_cpp.llama_n_ctx_seq(self._ctx))  # rounded up to 256 cells by llama.cpp
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self._model)))

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

    def open(self, seq: int, method: str = "vanilla", **params: int) -> None:
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
                stream.close()
                self._streams[seq] = None
        if getattr(self, "_ctx", None):
            _N.llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            _N.llama_cpp.llama_model_free(self._model)
            self._model = None
            rpc.release(self)  # the model and its RPC connections are freed

    def __enter__(self) -> "SequenceBatch":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _batch_invariant(ctx: Any) -> bool:
    """Switch ctx to batch-invariant kernels; False if a backend without them computes part of its graph."""
    lib = _N.llama_cpp.llama_cpp._lib
    fn = lib.llama_set_batch_invariant
    fn.restype, fn.argtypes = ctypes.c_bool, [ctypes.c_void_p, ctypes.c_bool]
    return bool(fn(ctx, True))
