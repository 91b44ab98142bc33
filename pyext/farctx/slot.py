"""One model behind a lock, its cache sized to each request: what `serve`, `chat` and the llm plugin share.

A `Slot` keeps one `farctx.Llama` and checks every prompt before a token of it is fed, by what
libfarctx's method table says of the method: fixed-cache methods (e.g. lminf) take any length;
the extrapolating methods that keep the whole stream (e.g. mesa) get libfarctx's cache for prompt +
generation (the engine is loaded again, larger, up to `ctx_max` cells); the stock graph (vanilla)
keeps the cache it was given, as llama-server does, and refuses a prompt that does not fit with
llama.cpp's `exceed_context_size_error` sizes. Nothing is ever truncated.
"""

from __future__ import annotations

import inspect
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TextIO, TypeVar

from .engine import Llama, ProgressFn
from .errors import FarctxError
from .methods import MethodParams, cache_cells, method_infos
from .models import n_ctx_train, resolve_model_path

T = TypeVar("T")

DEFAULT_GENERATION = 256  # cells kept for the answer when a request sets no max_tokens (whole-stream methods)
_ROUND = 256  # llama.cpp rounds caches up to 256 cells


class ContextError(FarctxError):
    """The prompt (plus the generation it asks for) does not fit, with the sizes (llama.cpp's shape)."""

    def __init__(self, message: str, n_prompt_tokens: int, n_ctx: int) -> None:
        super().__init__(message)
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx


class _Resize(Exception):
    def __init__(self, cells: int) -> None:
        self.cells = cells


_COMPLETION_SIGNATURE = inspect.signature(Llama.create_completion)


