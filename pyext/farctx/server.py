"""`farctx serve`: an OpenAI-compatible HTTP server over one `Slot`.

Reuses llama-cpp-python's server pieces where they fit: its request models (extended here:
unknown fields are an error, `max_tokens` is bounded, plus `farctx`, `return_progress`,
`stream_options` and `max_completion_tokens`), its request preparation (logit bias, grammar,
min_tokens) and sse-starlette for streams. Its app is not reused: it keeps one model in
module-level globals, ignores unknown fields, and has no place for per-request cache sizing,
`prompt_progress` chunks or llama.cpp's `exceed_context_size_error`.

Without --parallel, requests are served one at a time: a worker thread takes the slot's lock and holds
it until its completion or stream is over; a client that goes away cancels its work (between tokens,
or between prefill batches) and the lock is released by the thread that holds it. With --parallel N,
`batched_server.BatchedServer` serves them in N slots at once (continuous batching) through the same
app, request models and response shapes.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import ipaddress
import json
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Literal, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from llama_cpp.server.app import prepare_request_resources
from llama_cpp.server.types import CreateChatCompletionRequest, CreateCompletionRequest
from pydantic import BaseModel, ConfigDict, Field, create_model
from sse_starlette.sse import EventSourceResponse

from .errors import FarctxError
from .methods import method_names, param_infos
from .progress import Progress
from .scheduler import RequestTimeout
from .slot import ContextError, Slot, SlotLlama

MAX_TOKENS = 2**31 - 1  # positions are 32-bit


def _override_model() -> type[BaseModel]:
    """The `farctx` body field: this request's method and parameters (the server's for the rest), one
    field per row of libfarctx's parameter table."""
    methods = method_names()
    fields: dict[str, Any] = {"method": (Optional[Literal[methods]], None)}  # type: ignore[valid-type]
    for p in param_infos():
        fields[p.name] = (Optional[int], Field(None, ge=p.minimum, description=p.option_help(methods)))
    return create_model("FarctxOverride", __config__=ConfigDict(extra="forbid"), **fields)


