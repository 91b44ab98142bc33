"""`farctx.Llama`: llama_cpp.Llama with its token stream driven by a farctx session.

Everything llama-cpp-python offers (create_completion, create_chat_completion, __call__,
stream=True, tokenize, samplers, chat templates) works unchanged; evaluation goes through
libfarctx, which applies the chosen attention method.
"""

from __future__ import annotations

import inspect
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from . import rpc
from .errors import FarctxError
from .kv_types import check_kv_types, kv_type_id
from .methods import MethodParams, stream_cache, ubatch_size
from .models import check_gguf, context_and_window, resolve_model_path
from .stream import LOG as _LOG
from .stream import ProgressFn, Stream, check_params, _N

_LLAMA_KWARGS = {
    name
    for name, p in inspect.signature(_N.llama_cpp.Llama.__init__).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY or p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
} - {"self", "model_path"}


_MAX_STREAM = 2**31 - 1


@contextmanager
def load_model_params_only(model_path: Optional[str | os.PathLike[str]]) -> Iterator[tuple[Any, Any]]:
    """The model loaded as cheaply as llama.cpp allows while it still knows the hyperparameters
    (memory-mapped on the CPU: vocab_only skips the hyperparameters, no_alloc refuses a CPU load), as
    (native, cffi llama_model pointer); freed on exit."""
    path = resolve_model_path(model_path)
    check_gguf(path)
    lc = _N.llama_cpp
    params = lc.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_mmap = True
    _LOG.clear()
    model = lc.llama_model_load_from_file(str(path).encode("utf-8"), params)
    if not model:
        raise FarctxError(f"llama.cpp could not load {path}: {_LOG.reason() or 'unknown error'}")
    try:
        yield _N, _N.llama_model_ptr(model)
    finally:
        lc.llama_model_free(model)


