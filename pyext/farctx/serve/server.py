"""The server's state and its one loop: `n_parallel` slots (streams) of one `SequenceBatch`, fed together by a
`Scheduler` thread (continuous batching); `-np 1` is one slot.

Each request runs llama-cpp-python's own completion or chat code in a thread of its own, over a `RequestView`
(the llama_cpp.Llama face of one request: tokenizer, chat template, stop strings, response shapes), whose
`generate` hands the prompt tokens and the request's sampler chain to the scheduler and yields the tokens it
samples. Events go back to the event loop through the request's `_Job`. A client that goes away cancels its
request (between tokens, or between prompt pieces); a timeout (`-to`) cancels it and answers 408.

Sizes follow llama-server: `-c` is the cells of all slots together, each slot gets `c / np`; without `-c` a
slot gets what the server's method needs (`farctx.methods.context_plan`). A request that does not fit its slot
is answered with llama.cpp's `exceed_context_size_error` and the sizes. A request may ask for another method
(the `farctx` field): its slot's stream is opened again under it; nothing is reloaded.
"""

from __future__ import annotations

import asyncio
import collections
import json
import queue
import random
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Optional

from fastapi.responses import JSONResponse
from llama_cpp.server.app import prepare_request_resources
from sse_starlette.sse import EventSourceResponse

from ..batch import SequenceBatch
from ..context import LoadedModel, RuntimeOptions
from ..errors import ContextSizeError, EmptyPromptError, FarctxError
from ..methods import MethodParams, split_method_kwargs
from ..models import resolve_model_path
from ..progress import Progress
from ..stream import check_params, open_tokenizer
from .job import Cancelled, Job
from .requests import NOT_LLAMA_KWARGS, ChatCompletionRequest, CompletionRequest, error_body
from .sampling import RowSampler
from .scheduler import Request, RequestTimeout, Scheduler
from .view import Pieces, RequestView