class SlotLlama(Llama):
    """farctx.Llama whose create_completion (which every chat handler calls) lets the slot look at
    the prompt's token count and max_tokens before anything is evaluated."""

    prompt_check: Optional[Callable[[int, Optional[int]], None]] = None
    last_prompt_tokens: int = 0

    def create_completion(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        bound = _COMPLETION_SIGNATURE.bind(self, *args, **kwargs)
        bound.apply_defaults()
        n_prompt = self.count_prompt(bound.arguments["prompt"])
        self.last_prompt_tokens = n_prompt
        if self.prompt_check is not None:
            self.prompt_check(n_prompt, bound.arguments["max_tokens"])
        return super().create_completion(*args, **kwargs)

    def count_prompt(self, prompt: str | list[int]) -> int:
        """Tokens llama_cpp.Llama feeds for this prompt (BOS and, where the model adds one, EOS).

        The prompt is tokenized here exactly as llama_cpp.Llama's completion does it, and the tokens are
        kept for that call (`tokenize`): each prompt is tokenized once."""
        if isinstance(prompt, list):
            return len(prompt)
        n = len(self.tokenize(prompt.encode("utf-8"), add_bos=False, special=True, keep=True)) if prompt else 0
        return n + int(self._model.add_bos_token()) + int(self._model.add_eos_token())

    _kept: Optional[tuple[tuple[bytes, bool, bool], list[int]]] = None

    def tokenize(self, text: bytes, add_bos: bool = True, special: bool = False,  # type: ignore[override]
                 keep: bool = False) -> list[int]:
        """llama_cpp.Llama.tokenize; the tokens of count_prompt's call are handed once to the same call
        that follows (the completion's own tokenization of the prompt)."""
        key = (bytes(text), add_bos, special)
        kept, self._kept = self._kept, None
        if kept is not None and kept[0] == key:
            return list(kept[1])
        tokens = super().tokenize(text, add_bos, special)
        if keep:
            self._kept = (key, list(tokens))
        return tokens


@dataclass
class Slot:
    """A model, its llama.cpp keyword arguments, and the method in force by default.

    `llama_kwargs["n_ctx"]`: 0 lets fixed-cache methods size their cache and gives vanilla and
    whole-stream methods the trained context to start with. `ctx_max`: the largest cache a
    whole-stream method may grow to (0: the larger of 8 x n_ctx_train and n_ctx).
    """

    model_path: Optional[str]
    llama_kwargs: dict[str, Any]
    method: dict[str, Any]
    ctx_max: int = 0
    log: TextIO = field(default_factory=lambda: sys.stderr)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.path = str(resolve_model_path(self.model_path))
        self.llama_kwargs = dict(self.llama_kwargs)
        self.method = self.resolve(None)
        self.n_ctx_train = self.method.get("n_ctx_train") or n_ctx_train(self.path)
        if not self.ctx_max:
            self.ctx_max = max(8 * self.n_ctx_train, int(self.llama_kwargs.get("n_ctx") or 0))
        self.llm: Optional[SlotLlama] = None
        self._loaded: dict[str, Any] = {}

    @classmethod
    def from_kwargs(cls, model_path: Optional[str], kwargs: dict[str, Any], ctx_max: int = 0) -> "Slot":
        """A slot from farctx.Llama's keyword arguments (the method's are split off)."""
        llama = dict(kwargs)
        method = {"method": llama.pop("method", "vanilla")}
        method.update({name: llama.pop(name) for name in MethodParams.names() if name in llama})
        return cls(model_path, llama, method, ctx_max=ctx_max)

    # -- configuration ---------------------------------------------------------------------

    def resolve(self, override: Optional[dict[str, Any]]) -> dict[str, Any]:
        """The method and parameters of a request: the slot's, updated with `override` (checked)."""
        merged = dict(self.method)
        for key, value in (override or {}).items():
            if value is not None:
                merged[key] = value
        method = merged.pop("method", "vanilla")
        MethodParams.from_kwargs(method, merged)  # unknown names, wrong types: FarctxError
        return {"method": method, **{k: v for k, v in merged.items() if v is not None}}

    # -- the engine --------------------------------------------------------------------------

    def engine(self, method: dict[str, Any], cells: int = 0) -> SlotLlama:
        """The engine for `method`, with a cache of at least `cells` (loaded again when it differs)."""
        n_ctx = int(self.llama_kwargs.get("n_ctx") or 0)
        if not method_infos()[method["method"]].fixed_cache:  # the whole stream: libfarctx's size to start with
            n_ctx = max(n_ctx or self.cells(method, 0, 0), cells)
        if self.llm is not None and self._loaded["method"] == method and self._loaded["n_ctx"] >= n_ctx:
            return self.llm
        self.unload()
        kwargs = {**self.llama_kwargs, **method, "n_ctx": n_ctx}
        self.llm = SlotLlama(self.path, **kwargs)
        self._loaded = {"method": method, "n_ctx": self.llm.n_ctx()}
        self.log.write(f"farctx: {self.llm.method_params.describe()}, cache {self.llm.n_ctx()} cells\n")
        self.log.flush()
        return self.llm

    def cells(self, method: dict[str, Any], n_prompt: int, n_predict: int) -> int:
        """libfarctx's cache size for a stream of n_prompt + n_predict tokens under `method`."""
        params = MethodParams.from_kwargs(method["method"], {k: v for k, v in method.items() if k != "method"})
        n_ubatch = min(self.llama_kwargs.get("n_ubatch") or 512, self.llama_kwargs.get("n_batch") or 512)
        return cache_cells(params, self.n_ctx_train, n_ubatch, n_prompt, n_predict)

    def unload(self) -> None:
        if self.llm is not None:
            self.llm.close()
            self.llm = None
            self._loaded = {}

    def run(self, call: Callable[[SlotLlama], T], override: Optional[dict[str, Any]] = None,
            progress: Optional[ProgressFn] = None) -> T:
        """call(engine) with the prompt checked (and the cache sized) before any token is fed.

        The caller holds `lock` for as long as it uses the engine (a stream: until it is closed).
        Raises ContextError when the prompt cannot fit.
        """
        method = self.resolve(override)
        cells = 0
        while True:
            llm = self.engine(method, cells)
            llm.prompt_check = self._checker(method, llm)
            llm.progress = progress
            try:
                return call(llm)
            except _Resize as resize:
                cells = resize.cells
            except ValueError as exc:  # llama_cpp's own check (a prompt at n_ctx or more)
                if "exceed context window" in str(exc):
                    raise ContextError(_EXCEEDS, llm.last_prompt_tokens, llm.n_ctx()) from None
                raise

    def _checker(self, method: dict[str, Any], llm: SlotLlama) -> Callable[[int, Optional[int]], None]:
        info = method_infos()[method["method"]]

        def check(n_prompt: int, max_tokens: Optional[int]) -> None:
            n_ctx = llm.n_ctx()
            if info.stock_graph:
                if n_prompt >= n_ctx:
                    raise ContextError(_EXCEEDS, n_prompt, n_ctx)
            elif not info.fixed_cache:
                generation = max_tokens if max_tokens is not None and max_tokens > 0 else DEFAULT_GENERATION
                needed = self.cells(method, n_prompt, generation)
                if needed > self.ctx_max:
                    raise ContextError(
                        f"{info.name} keeps the whole stream in the cache: {n_prompt} prompt tokens + {generation} "
                        f"to generate need {needed} cells, more than the limit of {self.ctx_max} "
                        "(--ctx-max)", n_prompt, self.ctx_max)
                if needed > n_ctx:
                    grown = max(needed, min(self.ctx_max, n_ctx + n_ctx // 2))
                    raise _Resize(min(self.ctx_max, -(-grown // _ROUND) * _ROUND))

        return check


_EXCEEDS = "the request exceeds the available context size, try increasing it"
