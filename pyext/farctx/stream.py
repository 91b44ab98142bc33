"""The stream core: one token stream through a libfarctx session, as `farctx.Llama` and `SequenceBatch` drive it.

A `Stream` owns one session (one sequence of a llama_context, under one method): it feeds tokens (one
chunking rule, libfarctx's; a progress callback that may cancel; the last or every token's logits), rewinds
(feeding the kept tokens again where the method cannot cut its cache in place), reads the session's stats
and turns libfarctx's status codes into exceptions. `feed_together` feeds several streams of one context
in shared llama_decode calls. Nothing else in the package calls a farctx_session_* function.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ._native import llama_log, native
from .errors import FarctxError, NoSpaceError

_N = native()
_ffi, _lib = _N.ffi, _N.lib
llama_log()  # installed before any model loads

# progress(tokens read, tokens to read) of one feed: (0, n) when it starts, then after each llama_decode; raise to
# cancel the feed (the exception comes out of it)
ProgressFn = Callable[[int, int], None]

_ERR_SIZE = 512
STATS_FIELDS = tuple(name for name, _ in _ffi.typeof("struct farctx_stats").fields)


def _text(buf: Any) -> str:
    return _ffi.string(buf).decode("utf-8", errors="replace")


def check_params(params: Any) -> None:
    """libfarctx's check of a method's parameters on their own (the model's checks come when a stream opens)."""
    err = _ffi.new("char[]", _ERR_SIZE)
    if _lib.farctx_params_validate(params.to_c(_ffi, _lib), _ffi.NULL, err, _ERR_SIZE) != _lib.FARCTX_OK:
        raise FarctxError(_text(err))


def _error_class(rc: int) -> type[FarctxError]:
    return NoSpaceError if rc == _lib.FARCTX_ERR_NO_SPACE else FarctxError


class Stream:
    """Sequence `seq` of a llama_context (a cffi pointer) under `params` (a MethodParams); `tokens` is the
    stream so far."""

    def __init__(self, cctx: Any, params: Any, n_vocab: int, seq: int = 0) -> None:
        from .methods import MethodParams

        err = _ffi.new("char[]", _ERR_SIZE)
        session = _lib.farctx_session_init_seq(cctx, params.to_c(_ffi, _lib), seq, err, _ERR_SIZE)
        if session == _ffi.NULL:
            raise FarctxError(_text(err))
        self._session: Any = _ffi.gc(session, _lib.farctx_session_free)
        self.seq = seq
        self.n_vocab = n_vocab
        self.method = MethodParams.from_c(_lib.farctx_session_params(session), _ffi, _lib)  # defaults resolved
        self.tokens: list[int] = []
        self._progress_error: Optional[BaseException] = None
        self._warned_past_train = False

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def error(self) -> str:
        """The message of the session's last error."""
        return _text(_lib.farctx_session_error(self._session))

    def _raise(self, rc: int, prefix: str = "") -> None:
        raise _error_class(rc)(prefix + self.error())

    # -- feeding ---------------------------------------------------------------------------------

    def feed(self, tokens: Sequence[int], *, after: Optional[int] = None, all_logits: bool = False,
             progress: Optional[ProgressFn] = None) -> Optional[np.ndarray]:
        """Make the stream its first `after` tokens (default: all of them) followed by `tokens`.

        Returns every new token's logits ([len(tokens), n_vocab], row t predicting the token after tokens[t])
        with all_logits, else None (the context keeps the last token's, for a sampler). Where the method cannot
        cut its cache at `after` (evicted keys, a chunked prompt cut short), the kept tokens are fed again with
        the new ones, in one feed. On an error nothing of this call stays in the stream.
        """
        replay = self._cut(self.n_past if after is None else after)
        fed = replay + [int(t) for t in tokens]
        if not fed:
            return None
        n_before = self.n_past
        arr = np.ascontiguousarray(np.asarray(fed, dtype=np.int32))
        out = np.empty((len(fed), self.n_vocab), dtype=np.single) if all_logits else None
        callback = self._progress_callback(progress)
        if progress is not None:
            progress(0, len(fed))  # the feed starts (a raise here cancels it before anything is read)
        rc = _lib.farctx_session_feed(self._session, _ffi.from_buffer("int32_t[]", arr), len(fed), all_logits,
                                      _ffi.from_buffer("float[]", out) if out is not None else _ffi.NULL,
                                      callback, _ffi.NULL)
        if rc != _lib.FARCTX_OK:
            message = self.error()
            _lib.farctx_session_rewind(self._session, n_before)
            if self._progress_error is not None:
                error, self._progress_error = self._progress_error, None
                raise error
            raise _error_class(rc)(message)
        self.tokens.extend(fed)
        self._note_length()
        return out[len(replay):] if out is not None else None

    def _note_length(self) -> None:
        """Once per stream, as llama.cpp warns of a context past the trained one: stock attention past the trained
        context reads distances the model never saw."""
        n_train = self.method.n_ctx_train
        if self.method.info.stock_graph and self.n_past > n_train and not self._warned_past_train:
            self._warned_past_train = True
            print(f"farctx: warning: {self.method.method} read {self.n_past} tokens, past the model's trained context "
                  f"({n_train}): its output degrades from there; --method auto (the default) reads past it",
                  file=sys.stderr)

    def rewind(self, n_keep: int) -> None:
        """Keep the first `n_keep` tokens (fed again from the start where the method cannot cut there)."""
        self.feed([], after=n_keep)

    def _cut(self, n_keep: int) -> list[int]:
        """Cut the stream to n_keep tokens: [] when done in place, else the tokens to feed again (the stream is
        then empty)."""
        if n_keep == self.n_past:
            return []
        rc = _lib.farctx_session_rewind(self._session, n_keep)
        if rc == _lib.FARCTX_OK:
            del self.tokens[n_keep:]
            return []
        if rc != _lib.FARCTX_ERR_REPLAY:
            self._raise(rc)
        kept = self.tokens[:n_keep]
        rc = _lib.farctx_session_rewind(self._session, 0)
        if rc != _lib.FARCTX_OK:
            self._raise(rc)
        self.tokens = []
        return kept

    def _progress_callback(self, progress: Optional[ProgressFn]) -> Any:
        self._progress_error = None
        if progress is None:
            return _ffi.NULL

        @_ffi.callback("bool(void *, int64_t, int64_t)")
        def callback(_data: Any, done: int, total: int) -> bool:
            try:
                progress(int(done), int(total))
            except BaseException as exc:  # cancels; re-raised after the feed returns
                self._progress_error = exc
                return False
            return True

        self._callback = callback  # alive for the call
        return callback

    # -- reporting and lifetime ------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """The session's counters (struct farctx_stats): tokens, cells in use, cache size and bytes, ..."""
        s = _ffi.new("struct farctx_stats *")
        _lib.farctx_session_stats(self._session, s)
        return {name: int(getattr(s, name)) for name in STATS_FIELDS}

    def fitted_window(self, n_ubatch: int) -> Optional[str]:
        """A line saying which window the context plan fitted beside n_ubatch into a cache too small for the default
        one (n_local left unset, the cache as a memory budget), else None."""
        st = self.stats()
        if not st["window_fitted"]:
            return None
        head = self.method.info.head
        head_part = f"{head} {getattr(self.method, head)} + " if head else ""
        return (f"{self.method.method}: the KV cache of {st['n_ctx']} cells holds {head_part}n_local {st['n_local']} + "
                f"n_ubatch {n_ubatch}: a window of {st['n_local']} tokens (n_local not set; the default, "
                f"{st['n_ctx_train']}, does not fit)")

    def keeps_plan(self, n_prompt: int) -> bool:
        """Whether a prompt of n_prompt tokens is read under the plan this stream was read under, so that reusing the
        stream's prefix for it equals a fresh run. Only a whole-prompt method (mesa) plans from the prompt's length;
        a prompt it does not chunk runs as vanilla whatever its length, a chunked one has a plan of its own."""
        if not self.method.info.whole_prompt:
            return True
        planned = self.stats()["n_prompt_planned"]
        if planned == 0:
            return True
        return planned == n_prompt or not (self._chunked(planned) or self._chunked(n_prompt))

    def _chunked(self, n_prompt: int) -> bool:
        chunk, n_middle = _ffi.new("int64_t *"), _ffi.new("int64_t *")
        return bool(_lib.farctx_mesa_schedule(self.method.to_c(_ffi, _lib), n_prompt, chunk, n_middle))

    # -- saving and loading (beside llama.cpp's state of the context) ------------------------------------------

    def save(self) -> bytes:
        """The session's state (farctx_session_state_get): with llama.cpp's state of the context, the stream."""
        size = _lib.farctx_session_state_size(self._session)
        buf = _ffi.new("uint8_t[]", size)
        n = _lib.farctx_session_state_get(self._session, buf, size)
        if n != size:
            raise FarctxError(f"could not save the stream's state ({n} of {size} bytes)")
        return bytes(_ffi.buffer(buf, size))

    def load(self, data: bytes, tokens: Sequence[int]) -> None:
        """Restore a state that `save` returned for the stream `tokens`, after llama.cpp's state was loaded."""
        rc = _lib.farctx_session_state_set(self._session, data, len(data))
        if rc != _lib.FARCTX_OK:
            self._raise(rc, "cannot load the state: ")
        held = self._session_n_past()
        if held != len(tokens):
            _lib.farctx_session_rewind(self._session, 0)
            self.tokens = []
            raise FarctxError(f"cannot load the state: it holds {held} tokens, the saved stream {len(tokens)}")
        self.tokens = [int(t) for t in tokens]

    def _session_n_past(self) -> int:
        s = _ffi.new("struct farctx_stats *")
        _lib.farctx_session_stats(self._session, s)
        return int(s.n_past)

    def close(self) -> None:
        """Free the session now (before the context it points into); its cells stay until the caller frees them."""
        if self._session is not None:
            _ffi.release(self._session)
            self._session = None


def feed_together(streams: Sequence[Stream], feeds: Sequence[Sequence[int]]) -> np.ndarray:
    """Append feeds[i] to streams[i] (streams of one context, each fed at least one token) in shared
    llama_decode calls; returns each stream's last-token logits, [len(streams), n_vocab].

    A stream that cannot take its tokens keeps what it had, and the others what was decoded before the failure
    (their `n_past` says how much); the error names the failing stream's sequence.
    """
    arrays = [np.ascontiguousarray(np.asarray(f, dtype=np.int32)) for f in feeds]
    ptrs = _ffi.new("int32_t *[]", [_ffi.from_buffer("int32_t[]", a) for a in arrays])
    counts = _ffi.new("int32_t[]", [len(a) for a in arrays])
    out = np.empty((len(streams), streams[0].n_vocab), dtype=np.single)
    failed = _ffi.new("int32_t *")
    sessions = _ffi.new("struct farctx_session *[]", [s._session for s in streams])
    rc = _lib.farctx_sessions_feed(sessions, len(streams), _ffi.cast("const int32_t * const *", ptrs), counts,
                                   _ffi.from_buffer("float[]", out), failed)
    for stream, arr in zip(streams, arrays):
        n_fed = stream._session_n_past() - stream.n_past
        stream.tokens.extend(int(t) for t in arr[:n_fed])
        stream._note_length()
    if rc != _lib.FARCTX_OK:
        at = failed[0] if 0 <= failed[0] < len(streams) else 0
        streams[at]._raise(rc, f"sequence {streams[at].seq}: ")
    return out


def open_tokenizer(model_path: str | os.PathLike[str]) -> Any:
    """llama_cpp.Llama with the model's vocabulary only (no weights, no context): tokenize, detokenize, the
    chat template and the metadata, loaded in a fraction of a second. The caller closes it."""
    return _N.llama_cpp.Llama(str(model_path), vocab_only=True, verbose=False)
