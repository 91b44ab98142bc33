"""`farctx.Llama`: llama_cpp.Llama with its token stream driven by a farctx session.

Everything llama-cpp-python offers (create_completion, create_chat_completion, __call__,
stream=True, tokenize, samplers, chat templates) works unchanged; evaluation goes through
libfarctx, which applies the chosen attention method.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from . import rpc
from .errors import EmptyPromptError, FarctxError
from .context import ModelFacts, RuntimeOptions, batch_sizes, plan_for
from .grammar import check_grammar
from .methods import DEFAULT_METHOD, ContextPlan, MethodParams
from .models import check_gguf, resolve_model_path
from ._native import llama_log, native
from .stream import ProgressFn, Stream, check_params

_N = native()
_LOG = llama_log()

_LLAMA_KWARGS = {
    name
    for name, p in inspect.signature(_N.llama_cpp.Llama.__init__).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY or p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
} - {"self", "model_path"}


_MAX_STREAM = 2**31 - 1
_UNPLANNED = 256  # the n_ctx llama_cpp.Llama is given until the plan replaces it (never 0: that is its own default)


class Llama(_N.llama_cpp.Llama):  # type: ignore[misc, name-defined]
    """A drop-in for `llama_cpp.Llama` that runs a farctx attention method.

    `model_path=None` loads the bundled default model. `method` is one of farctx.METHODS;
    the method's parameters (`farctx.MethodParams.names()`, from libfarctx's table) are keyword
    arguments, and every other keyword argument is llama_cpp.Llama's; the runtime options among them
    (`farctx.context.RuntimeOptions`) have farctx's defaults. `n_ctx` unset or 0 is the context plan's cache
    for the method on this model, for a stream of `n_prompt` + `n_predict` tokens when they are given
    (`self.plan`). `rpc_servers` ("HOST:PORT,HOST:PORT" or a list) puts the offloaded layers (`n_gpu_layers`)
    on those ggml RPC servers (`farctx rpc-server`), then on the local GPUs; each server is checked first
    (FarctxError naming it when it cannot be reached in `farctx.rpc.CONNECT_TIMEOUT` seconds or speaks
    another protocol version).
    """

    # llama_cpp.Llama.__init__ assigns the struct; the RPC devices (if any) go into it there
    model_params = rpc.model_params_property()

    def __init__(
        self,
        model_path: Optional[str | os.PathLike[str]] = None,
        *,
        method: str = DEFAULT_METHOD,
        progress: Optional[ProgressFn] = None,
        n_prompt: int = 0,
        n_predict: int = 0,
        **kwargs: Any,
    ) -> None:
        method_values = {name: kwargs.pop(name) for name in MethodParams.names() if name in kwargs}
        if kwargs.get("embedding") and method == "auto":
            method = "vanilla"  # embeddings share one cache across sequences: llama.cpp's own attention
        unknown = sorted(set(kwargs) - _LLAMA_KWARGS - set(RuntimeOptions.names()))
        if unknown:  # llama_cpp.Llama swallows unknown keywords; a typo should not pass silently
            raise FarctxError(f"unexpected keyword argument(s): {', '.join(unknown)}")
        self.method_params = MethodParams.from_kwargs(method, method_values)
        check_params(self.method_params)

        path = resolve_model_path(model_path)
        check_gguf(path)
        options = RuntimeOptions.take(kwargs)
        kwargs.update(options.llama_kwargs())
        self.rpc_servers = options.rpc_servers
        self._model_devices = rpc.model_devices(self.rpc_servers) if self.rpc_servers else None
        vocab_only = bool(kwargs.get("vocab_only", False))  # a tokenizer: no context to run a method in
        if kwargs.get("embedding") and self.method_params.method != "vanilla" and not vocab_only:
            raise FarctxError(f"embedding=True runs no farctx method: llama_cpp.Llama embeds several sequences at "
                              f"once in one shared KV cache, and {self.method_params.method} keeps one stream per "
                              "sequence; embed with method='vanilla' (llama.cpp's own attention)")
        # the context plan decides the cells and the batches once llama_cpp.Llama has loaded the model (`_model`,
        # below): n_ctx 0 is what the method needs for this model (a stream of n_prompt + n_predict tokens)
        self._sizing = None if vocab_only else (options, n_prompt, n_predict)
        self.plan: Optional[ContextPlan] = None
        kwargs["n_ctx"] = options.n_ctx or _UNPLANNED
        for key in ("n_batch", "n_ubatch"):
            if getattr(options, key) is not None:
                kwargs[key] = getattr(options, key)
        self._stream: Optional[Stream] = None
        _LOG.clear()
        _LOG.verbose = bool(kwargs["verbose"])
        try:
            super().__init__(model_path=str(path), **kwargs)
        except ValueError as exc:
            reason = _LOG.reason() or str(exc)
            raise FarctxError(f"llama.cpp could not load {path}: {reason}") from None
        except FarctxError:
            self.close()  # the plan refused the model llama_cpp.Llama had loaded: freed now, not at collection
            raise
        rpc.hold(self, self.rpc_servers)

        self.progress = progress
        self._vocab_only = vocab_only
        if vocab_only:
            return
        if self.plan is None:  # a llama_cpp.Llama that no longer loads its model into `_model`
            self.close()
            raise FarctxError("llama_cpp.Llama built its context before farctx could plan it: this version of "
                              "llama-cpp-python is not the one farctx supports")
        try:
            self._stream = Stream(_N.llama_context_ptr(self._ctx.ctx), self.method_params, self._n_vocab)
        except FarctxError:
            self.close()
            raise
        self.method_params = self._stream.method
        fitted = self._stream.fitted_window(self.plan.n_ubatch)
        if fitted:  # the caller's n_ctx as a memory budget: said once, and in stats()
            print(f"farctx: {fitted}", file=sys.stderr)
        # llama.cpp rounds the cache up (to 256 cells): size the token and score buffers to the real cache
        n_ctx = self.n_ctx()
        if self.input_ids.shape[0] < n_ctx:
            self.input_ids = np.zeros(n_ctx, dtype=np.intc)
            if self._logits_all:
                self.scores = np.zeros((n_ctx, self._n_vocab), dtype=np.single)
        if self.method_params.info.fixed_cache:
            # llama_cpp.Llama bounds prompts and generations by _n_ctx: here the stream is unbounded
            # (32-bit positions), only the cache is fixed
            self._n_ctx = _MAX_STREAM

    # llama_cpp.Llama.__init__ loads the model into `_model`, then makes the context of `context_params`: the plan
    # is asked in between, with the facts of the loaded model
    @property
    def _model(self) -> Any:
        return self.__dict__.get("_loaded_model")

    @_model.setter
    def _model(self, model: Any) -> None:
        self.__dict__["_loaded_model"] = model
        sizing = self.__dict__.get("_sizing")
        if model is None or sizing is None:
            return
        options, n_prompt, n_predict = sizing
        self._sizing = None
        plan = plan_for(self.method_params, ModelFacts.of(model.model), options, n_prompt=n_prompt,
                        n_predict=n_predict)
        self.plan = plan
        self.n_batch, n_ubatch = batch_sizes(plan, options)
        self.context_params.n_ctx = plan.n_ctx
        self.context_params.n_batch = self.n_batch
        self.context_params.n_ubatch = n_ubatch

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

    def generate(self, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Iterator[int]:  # type: ignore[override]
        """llama_cpp.Llama.generate. Its prompt-prefix reuse keeps the stream only where the result equals a fresh
        run: a method that plans a prompt from its length (mesa) reads a prompt of another plan from its start."""
        tokens = list(tokens)
        check_grammar(self._model.vocab, kwargs.get("grammar"))  # a grammar llama.cpp refuses would crash sampling
        if not tokens and not (kwargs.get("reset", True) is False and self.n_tokens):
            raise EmptyPromptError()  # llama_cpp would fail an assert at its first sample
        if self._stream is not None and self.n_tokens and kwargs.get("reset", True) \
                and not self._stream.keeps_plan(len(tokens)):
            self.reset()
        return super().generate(tokens, *args, **kwargs)

    def _feed(self, tokens: Sequence[int], all_logits: bool) -> Optional[np.ndarray]:
        if len(tokens) == 0:
            return None
        if self._stream is None:
            raise FarctxError("this Llama was loaded with vocab_only=True: it tokenizes, it evaluates nothing"
                              if self._vocab_only
                              else "this Llama is closed")
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

    # -- state: llama.cpp's with the stream's ----------------------------------------------------------------

    def save_state(self) -> "FarctxState":
        """llama_cpp.Llama.save_state with the farctx stream's state (what a RAM or disk cache keeps)."""
        state = super().save_state()
        if self._stream is None:
            return state  # type: ignore[no-any-return]
        return FarctxState(state, self._stream.save(), self.method_params.describe())

    def load_state(self, state: Any) -> None:
        """llama_cpp.Llama.load_state, the stream restored exactly from a state this class saved; a state of
        llama_cpp.Llama (no stream in it) has its tokens read again under this Llama's method."""
        super().load_state(state)
        if self._stream is None:
            return
        tokens = self.input_ids[: self.n_tokens].tolist()
        data = getattr(state, "farctx_state", None)
        if data is not None:
            self._stream.load(data, tokens)
            return
        # llama.cpp's cells of that state hold keys of stock attention: read the tokens again under the method
        _N.llama_cpp.llama_memory_clear(_N.llama_cpp.llama_get_memory(self._ctx.ctx), True)
        self._stream.rewind(0)
        self.n_tokens = 0
        self.eval(tokens)

    # -- reporting ----------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Tokens in the stream, KV cells in use, cache size and bytes (the library's own counts)."""
        assert self._stream is not None
        return self._stream.stats()

    def __enter__(self) -> "Llama":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Free the stream, the context and the model now (llama_cpp.Llama.close); a second call does nothing."""
        if getattr(self, "_stream", None) is not None:
            self._stream.close()  # freed before the context it points into
            self._stream = None
        if hasattr(self, "_stack"):  # absent when __init__ failed before llama_cpp's own
            super().close()
        rpc.release(self)  # the model and its RPC connections are freed


class FarctxState(_N.llama_cpp.LlamaState):  # type: ignore[misc, name-defined]
    """llama_cpp.LlamaState with the farctx stream's state (`farctx_state`, libfarctx's bytes) and the method it
    ran (`method`, for messages); pickled whole by llama_cpp.LlamaDiskCache."""

    def __init__(self, state: Any, farctx_state: bytes, method: str) -> None:
        super().__init__(input_ids=state.input_ids, scores=state.scores, n_tokens=state.n_tokens,
                         llama_state=state.llama_state, llama_state_size=state.llama_state_size, seed=state.seed)
        self.farctx_state = farctx_state
        self.method = method