class Llama(_N.llama_cpp.Llama):  # type: ignore[misc, name-defined]
    """A drop-in for `llama_cpp.Llama` that runs a farctx attention method.

    `model_path=None` loads the bundled default model. `method` is one of farctx.METHODS;
    the method's parameters (`farctx.MethodParams.names()`, from libfarctx's table) are keyword
    arguments, and every other keyword argument is llama_cpp.Llama's. `rpc_servers`
    ("HOST:PORT,HOST:PORT" or a list) puts the offloaded layers (`n_gpu_layers`) on those ggml RPC
    servers (`farctx rpc-server`), then on the local GPUs; each server is checked first (FarctxError
    naming it when it cannot be reached in `farctx.rpc.CONNECT_TIMEOUT` seconds or speaks another
    protocol version).
    """

    # llama_cpp.Llama.__init__ assigns the struct; the RPC devices (if any) go into it there
    model_params = rpc.model_params_property()

    def __init__(
        self,
        model_path: Optional[str | os.PathLike[str]] = None,
        *,
        method: str = "vanilla",
        progress: Optional[ProgressFn] = None,
        rpc_servers: Optional[str | Sequence[str]] = None,
        **kwargs: Any,
    ) -> None:
        method_values = {name: kwargs.pop(name) for name in MethodParams.names() if name in kwargs}
        unknown = sorted(set(kwargs) - _LLAMA_KWARGS)
        if unknown:  # llama_cpp.Llama swallows unknown keywords; a typo should not pass silently
            raise FarctxError(f"unexpected keyword argument(s): {', '.join(unknown)}")
        self.method_params = MethodParams.from_kwargs(method, method_values)
        check_params(self.method_params)

        path = resolve_model_path(model_path)
        check_gguf(path)
        for key in ("type_k", "type_v"):
            if key in kwargs:
                kwargs[key] = kv_type_id(kwargs[key])
        check_kv_types(kwargs.get("type_k"), kwargs.get("type_v"), bool(kwargs.get("flash_attn", False)))
        self.rpc_servers = rpc.parse_servers(rpc_servers)
        self._model_devices = rpc.model_devices(self.rpc_servers) if self.rpc_servers else None
        fixed_cache = self.method_params.info.fixed_cache
        if fixed_cache:
            n_train, window = context_and_window(path)
            n_train = self.method_params.n_ctx_train or n_train
            n_ubatch = ubatch_size(kwargs.get("n_batch"), kwargs.get("n_ubatch"))
            if not kwargs.get("n_ctx"):
                # the cache these methods need, not the length of the text: head + n_local + n_ubatch
                kwargs["n_ctx"] = stream_cache(self.method_params, n_train, n_ubatch, window=window)
            elif "n_ubatch" not in kwargs:
                # a given cache: let the ubatch take the room that head + n_local leave (at most 512), and that
                # the sliding window leaves (iSWA)
                room = kwargs["n_ctx"] - stream_cache(self.method_params, n_train, 0)
                if window:
                    room = min(room, kwargs["n_ctx"] - window)
                if 0 < room < ubatch_size(kwargs.get("n_batch")):
                    kwargs["n_ubatch"] = room
        kwargs.setdefault("verbose", False)
        # models with sliding-window layers: their cache holds the window (+ a ubatch), as llama-server's
        # default, not a copy of the whole context (llama.cpp's library default)
        kwargs.setdefault("swa_full", False)
        self._stream: Optional[Stream] = None
        _LOG.clear()
        _LOG.verbose = bool(kwargs["verbose"])
        try:
            super().__init__(model_path=str(path), **kwargs)
        except ValueError as exc:
            reason = _LOG.reason() or str(exc)
            raise FarctxError(f"llama.cpp could not load {path}: {reason}") from None
        rpc.hold(self, self.rpc_servers)

        try:
            self._stream = Stream(_N.llama_context_ptr(self._ctx.ctx), self.method_params, self._n_vocab)
        except FarctxError:
            self.close()
            raise
        self.method_params = self._stream.method
        self.progress = progress
        # llama.cpp rounds the cache up (to 256 cells): size the token and score buffers to the real cache
        n_ctx = self.n_ctx()
        if self.input_ids.shape[0] < n_ctx:
            self.input_ids = np.zeros(n_ctx, dtype=np.intc)
            if self._logits_all:
                self.scores = np.zeros((n_ctx, self._n_vocab), dtype=np.single)
        if fixed_cache:
            # llama_cpp.Llama bounds prompts and generations by _n_ctx: here the stream is unbounded
            # (32-bit positions), only the cache is fixed
            self._n_ctx = _MAX_STREAM

    # -- the token stream -------------------------------------------------------------------

    def eval(self, tokens: Sequence[int]) -> None:
        """Evaluate tokens after the first `n_tokens` of the stream (llama_cpp.Llama.eval's contract)."""
        logits = self._feed(tokens, all_logits=bool(self._logits_all))
        if logits is not None:
            self.scores[self.n_tokens - len(logits) : self.n_tokens] = logits

    def score(self, tokens: Sequence[int]) -> np.ndarray:
        """Feed tokens after the first `n_tokens` and return their logits, [len(tokens), n_vocab]
        (row t predicts the token after tokens[t]); `scores` is left alone."""
        logits = self._feed(tokens, all_logits=True)
        assert logits is not None
        return logits[len(logits) - len(tokens) :]

    def _feed(self, tokens: Sequence[int], all_logits: bool) -> Optional[np.ndarray]:
        if len(tokens) == 0:
            return None
        assert self._stream is not None
        n_after = self.n_tokens + len(tokens)
        if n_after > self.input_ids.shape[0]:
            # a stream may outgrow the cache (methods that evict); libfarctx decides what fits
            self._grow(n_after)
        n_before = self.n_tokens  # llama_cpp's prompt-prefix reuse sets it back: the stream is cut there
        try:
            logits = self._stream.feed(tokens, after=n_before, all_logits=all_logits, progress=self.progress)
        except BaseException:
            self.n_tokens = self._stream.n_past  # nothing of this call stays; a replayed prefix may be gone too
            raise
        self.input_ids[n_before:n_after] = tokens
        self.n_tokens = n_after
        self._requires_eval = False
        return logits

    def _grow(self, n: int) -> None:
        size = max(n, 2 * self.input_ids.shape[0])
        ids = np.zeros(size, dtype=np.intc)
        ids[: self.n_tokens] = self.input_ids[: self.n_tokens]
        self.input_ids = ids
        if self._logits_all and self.scores.shape[0] < size:
            scores = np.zeros((size, self._n_vocab), dtype=np.single)
            scores[: self.scores.shape[0]] = self.scores
            self.scores = scores

    # -- reporting ----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Tokens in the stream, KV cells in use, cache size and bytes (the library's own counts)."""
        assert self._stream is not None
        return self._stream.stats()

    def close(self) -> None:
        if getattr(self, "_stream", None) is not None:
            self._stream.close()  # freed before the context it points into
            self._stream = None
        if hasattr(self, "_stack"):  # absent when __init__ failed before llama_cpp's own
            super().close()
        rpc.release(self)  # the model and its RPC connections are freed