FarctxOverride = _override_model()


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class _Extensions(BaseModel):
    """What farctx adds to llama-cpp-python's request models."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS)
    n: Optional[int] = Field(default=1, ge=1, le=1, description="one choice per request")
    farctx: Optional[FarctxOverride] = None  # type: ignore[valid-type]
    return_progress: bool = Field(default=False, description="prompt_progress chunks while a stream prefills")
    stream_options: Optional[StreamOptions] = None


class CompletionRequest(_Extensions, CreateCompletionRequest):
    max_tokens: Optional[int] = Field(default=16, ge=1, le=MAX_TOKENS)


class ChatCompletionRequest(_Extensions, CreateChatCompletionRequest):
    max_completion_tokens: Optional[int] = Field(default=None, ge=1, le=MAX_TOKENS)


_NOT_LLAMA_KWARGS = {"n", "best_of", "logit_bias_type", "user", "min_tokens", "farctx", "return_progress",
                     "stream_options", "max_completion_tokens"}


def error_body(status: int, message: str, kind: str, **extra: Any) -> dict[str, Any]:
    """llama.cpp server's error shape (OpenAI's plus `code` as the HTTP status)."""
    return {"error": {"code": status, "message": message, "type": kind, **extra}}


def _error_response(exc: BaseException) -> tuple[int, dict[str, Any]]:
    if isinstance(exc, RequestTimeout):
        return 408, error_body(408, str(exc), "timeout_error")
    if isinstance(exc, ContextError):
        return 400, error_body(400, str(exc), "exceed_context_size_error", n_prompt_tokens=exc.n_prompt_tokens,
                               n_ctx=exc.n_ctx)
    if isinstance(exc, FarctxError):
        return 400, error_body(400, str(exc), "invalid_request_error")
    if isinstance(exc, ValueError):  # llama_cpp's refusals of a request (e.g. logprobs without logits_all)
        return 400, error_body(400, str(exc), "invalid_request_error")
    print("farctx: request failed:", file=sys.stderr)
    traceback.print_exception(exc, file=sys.stderr)
    return 500, error_body(500, f"{type(exc).__name__}: {exc}", "server_error")


class _Cancelled(Exception):
    pass


@dataclass
class _Job:
    """One request's work on the slot, run in a thread; events go to the event loop's queue."""

    loop: asyncio.AbstractEventLoop
    queue: "asyncio.Queue[tuple[str, Any]]" = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    deadline: Optional[float] = None  # time.monotonic() past which the request is cancelled (--timeout)
    timed_out: bool = False

    def expired(self) -> bool:
        """Past the deadline: the request is cancelled (and answered with a timeout error)."""
        if self.deadline is not None and time.monotonic() > self.deadline and not self.timed_out:
            self.timed_out = True
            self.cancel.set()
        return self.timed_out

    def emit(self, kind: str, value: Any = None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is gone (server shutting down)
            self.cancel.set()


@dataclass
class Limits:
    """Per-request limits: n_predict caps max_tokens (a request asking more, or nothing, gets the cap; 0:
    none), timeout cancels a request that runs longer (seconds from its arrival; 0: none)."""

    n_predict: int = 0
    timeout: float = 0.0


@dataclass
class Server:
    """The app's state: the slot, the name clients use for the model, and the policy."""

    slot: Slot
    alias: str
    allow_override: bool = True
    limits: Limits = field(default_factory=Limits)
    metrics: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.statuses: collections.Counter[str] = collections.Counter()
        self._status_lock = threading.Lock()
        llm = self.slot.engine(self.slot.method)  # load now: a bad model fails at startup
        self.meta = {
            "method": llm.method_params.method,
            "params": llm.method_params.relevant(),
            "n_ctx": llm.n_ctx(),
            "n_ctx_train": self.slot.n_ctx_train,
            "ctx_max": self.slot.ctx_max,
            "path": self.slot.path,
            "override": self.allow_override,
        }

    def describe(self) -> str:
        return self.slot.engine(self.slot.method).method_params.describe()

    def health(self) -> dict[str, Any]:
        return {"status": "ok"}

    def count(self, status: int | str) -> None:
        with self._status_lock:
            self.statuses[str(status)] += 1

    def metrics_text(self) -> str:
        from .metrics import render

        with self._status_lock:
            statuses = dict(self.statuses)
        return render(statuses, None)

    # -- the worker --------------------------------------------------------------------------

    def _work(self, job: _Job, body: CompletionRequest | ChatCompletionRequest, kwargs: dict[str, Any],
              chat: bool) -> None:
        with self.slot.lock:
            if job.cancel.is_set() or job.expired():
                if job.timed_out:
                    job.emit("error", RequestTimeout("the request timed out waiting for the model (--timeout)"))
                return
            self._serve_reporting(job, body, kwargs, chat)

    def _serve_reporting(self, job: _Job, body: CompletionRequest | ChatCompletionRequest, kwargs: dict[str, Any],
                         chat: bool) -> None:
        try:
            self._serve(job, body, kwargs, chat)
        except _Cancelled:
            if job.timed_out:
                job.emit("error", RequestTimeout("the request ran past the server's --timeout and was cancelled"))
        except BaseException as exc:  # reported to the client, the server stays up
            job.emit("error", exc)

    def _serve(self, job: _Job, body: CompletionRequest | ChatCompletionRequest, kwargs: dict[str, Any],
               chat: bool) -> None:
        override = body.farctx.model_dump(exclude_none=True) if body.farctx is not None else None
        if override and not self.allow_override:
            raise FarctxError("this server does not take a per-request method (started with --no-override)")
        state: dict[str, Any] = {"model": kwargs["model"]}

        def call(llm: SlotLlama) -> Any:
            state["llm"] = llm
            args = dict(kwargs)  # prepared again when the cache is resized
            prepare_request_resources(body, lambda _model: llm, None, args)  # type: ignore[arg-type]
            return (llm.create_chat_completion if chat else llm.create_completion)(**args)

        progress = self._progress(job, state, body.stream and body.return_progress, chat)
        result = self._run(job, call, override, progress)
        if not body.stream:
            job.emit("result", result)
            return
        n_completion = 0  # llama_cpp streams one chunk per sampled token
        chunks = iter(result)
        try:
            for chunk in chunks:
                if job.cancel.is_set() or job.expired():
                    if job.timed_out:
                        raise _Cancelled()
                    return
                choice = chunk["choices"][0] if chunk.get("choices") else {}
                n_completion += choice.get("finish_reason") is None and ("text" in choice or "content" in
                                                                         (choice.get("delta") or {}))
                job.emit("chunk", chunk)
        finally:
            getattr(chunks, "close", lambda: None)()
        if body.stream_options is not None and body.stream_options.include_usage:
            n_prompt = state["llm"].last_prompt_tokens
            job.emit("chunk", {
                "id": f"usage-{uuid.uuid4()}", "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": kwargs.get("model"), "choices": [],
                "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_completion,
                          "total_tokens": n_prompt + n_completion},
            })
        job.emit("done")

    def _run(self, job: _Job, call: Callable[[Any], Any], override: Optional[dict[str, Any]],
             progress: Callable[[int, int], None]) -> Any:
        """call(engine): the engine of the slot, loaded and sized for this request."""
        return self.slot.run(call, override, progress)

    def _progress(self, job: _Job, state: dict[str, Any], to_client: bool, chat: bool) -> Callable[[int, int], None]:
        """Prefill progress: cancels when the client is gone; llama.cpp's `prompt_progress` chunks
        when asked for; a progress line on the log for long prompts. Only the prompt's feed reports."""
        started = time.monotonic()
        log = Progress("prefill", min_total=1024)
        request_id = f"progress-{uuid.uuid4()}"

        def progress(done: int, total: int) -> None:
            if job.cancel.is_set() or job.expired():
                raise _Cancelled()
            if state.get("prompt_done"):
                return
            state["prompt_done"] = done >= total
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

    # -- the endpoints -----------------------------------------------------------------------

    async def handle(self, body: CompletionRequest | ChatCompletionRequest, chat: bool) -> Any:
        kwargs = body.model_dump(exclude=_NOT_LLAMA_KWARGS)
        kwargs["model"] = body.model or self.alias
        if chat and body.max_completion_tokens is not None:  # type: ignore[union-attr]
            kwargs["max_tokens"] = body.max_completion_tokens  # type: ignore[union-attr]
        if self.limits.n_predict > 0:  # llama-server's -n: a request asking more (or nothing) gets the cap
            asked = kwargs.get("max_tokens")
            kwargs["max_tokens"] = min(asked, self.limits.n_predict) if asked and asked > 0 else self.limits.n_predict
        job = _Job(asyncio.get_running_loop())
        if self.limits.timeout > 0:
            job.deadline = time.monotonic() + self.limits.timeout
        threading.Thread(target=self._work, args=(job, body, kwargs, chat), daemon=True,
                         name="farctx-request").start()
        try:
            kind, value = await job.queue.get()
        except BaseException:
            job.cancel.set()
            self.count(499)
            raise
        if kind == "error":
            status, payload = _error_response(value)
            self.count(status)
            return JSONResponse(payload, status_code=status)
        if not body.stream:
            self.count(200)
            return value
        return EventSourceResponse(self._events(job, (kind, value)), sep="\n")

    async def _events(self, job: _Job, first: tuple[str, Any]) -> AsyncIterator[dict[str, str]]:
        status: int = 499  # the client went away before the end
        try:
            kind, value = first
            while True:
                if kind == "done":
                    status = 200
                    yield {"data": "[DONE]"}
                    return
                if kind == "error":
                    status, payload = _error_response(value)
                    yield {"data": json.dumps(payload)}
                    return
                yield {"data": json.dumps(value)}
                kind, value = await job.queue.get()
        finally:  # the client went away, or the stream is over: the worker stops at its next token
            job.cancel.set()
            self.count(status)


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        if err.get("type") == "model_attributes_type" and not loc:
            parts.append("the body must be a JSON object (Content-Type: application/json)")
            continue
        if err.get("type") == "json_invalid":
            parts.append(f"invalid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}")
            continue
        parts.append(f"{'.'.join(loc) or 'body'}: {err.get('msg')}")
    return "; ".join(parts)


