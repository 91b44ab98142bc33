"""`farctx serve --parallel N`: the server's requests in N slots of one `SequenceBatch` (continuous batching).

The HTTP side is server.py's (request models, validation, errors, streams, limits). What changes is the
engine under a request: a `_RequestView` that looks like llama_cpp.Llama to llama-cpp-python's own
completion and chat code (tokenizing, chat templates, stop strings, UTF-8 boundaries, chunk and
response shapes, finish_reason, usage), with a vocabulary-only llama_cpp.Llama behind it for the
tokenizer and the chat template, and whose `generate` hands the prompt tokens and the request's
sampler chain to the `Scheduler` and yields the tokens it samples. llama_cpp's code stops reading
(a stop string, max_tokens) by closing the generator: that cancels the request's slot.
"""

from __future__ import annotations

import queue
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from .batch import SequenceBatch
from .errors import FarctxError
from .methods import MethodParams, cache_cells, method_infos
from .scheduler import Request, Scheduler
from .sampling import RowSampler
from .server import Server, _Cancelled, _Job


class _RequestView:
    """llama_cpp.Llama as llama-cpp-python's completion code sees it, for one request: attributes come
    from the shared vocabulary-only front; seed, max_tokens and generation are the request's own."""

    def __init__(self, server: "BatchedServer", job: _Job, method: dict[str, Any],
                 progress: Callable[[int, int], None]) -> None:
        self._server = server
        self._job = job
        self._method = method
        self._progress = progress
        self._seed = server.next_seed()
        self._n_ctx = 2**31 - 1  # llama_cpp bounds prompts by this: the scheduler checks them instead
        self.max_tokens: Optional[int] = None
        self.last_prompt_tokens = 0
        self.request: Optional[Request] = None
        # llama_cpp reads these after its generation loop (stopping criteria): the stream, a logits row
        self._input_ids = np.zeros(0, dtype=np.intc)
        self._scores = np.zeros((1, 1), dtype=np.single)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server.front, name)

    def set_seed(self, seed: int) -> None:
        self._seed = seed

    def detokenize(self, tokens: list[int], prev_tokens: Optional[list[int]] = None, special: bool = False) -> bytes:
        """llama_cpp.Llama.detokenize's bytes, from the server's cache of token pieces: llama_cpp's streaming
        code detokenizes the whole answer again at every token, one ctypes call per token."""
        return self._server.pieces.detokenize(tokens, special)

    def create_completion(self, prompt: Any, *args: Any, **kwargs: Any) -> Any:
        self.max_tokens = kwargs.get("max_tokens", args[1] if len(args) > 1 else 16)
        return self._llama_cpp().Llama.create_completion(self, prompt, *args, **kwargs)

    def _create_completion(self, *args: Any, **kwargs: Any) -> Any:
        return self._llama_cpp().Llama._create_completion(self, *args, **kwargs)

    def create_chat_completion(self, *args: Any, **kwargs: Any) -> Any:
        return self._llama_cpp().Llama.create_chat_completion(self, *args, **kwargs)

    def generate(self, tokens: Sequence[int], top_k: int = 40, top_p: float = 0.95, min_p: float = 0.05,
                 typical_p: float = 1.0, temp: float = 0.80, repeat_penalty: float = 1.0, reset: bool = True,
                 frequency_penalty: float = 0.0, presence_penalty: float = 0.0, tfs_z: float = 1.0,
                 mirostat_mode: int = 0, mirostat_tau: float = 5.0, mirostat_eta: float = 0.1,
                 penalize_nl: bool = True, logits_processor: Any = None, stopping_criteria: Any = None,
                 grammar: Any = None) -> Iterator[int]:
        """The tokens the scheduler samples for `tokens` under this request's sampler chain (llama_cpp's)."""
        chain = self._llama_cpp().Llama._init_sampler(
            self, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p, temp=temp,
            repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
            tfs_z=tfs_z, mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
            penalize_nl=penalize_nl, logits_processor=logits_processor, grammar=grammar)
        return self._server.generate(self, list(tokens), RowSampler(chain, self._server.batch.n_vocab),
                                     stopping_criteria)

    @staticmethod
    def _llama_cpp() -> Any:
        from ._native import native

        return native().llama_cpp


