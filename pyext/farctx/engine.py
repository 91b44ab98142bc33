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

from ._log import LlamaLog
from ._native import native
from . import rpc
from .errors import FarctxError, NoSpaceError
from .methods import MethodParams
from .models import check_gguf, context_and_window, resolve_model_path

_N = native()
_ffi, _lib = _N.ffi, _N.lib
_LOG = LlamaLog(_N.llama_cpp)

# progress(n_done, n_total) -> None; raise to cancel
ProgressFn = Callable[[int, int], None]

_STATUS_ERRORS = {
    _lib.FARCTX_ERR_NO_SPACE: NoSpaceError,
}


def _err_buffer() -> Any:
    return _ffi.new("char[]", 512)


def _message(buf: Any) -> str:
    return _ffi.string(buf).decode("utf-8", errors="replace")


_LLAMA_KWARGS = {
    name
    for name, p in inspect.signature(_N.llama_cpp.Llama.__init__).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY or p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
} - {"self", "model_path"}


_MAX_STREAM = 2**31 - 1


def _check_kv_types(kwargs: dict[str, Any]) -> None:
    type_v = kwargs.get("type_v")
    quantized = type_v is not None and type_v not in (0, 1, 30)  # F32, F16, BF16
    if quantized and not kwargs.get("flash_attn", False):
        raise FarctxError("a quantized V cache (-ctv) needs flash attention (-fa on)")


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
        c_params = self.method_params.to_c(_ffi, _lib)
        err = _err_buffer()
        if _lib.farctx_params_validate(c_params, _ffi.NULL, err, 512) != _lib.FARCTX_OK:
            raise FarctxError(_message(err))

        path = resolve_model_path(model_path)
        check_gguf(path)
        _check_kv_types(kwargs)
        self.rpc_servers = rpc.parse_servers(rpc_servers)
        self._model_devices = rpc.model_devices(self.rpc_servers) if self.rpc_servers else None
        fixed_cache = bool(_lib.farctx_method_fixed_cache(c_params.method))
        if fixed_cache:
            n_train, window = context_and_window(path)
        if fixed_cache and not kwargs.get("n_ctx"):
            # the cache these methods need, not the length of the text: head + n_local + n_ubatch
            n_ubatch = min(kwargs.get("n_ubatch", 512), kwargs.get("n_batch", 512))
            kwargs["n_ctx"] = int(_lib.farctx_cache_cells(c_params, n_train, n_ubatch, 0, 0))
            # sliding-window layers (iSWA): llama.cpp sizes their cache min(n_ctx, window + n_ubatch)
            if window:
                kwargs["n_ctx"] = max(kwargs["n_ctx"], window + n_ubatch)
        elif fixed_cache and "n_ubatch" not in kwargs:
            # a given cache: let the ubatch take the room that head + n_local leave (at most 512), and that
            # the sliding window leaves (iSWA)
            room = kwargs["n_ctx"] - int(_lib.farctx_cache_cells(c_params, n_train, 0, 0, 0))
            if window:
                room = min(room, kwargs["n_ctx"] - window)
            if 0 < room < min(512, kwargs.get("n_batch", 512)):
                kwargs["n_ubatch"] = room
        kwargs.setdefault("verbose", False)
        # models with sliding-window layers: their cache holds the window (+ a ubatch), as llama-server's
        # default, not a copy of the whole context (llama.cpp's library default)
        kwargs.setdefault("swa_full", False)
        self._session: Any = None
        _LOG.clear()
        _LOG.verbose = bool(kwargs["verbose"])
        try:
            super().__init__(model_path=str(path), **kwargs)
        except ValueError as exc:
            reason = _LOG.reason() or str(exc)
            raise FarctxError(f"llama.cpp could not load {path}: {reason}") from None
        rpc.hold(self, self.rpc_servers)

        ctx = _N.llama_context_ptr(self._ctx.ctx)
        session = _lib.farctx_session_init(ctx, c_params, err, 512)
        if session == _ffi.NULL:
            self.close()
            raise FarctxError(_message(err))
        self._session = _ffi.gc(session, _lib.farctx_session_free)
        self.method_params = MethodParams.from_c(_lib.farctx_session_params(self._session), _ffi, _lib)
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
        n = len(tokens)
        if n == 0:
            return None
        n_before = self.n_tokens
        rc = _lib.farctx_session_rewind(self._session, n_before)
        if rc != _lib.FARCTX_OK:
            if rc != _lib.FARCTX_ERR_REPLAY:
                raise FarctxError(_message(_lib.farctx_session_error(self._session)))
            # a rewind the method cannot do in place (evicted keys, a chunked prompt cut short;
            # e.g. llama_cpp's prompt-prefix reuse): feed the stream again from its first token
            self._check(_lib.farctx_session_rewind(self._session, 0))
            tokens = [int(t) for t in self.input_ids[:n_before]] + list(tokens)
            n, n_before = len(tokens), 0
            self.n_tokens = 0

        arr = np.ascontiguousarray(np.asarray(tokens, dtype=np.int32))
        if n_before + n > self.input_ids.shape[0]:
            # a stream may outgrow the cache (methods that evict); libfarctx decides what fits
            self._grow(n_before + n)
        # without all_logits nothing is copied: the context keeps the last token's logits for the sampler
        out = np.empty((n, self._n_vocab), dtype=np.single) if all_logits else None
        progress_cb = self._progress_callback(n)
        rc = _lib.farctx_session_feed(
            self._session,
            _ffi.from_buffer("int32_t[]", arr),
            n,
            all_logits,
            _ffi.from_buffer("float[]", out) if out is not None else _ffi.NULL,
            progress_cb,
            _ffi.NULL,
        )
        if rc != _lib.FARCTX_OK:
            message = _message(_lib.farctx_session_error(self._session))
            # nothing of this call stays in the stream
            _lib.farctx_session_rewind(self._session, n_before)
            if self._progress_error is not None:
                raise self._progress_error
            raise _STATUS_ERRORS.get(rc, FarctxError)(message)
        self.input_ids[n_before : n_before + n] = arr
        self.n_tokens = n_before + n
        self._requires_eval = False
        return out if all_logits else None

    def _grow(self, n: int) -> None:
        size = max(n, 2 * self.input_ids.shape[0])
        ids = np.zeros(size, dtype=np.intc)
        ids[: self.n_tokens] = self.input_ids[: self.n_tokens]
        self.input_ids = ids
        if self._logits_all and self.scores.shape[0] < size:
            scores = np.zeros((size, self._n_vocab), dtype=np.single)
            scores[: self.scores.shape[0]] = self.scores
            self.scores = scores

    def _progress_callback(self, n_total: int) -> Any:
        self._progress_error: Optional[BaseException] = None
        if self.progress is None:
            return _ffi.NULL
        progress = self.progress

        @_ffi.callback("bool(void *, int64_t, int64_t)")
        def callback(_data: Any, done: int, total: int) -> bool:
            try:
                progress(int(done), int(total))
            except BaseException as exc:  # cancel, re-raised after the feed returns
                self._progress_error = exc
                return False
            return True

        self._progress_cb_ref = callback  # keep alive during the call
        return callback

    def _check(self, rc: int) -> None:
        if rc != _lib.FARCTX_OK:
            raise FarctxError(_message(_lib.farctx_session_error(self._session)))

    # -- reporting ----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Tokens in the stream, KV cells in use, cache size and bytes (the library's own counts)."""
        s = _ffi.new("struct farctx_stats *")
        _lib.farctx_session_stats(self._session, s)
        return {
            "n_past": int(s.n_past),
            "n_ctx": int(s.n_ctx),
            "n_cells_used": int(s.n_cells_used),
            "n_ctx_train": int(s.n_ctx_train),
            "n_decode": int(s.n_decode),
            "kv_bytes": int(s.kv_bytes),
            "n_stair_moves": int(s.n_stair_moves),
            "n_cache_rotations": int(s.n_cache_rotations),
        }

    def close(self) -> None:
        self._session = None  # freed before the context it points into
        if hasattr(self, "_stack"):  # absent when __init__ failed before llama_cpp's own
            super().close()
        rpc.release(self)  # the model and its RPC connections are freed
