"""The HTTP app of `farctx serve`: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

Reuses llama-cpp-python's server pieces where they fit (its request models, extended in `requests`, and its
request preparation: logit bias, grammar, min_tokens) and sse-starlette for streams. Its app is not reused: it
keeps one model in module-level globals, ignores unknown fields, and has no place for slots, `prompt_progress`
chunks or llama.cpp's `exceed_context_size_error`.
"""

from __future__ import annotations

import hmac
import ipaddress
import sys
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .requests import ChatCompletionRequest, CompletionRequest, error_body
from .server import Server


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


COMPLETION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


def create_app(server: Server, api_keys: frozenset[str] = frozenset()) -> FastAPI:
    """The FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics (with
    server.metrics; Prometheus text). With api_keys, every route but /health answers 401 to a request without `Authorization: Bearer` and one of them."""
    import farctx

    app = FastAPI(title="farctx", version=farctx.__version__)

    def refuse(request: Request, status: int, message: str, kind: str = "invalid_request_error",
               headers: Optional[dict[str, str]] = None) -> JSONResponse:
        """An error answered before the server takes the request, counted in /metrics as the server counts its
        own answers (a completion endpoint's every request is counted once, by its status)."""
        if request.url.path in COMPLETION_PATHS:
            server.count(status)
        return JSONResponse(error_body(status, message, kind), status_code=status, headers=headers)

    if api_keys:
        # plain ASGI, not @app.middleware("http"): Starlette's BaseHTTPMiddleware hides a client's disconnect
        # from the endpoint (request.is_disconnected), which cancels a request whose client left
        def require_key(app: Any) -> Any:  # Starlette calls a middleware factory with the inner app
            async def checked(scope: Any, receive: Any, send: Any) -> None:
                if scope["type"] == "http" and scope["path"] != "/health":
                    request = Request(scope)
                    if not _authorized(request.headers.get("authorization"), api_keys):
                        response = refuse(request, 401, "invalid or missing API key (Authorization: Bearer KEY)",
                                          "authentication_error")
                        await response(scope, receive, send)
                        return
                await app(scope, receive, send)
            return checked

        app.add_middleware(require_key)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return refuse(request, 400, _validation_message(exc))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Starlette's own refusals (a body that is not UTF-8, an unknown path or method) in the same shape."""
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = "the body is not valid UTF-8 JSON" if exc.status_code == 400 else str(exc.detail)
        return refuse(request, exc.status_code, message, kind, getattr(exc, "headers", None))

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
    async def completions(request: Request, body: CompletionRequest) -> Any:
        if isinstance(body.prompt, list):
            if len(body.prompt) > 1:
                return refuse(request, 400, "prompt: one prompt per request")
            body.prompt = body.prompt[0] if body.prompt else ""
        return await server.handle(body, chat=False, gone=request.is_disconnected)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatCompletionRequest) -> Any:
        if not body.messages:
            return refuse(request, 400, "messages: at least one message")
        return await server.handle(body, chat=True, gone=request.is_disconnected)

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
    load (bench/soak.py measures it). Call before
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
