"""The exceptions farctx raises for bad input and failed runs (all of them FarctxError)."""

from __future__ import annotations


class FarctxError(Exception):
    """A clear, one-line reason why farctx could not do what was asked."""


class NoSpaceError(FarctxError):
    """The tokens do not fit in the KV cache under the chosen method."""


class ContextSizeError(FarctxError):
    """A prompt (plus the generation it asks for) does not fit in the cache, with llama.cpp's sizes."""

    def __init__(self, message: str, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(message)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class EmptyPromptError(FarctxError):
    """Generation asked for with no token to continue: an empty prompt on a model that adds no BOS token."""

    def __init__(self) -> None:
        super().__init__("the prompt is empty: it has no tokens to continue (this model adds no BOS token)")