def error_response(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The HTTP status and body of a request that failed with `exc`."""
    if isinstance(exc, RequestTimeout):
        return 408, error_body(408, str(exc), "timeout_error")
    if isinstance(exc, ContextSizeError):
        return 400, error_body(400, str(exc), "exceed_context_size_error", n_prompt_tokens=exc.n_prompt_tokens,
                               n_ctx=exc.n_ctx)
    if isinstance(exc, FarctxError):
        return 400, error_body(400, str(exc), "invalid_request_error")
    if isinstance(exc, ValueError):  # llama_cpp's refusals of a request (e.g. logprobs without logits_all)
        return 400, error_body(400, str(exc), "invalid_request_error")
    print("farctx: request failed:", file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)
    return 500, error_body(500, f"{type(exc).__name__}: {exc}", "server_error")


@dataclass
class Limits:
    """Per-request limits: n_predict caps max_tokens (a request asking more, or nothing, gets the cap; 0:
    none), timeout cancels a request that runs longer (seconds from its arrival; 0: none)."""

    n_predict: int = 0
    timeout: float = 0.0


@dataclass
class Server:
    """A model served in `n_parallel` slots. `kwargs` are farctx.Llama's (the method and its parameters, `n_ctx`
    as the cells of all slots, `n_batch`, `n_ubatch`, `flash_attn`, ...); `alias` is the model's name in the API."""

    model_path: Optional[str]
    kwargs: dict[str, Any]
    alias: str
    n_parallel: int = 1
    allow_override: bool = True
    limits: Limits = field(default_factory=Limits)
    metrics: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    _seed_rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        self.statuses: collections.Counter[str] = collections.Counter()
        self._status_lock = threading.Lock()
        self.path = str(resolve_model_path(self.model_path))
        kwargs = dict(self.kwargs)
        params = split_method_kwargs(kwargs)
        self.method = {"method": params.method, **{k: kwargs.pop(k) for k in MethodParams.names() if k in kwargs}}
        kwargs.pop("method", None)
        deterministic = bool(kwargs.pop("deterministic", False))
        runtime = RuntimeOptions.take(kwargs)
        if kwargs:
            raise FarctxError(f"unexpected keyword argument(s): {', '.join(sorted(kwargs))}")
        model = LoadedModel(self.path, runtime, deterministic=deterministic)
        self.n_ctx_train = params.n_ctx_train or model.facts.n_ctx_train
        try:
            # the slots' cells and batch sizes: the plan every surface asks, with -c shared by the slots
            plan = model.plan(params, n_seq=self.n_parallel)
        except FarctxError:
            model.close()
            raise
        self.batch = SequenceBatch.planned(model, plan, self.n_parallel)
        self.front = open_tokenizer(self.path)
        self.pieces = Pieces(self.front)
        options = {k: v for k, v in self.method.items() if k != "method"}
        for seq in range(self.n_parallel):  # the server's method in every slot: a bad model fails at startup
            self.batch.open(seq, params.method, **options)
        vocab = model.model.vocab
        lc = _llama_cpp()
        self.scheduler = Scheduler(self.batch, n_batch=plan.n_batch, n_ubatch=plan.n_ubatch,
                                   n_ctx_train=self.n_ctx_train, n_swa=model.facts.n_swa,
                                   is_eog=lambda token: bool(lc.llama_vocab_is_eog(vocab, token)))
        self.scheduler.start()
        resolved = self.batch.method(0)  # defaults resolved by libfarctx against the model
        self.meta = {
            "method": resolved.method,
            "method_summary": resolved.describe(),  # what auto runs inside and past the trained context
            "params": resolved.relevant(),
            "n_ctx": self.batch.n_ctx_seq,  # per slot
            "n_ctx_train": self.n_ctx_train,
            "n_parallel": self.n_parallel,
            "path": self.path,
            "override": self.allow_override,
            "deterministic": self.batch.deterministic,
        }

    def describe(self) -> str:
        slots = f"{self.n_parallel} slots" if self.n_parallel > 1 else "1 slot"
        fitted = ("; n_local not set: the window fitted into each slot's cells" if self.batch.stats(0)["window_fitted"]
                  else "")
        det = ", batch-invariant kernels" if self.batch.deterministic else ""
        return f"{self.batch.method(0).describe()}, {slots} of {self.batch.n_ctx_seq} cells{det}{fitted}"

    def next_seed(self) -> int:
        with self._status_lock:
            return self._seed_rng.randint(0, 2**32 - 1)

    def health(self) -> dict[str, Any]:
        snap = self.scheduler.snapshot()
        return {"status": "ok", "slots_idle": snap["n_slots"] - snap["slots_busy"],
                "slots_processing": snap["slots_busy"], "requests_waiting": snap["waiting"]}

    def count(self, status: int | str) -> None:
        with self._status_lock:
            self.statuses[str(status)] += 1

    def metrics_text(self) -> str:
        from .metrics import render

        with self._status_lock:
            statuses = dict(self.statuses)
        return render(statuses, self.scheduler.snapshot())

    def close(self) -> None:
        self.scheduler.stop()
        self.batch.close()
        self.front.close()

    # -- a request, in its thread -------------------------------------------------------------------

    def _work(self, job: Job, body: CompletionRequest | ChatCompletionRequest, kwargs: dict[str, Any],
              chat: bool) -> None:
        if job.cancel.is_set():
            return
        try:
            self._serve(job, body, kwargs, chat)
        except Cancelled:
            if job.timed_out:
                job.emit("error", RequestTimeout("the request ran past the server's --timeout and was cancelled"))
        except BaseException as exc:  # reported to the client, the server stays up
            job.emit("error", exc)

    def resolve(self, override: Optional[dict[str, Any]]) -> dict[str, Any]:
        """The method and parameters of a request: the server's, updated with `override` (checked)."""
        if override and not self.allow_override:
            raise FarctxError("this server does not take a per-request method (started with --no-override)")
        merged = dict(self.method)
        merged.update({k: v for k, v in (override or {}).items() if v is not None})
        method = merged.pop("method")
        check_params(MethodParams.from_kwargs(method, merged))  # unknown names, wrong types, bad values
        return {"method": method, **merged}

    def _serve(self, job: Job, body: CompletionRequest | ChatCompletionRequest, kwargs: dict[str, Any],
               chat: bool) -> None:
        override = body.farctx.model_dump(exclude_none=True) if body.farctx is not None else None
        method = self.resolve(override)
        state: dict[str, Any] = {"model": kwargs["model"]}
        progress = self._progress(job, state, bool(body.stream and body.return_progress), chat)
        view = RequestView(self.front, self.pieces, job, method, progress, seed=self.next_seed(),
                           n_vocab=self.batch.n_vocab, run=self.generate)
        state["llm"] = view
        prepare_request_resources(body, lambda _model: view, None, kwargs)  # type: ignore[arg-type]
        result = (view.create_chat_completion if chat else view.create_completion)(**kwargs)
        if not body.stream:
            job.emit("result", result)
            return
        n_completion = 0  # llama_cpp streams one chunk per sampled token
        chunks = iter(result)
        try:
            for chunk in chunks:
                if job.cancel.is_set() or job.expired():
                    if job.timed_out:
                        raise Cancelled()
                    return
                choice = chunk["choices"][0] if chunk.get("choices") else {}
                n_completion += choice.get("finish_reason") is None and ("text" in choice or "content" in
                                                                         (choice.get("delta") or {}))
                job.emit("chunk", chunk)
        finally:
            getattr(chunks, "close", lambda: None)()
        if body.stream_options is not None and body.stream_options.include_usage:
            n_prompt = view.last_prompt_tokens
            job.emit("chunk", {
                "id": f"usage-{uuid.uuid4()}", "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": kwargs.get("model"), "choices": [],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                          "total_tokens": n_prompt + n_completion},
            })
        job.emit("done")

    def _progress(self, job: Job, state: dict[str, Any], to_client: bool, chat: bool) -> Callable[[int, int], None]:
        """Prompt progress (the scheduler calls it after each piece): cancels when the client is gone; llama.cpp's
        `prompt_progress` chunks when asked for; a progress line on the log for long prompts."""
        started = time.monotonic()
        log = Progress("prefill", min_total=1024)
        request_id = f"progress-{uuid.uuid4()}"

        def progress(done: int, total: int) -> None:
            if job.cancel.is_set() or job.expired():
                raise Cancelled()  # the scheduler ends the request
            log(done, total)
            if not to_client:
                return
            n_prompt = state["llm"].last_prompt_tokens
            cache = max(0, n_prompt - total)
            choice: dict[str, Any] = {"index": 0, "finish_reason": None}
            choice.update({"delta": {}} if chat else {"text": "", "logprobs": None})
            job.emit("chunk", {
                "id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": state.get("model"), "choices": [choice],
                "prompt_progress": {"total": n_prompt, "cache": cache, "processed": min(n_prompt, cache + done),
                                    "time_ms": round(1000 * (time.monotonic() - started), 3)},
            })

        return progress

    def generate(self, view: RequestView, tokens: list[int], sampler: RowSampler,
                 stopping_criteria: Any = None) -> Iterator[int]:
        """The tokens the scheduler samples for the prompt `tokens` under the request's sampler chain; raises
        ContextSizeError / FarctxError with the sizes when the request cannot fit in a slot. Closing the iterator
        cancels the request's slot."""
        if not tokens:  # nothing to sample from (llama_cpp would assert): the scheduler would wait for ever
            raise EmptyPromptError()
        limit = self.scheduler.generation_limit(view.method, len(tokens), view.max_tokens)
        view.last_prompt_tokens = len(tokens)
        request = Request(prompt=tokens, method=view.method, sampler=sampler, max_tokens=limit,
                          deadline=view.job.deadline, progress=view.progress)
        return self._tokens(view, request, stopping_criteria)

    def _tokens(self, view: RequestView, request: Request, stopping_criteria: Any) -> Iterator[int]:
        """llama_cpp.Llama.generate's loop: a token that meets the stopping criteria ends it unseen."""
        job = view.job
        stream = list(request.prompt)
        view.show_stream(stream)
        self.scheduler.submit(request)
        try:
            while True:
                if job.cancel.is_set() or job.expired():  # the client left, or the request ran past --timeout
                    raise Cancelled()
                try:
                    kind, value = request.events.get(timeout=0.1)
                except queue.Empty:
                    continue
                if kind == "token":
                    stream.append(value)
                    if stopping_criteria is not None:
                        if stopping_criteria(view.show_stream(stream), view.scores_row()):
                            return
                    yield value
                elif kind == "end":
                    if value == "cancelled":
                        raise Cancelled()
                    return
                else:
                    raise value
        finally:
            self.scheduler.cancel(request)

    # -- the endpoints' side (the event loop) --------------------------------------------------------

    async def handle(self, body: CompletionRequest | ChatCompletionRequest, chat: bool,
                     gone: Optional[Callable[[], Any]] = None) -> Any:
        """Serve one request. `gone` (an awaitable check, e.g. Starlette's request.is_disconnected) is asked
        while the request waits and runs: a client that left before the first byte of its answer cancels it
        (its slot is freed; counted 499), as a streamed request is cancelled when its client leaves."""
        kwargs = body.model_dump(exclude=NOT_LLAMA_KWARGS)
        fields = type(body).model_fields
        for name, value in kwargs.items():  # an explicit null is the field's default, as in OpenAI's API
            if value is None and name in fields and fields[name].default is not None:
                kwargs[name] = fields[name].default
        kwargs["model"] = body.model or self.alias
        if chat and body.max_completion_tokens is not None:  # type: ignore[union-attr]
            kwargs["max_tokens"] = body.max_completion_tokens  # type: ignore[union-attr]
        if self.limits.n_predict > 0:  # llama-server's -n: a request asking more (or nothing) gets the cap
            asked = kwargs.get("max_tokens")
            kwargs["max_tokens"] = min(asked, self.limits.n_predict) if asked and asked > 0 else self.limits.n_predict
        job = Job(asyncio.get_running_loop())
        if self.limits.timeout > 0:
            job.deadline = time.monotonic() + self.limits.timeout
        threading.Thread(target=self._work, args=(job, body, kwargs, chat), daemon=True,
                         name="farctx-request").start()
        try:
            kind, value = await self._first_event(job, gone)
        except BaseException:
            job.cancel.set()
            self.count(499)
            raise
        if kind == "gone":
            job.cancel.set()
            self.count(499)
            return JSONResponse(error_body(499, "the client closed the connection", "cancelled"), status_code=499)
        if kind == "error":
            status, payload = error_response(value)
            self.count(status)
            return JSONResponse(payload, status_code=status)
        if not body.stream:
            self.count(200)
            return value
        return EventSourceResponse(self._events(job, (kind, value)), sep="\n")

    @staticmethod
    async def _first_event(job: Job, gone: Optional[Callable[[], Any]]) -> tuple[str, Any]:
        """The job's first event, or ("gone", None) when `gone` says the client left first (asked twice a
        second)."""
        if gone is None:
            return await job.queue.get()
        getter = asyncio.ensure_future(job.queue.get())
        try:
            while True:
                done, _ = await asyncio.wait({getter}, timeout=0.5)
                if done:
                    return getter.result()
                if await gone():
                    return "gone", None
        finally:
            getter.cancel()

    async def _events(self, job: Job, first: tuple[str, Any]) -> AsyncIterator[dict[str, str]]:
        status: int = 499  # the client went away before the end
        try:
            kind, value = first
            while True:
                if kind == "done":
                    status = 200
                    yield {"data": "[DONE]"}
                    return
                if kind == "error":
                    status, payload = error_response(value)
                    yield {"data": json.dumps(payload)}
                    return
                yield {"data": json.dumps(value)}
                kind, value = await job.queue.get()
        finally:  # the client went away, or the stream is over: the worker stops at its next token
            job.cancel.set()
            self.count(status)


def _llama_cpp() -> Any:
    from .._native import native

    return native().llama_cpp