def _authorized(header: str | None, api_keys: frozenset[str]) -> bool:
    """`Authorization: Bearer KEY` with one of the keys (compared in constant time)."""
    scheme, _, key = (header or "").partition(" ")
    return scheme.lower() == "bearer" and any(hmac.compare_digest(key.strip(), k) for k in api_keys)


def create_app(server: Server, api_keys: frozenset[str] = frozenset()) -> FastAPI:
    """The FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics (with
    server.metrics; Prometheus text). With api_keys, every route but /health answers 401 to a request without `Authorization: Bearer` and one of them."""
    import farctx

    app = FastAPI(title="farctx", version=farctx.__version__)

    if api_keys:
        @app.middleware("http")
        async def require_key(request: Request, call_next: Callable[[Request], Any]) -> Any:
            if request.url.path != "/health" and not _authorized(request.headers.get("authorization"), api_keys):
                return JSONResponse(error_body(401, "invalid or missing API key (Authorization: Bearer KEY)",
                                               "authentication_error"), status_code=401)
            return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(400, _validation_message(exc), "invalid_request_error"), status_code=400)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return server.health()

    @app.get("/metrics")
    async def metrics() -> Any:
        from fastapi.responses import PlainTextResponse

        if not server.metrics:  # llama-server's answer without --metrics
            return JSONResponse(error_body(501, "This server does not support metrics endpoint. Start it with "
                                           "`--metrics`", "not_supported_error"), status_code=501)
        return PlainTextResponse(server.metrics_text(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{
            "id": server.alias, "object": "model", "created": server.created, "owned_by": "farctx",
            "meta": server.meta,
        }]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> Any:
        if isinstance(body.prompt, list):
            if len(body.prompt) > 1:
                return JSONResponse(error_body(400, "prompt: one prompt per request", "invalid_request_error"),
                                    status_code=400)
            body.prompt = body.prompt[0] if body.prompt else ""
        return await server.handle(body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest) -> Any:
        if not body.messages:
            return JSONResponse(error_body(400, "messages: at least one message", "invalid_request_error"),
                                status_code=400)
        return await server.handle(body, chat=True)

    return app


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def limit_malloc_arenas(n: int = 2) -> None:
    """Cap glibc's malloc arenas (no-op elsewhere). glibc gives each thread that allocates concurrently an
    arena of its own, up to 8 per core, and memory freed in one arena is not reused by the others: with a
    thread per request, the scheduler and uvicorn's, the server's RSS crept up for minutes under a changing
    load (bench/soak.py: 8.5 MB/min after warm-up over 3 minutes; 1.6 MB/min with 2 arenas). Call before
    the threads start."""
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    M_ARENA_MAX = -8
    mallopt(M_ARENA_MAX, n)


def serve(server: Server, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
          api_keys: frozenset[str] = frozenset(), ssl: Optional[tuple[str, str]] = None) -> None:
    """Runs the app with uvicorn; ssl: (PEM key file, PEM certificate file) for HTTPS."""
    import uvicorn

    if not api_keys and not is_loopback(host):
        print(f"farctx: warning: listening on {host} without --api-key: anyone who can reach port {port} can "
              "use the model", file=sys.stderr, flush=True)
    print(f"farctx: serving {server.alias} ({server.describe()}) "
          f"on {'https' if ssl else 'http'}://{host}:{port}/v1" + (" (API key required)" if api_keys else ""),
          file=sys.stderr, flush=True)
    uvicorn.run(create_app(server, api_keys), host=host, port=port, log_level=log_level,
                ssl_keyfile=ssl[0] if ssl else None, ssl_certfile=ssl[1] if ssl else None)
