"""The request bodies the server takes: llama-cpp-python's models, stricter (unknown fields are an error,
`max_tokens` is bounded, one choice), plus farctx's fields (`farctx`: this request's method, `return_progress`,
`stream_options`, `max_completion_tokens`); and the error body llama-server answers with."""

from __future__ import annotations

from typing import Any, Literal, Optional

from llama_cpp.server.types import CreateChatCompletionRequest, CreateCompletionRequest
from pydantic import BaseModel, ConfigDict, Field, create_model

from ..methods import method_names, param_infos

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


# request fields that are not llama_cpp.Llama.create_completion's keyword arguments
NOT_LLAMA_KWARGS = {"n", "best_of", "logit_bias_type", "user", "min_tokens", "farctx", "return_progress",
                    "stream_options", "max_completion_tokens"}


def error_body(status: int, message: str, kind: str, **extra: Any) -> dict[str, Any]:
    """llama.cpp server's error shape (OpenAI's plus `code` as the HTTP status)."""
    return {"error": {"code": status, "message": message, "type": kind, **extra}}