class _Pieces:
    """Each token's text (llama_token_to_piece), looked up once; detokenize as llama_cpp's LlamaModel does."""

    def __init__(self, front: Any) -> None:
        self._front = front
        self._bos = front.token_bos()
        # the whole vocabulary at start (a fraction of a second): memory does not grow with the tokens seen
        self._cache: dict[tuple[int, bool], bytes] = {
            (token, special): _raw_piece(front, token, special)
            for token in range(front.n_vocab()) for special in (False, True)}

    def piece(self, token: int, special: bool) -> bytes:
        key = (token, special)
        piece = self._cache.get(key)
        if piece is None:
            piece = self._cache[key] = _raw_piece(self._front, token, special)
        return piece

    def detokenize(self, tokens: list[int], special: bool) -> bytes:
        output = b"".join([self.piece(int(t), special) for t in tokens])
        if tokens and tokens[0] == self._bos and output[:1] == b" ":
            return output[1:]
        return output


def _raw_piece(front: Any, token: int, special: bool) -> bytes:
    """llama_token_to_piece's bytes for one token (no BOS rule)."""
    import ctypes

    from ._native import native

    lc = native().llama_cpp
    buffer = (ctypes.c_char * 32)()
    n = lc.llama_token_to_piece(front._model.vocab, lc.llama_token(token), buffer, 32, 0, special)
    return bytes(buffer[:max(0, n)])


@dataclass
class BatchedServer(Server):
    """Server with `n_parallel` slots, each a stream of one SequenceBatch with a cache of `ctx_max` cells (at
    least what the server's own method needs when it has a fixed cache)."""

    n_parallel: int = 1
    _seed_rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        import collections

        self.statuses = collections.Counter()
        self._status_lock = threading.Lock()
        lc = self._llama_cpp()
        kwargs = {k: v for k, v in self.slot.llama_kwargs.items() if k != "n_ctx"}
        kwargs.setdefault("verbose", False)
        method = self.slot.method
        n_ubatch = min(kwargs.get("n_ubatch") or 512, kwargs.get("n_batch") or 512)
        n_ctx_seq = self.slot.ctx_max
        if method_infos()[method["method"]].fixed_cache:
            params = MethodParams.from_kwargs(method["method"], {k: v for k, v in method.items() if k != "method"})
            n_ctx_seq = max(n_ctx_seq, cache_cells(params, self.slot.n_ctx_train, n_ubatch))
        self.front = lc.Llama(self.slot.path, vocab_only=True, verbose=False)
        self.pieces = _Pieces(self.front)
        self.batch = SequenceBatch(self.slot.path, n_seq=self.n_parallel, n_ctx_seq=n_ctx_seq, **kwargs)
        params = {k: v for k, v in method.items() if k != "method"}
        for seq in range(self.n_parallel):  # the server's method in every slot: a bad model fails at startup
            self.batch.open(seq, method["method"], **params)
        vocab = self.front._model.vocab
        self.scheduler = Scheduler(self.batch, n_batch=int(kwargs.get("n_batch") or 512), n_ubatch=n_ubatch,
                                   n_ctx_train=self.slot.n_ctx_train,
                                   is_eog=lambda token: bool(lc.llama_vocab_is_eog(vocab, token)))
        self.scheduler.start()
        described = MethodParams.from_kwargs(method["method"], params)
        self.meta = {
            "method": method["method"],
            "params": self._relevant(method),
            "n_ctx": n_ctx_seq,
            "n_ctx_train": self.slot.n_ctx_train,
            "ctx_max": n_ctx_seq,
            "path": self.slot.path,
            "override": self.allow_override,
            "n_parallel": self.n_parallel,
        }
        self._described = f"{described.method}, {self.n_parallel} slots of {n_ctx_seq} cells"

    def _relevant(self, method: dict[str, Any]) -> dict[str, int]:
        """The parameters the method reads, 0s resolved as libfarctx resolves them (n_ctx_train from the
        model; a fixed cache's n_local from its size)."""
        info = method_infos()[method["method"]]
        values = MethodParams.from_kwargs(method["method"], {k: v for k, v in method.items() if k != "method"})
        relevant = values.relevant()
        if "n_ctx_train" in relevant and not relevant["n_ctx_train"]:
            relevant["n_ctx_train"] = self.slot.n_ctx_train
        if info.fixed_cache and "n_local" in relevant and not relevant["n_local"]:
            head = relevant.get(info.head, 0) if info.head else 0
            relevant["n_local"] = cache_cells(values, self.slot.n_ctx_train, 0) - head
        return relevant

    def describe(self) -> str:
        return self._described

    def next_seed(self) -> int:
        with self._status_lock:
            return self._seed_rng.randint(0, 2**32 - 1)

    def health(self) -> dict[str, Any]:
        snap = self.scheduler.snapshot()
        return {"status": "ok", "slots_idle": snap["n_slots"] - snap["slots_busy"],
                "slots_processing": snap["slots_busy"], "requests_waiting": snap["waiting"]}

    def metrics_text(self) -> str:
        from .metrics import render

        with self._status_lock:
            statuses = dict(self.statuses)
        return render(statuses, self.scheduler.snapshot())

    def close(self) -> None:
        self.scheduler.stop()
        self.batch.close()

    # -- a request ----------------------------------------------------------------------------------

    def _work(self, job: _Job, body: Any, kwargs: dict[str, Any], chat: bool) -> None:
        if job.cancel.is_set():
            return
        self._serve_reporting(job, body, kwargs, chat)

    def _run(self, job: _Job, call: Callable[[Any], Any], override: Optional[dict[str, Any]],
             progress: Callable[[int, int], None]) -> Any:
        method = self.slot.resolve(override)
        _validate(method)
        return call(_RequestView(self, job, method, progress))

    def generate(self, view: _RequestView, tokens: list[int], sampler: RowSampler,
                 stopping_criteria: Any = None) -> Iterator[int]:
        """Submits the request when first asked for a token (after its size check), then yields what
        the scheduler samples until the request ends; closing it cancels the request's slot."""
        job = view._job
        limit = self.scheduler.generation_limit(view._method, len(tokens), view.max_tokens)
        view.last_prompt_tokens = len(tokens)
        request = Request(prompt=tokens, method=view._method, sampler=sampler, max_tokens=limit,
                          deadline=job.deadline, progress=view._progress)
        view.request = request
        return self._tokens(view, request, stopping_criteria)

    def _tokens(self, view: _RequestView, request: Request, stopping_criteria: Any) -> Iterator[int]:
        """llama_cpp.Llama.generate's loop: a token that meets the stopping criteria ends it unseen."""
        job = view._job
        stream = list(request.prompt)
        view._input_ids = np.asarray(stream, dtype=np.intc)
        self.scheduler.submit(request)
        try:
            while True:
                try:
                    kind, value = request.events.get(timeout=0.1)
                except queue.Empty:
                    if job.cancel.is_set() or job.expired():
                        raise _Cancelled() from None
                    continue
                if kind == "token":
                    stream.append(value)
                    if stopping_criteria is not None:
                        view._input_ids = np.asarray(stream, dtype=np.intc)
                        if stopping_criteria(view._input_ids, view._scores[-1, :]):
                            return
                    yield value
                elif kind == "end":
                    if value == "cancelled":
                        raise _Cancelled()
                    return
                else:
                    raise value
        finally:
            self.scheduler.cancel(request)

    @staticmethod
    def _llama_cpp() -> Any:
        from ._native import native

        return native().llama_cpp


def _validate(method: dict[str, Any]) -> None:
    """libfarctx's check of the parameters (the model's own checks come when a slot opens the method)."""
    from ._native import native

    n = native()
    params = MethodParams.from_kwargs(method["method"], {k: v for k, v in method.items() if k != "method"})
    err = n.ffi.new("char[]", 512)
    if n.lib.farctx_params_validate(params.to_c(n.ffi, n.lib), n.ffi.NULL, err, 512) != n.lib.FARCTX_OK:
        raise FarctxError(n.ffi.string(err).decode("utf-8", errors="replace"))

