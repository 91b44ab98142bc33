"""Attention methods and their parameters (docs/methods.md), read from libfarctx's method table.

Nothing here knows a method or a parameter by name: `METHODS`, `MethodParams` (its fields, defaults
and `relevant()`), the CLI options, the server's request fields and the llm plugin's options are all
built from `farctx_method_get_info` / `farctx_param_get_info`, and cache sizes come from
`farctx_cache_cells`. The table is read on first use (it loads the native libraries).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, make_dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Optional

from .errors import FarctxError

if TYPE_CHECKING:
    from .models import ModelInfo


@dataclass(frozen=True)
class MethodInfo:
    """One row of libfarctx's method table."""

    name: str
    help: str
    fixed_cache: bool  # a fixed-size cache that evicts (else the whole stream stays in the cache)
    stock_graph: bool  # llama.cpp's own graph: the baseline, no extrapolation
    head: Optional[str]  # the parameter counting the head tokens never evicted (n_global, n_sink)
    model_kinds: int  # enum farctx_model_kind bits
    whole_prompt: bool  # plans its prompt from the one feed that brings it (mesa's chunks)

    @property
    def whole_stream(self) -> bool:
        """An extrapolating method that keeps every token in the cache (its cache grows with the stream)."""
        return not self.fixed_cache and not self.stock_graph


@dataclass(frozen=True)
class ParamInfo:
    """One row of libfarctx's parameter table."""

    name: str
    help: str
    default: int
    minimum: int
    methods: tuple[str, ...]  # the methods that read it

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def option_help(self, all_methods: tuple[str, ...]) -> str:
        """One line for a CLI option or a request field: who reads it, what it is, its default."""
        who = "" if self.methods == all_methods else "/".join(self.methods) + ": "
        default = f" (default {self.default})" if self.default else ""
        return f"{who}{self.help}{default}"


def _native() -> Any:
    from ._native import native

    return native()


@lru_cache(maxsize=1)
def _tables() -> tuple[tuple[MethodInfo, ...], tuple[ParamInfo, ...]]:
    n = _native()
    ffi, lib = n.ffi, n.lib

    def text(p: Any) -> str:
        return ffi.string(p).decode()

    raw_methods = [lib.farctx_method_get_info(m) for m in range(lib.farctx_method_count())]
    names = [text(r.name) for r in raw_methods]
    raw_params = [lib.farctx_param_get_info(i) for i in range(lib.farctx_param_count())]
    params = tuple(
        ParamInfo(text(r.name), text(r.help), int(r.default_value), int(r.min_value),
                  tuple(name for m, name in enumerate(names) if r.methods & (1 << m)))
        for r in raw_params
    )
    methods = tuple(
        MethodInfo(names[m], text(r.help), bool(r.fixed_cache), bool(r.stock_graph),
                   params[r.head_param].name if r.head_param >= 0 else None, int(r.model_kinds),
                   bool(r.whole_prompt))
        for m, r in enumerate(raw_methods)
    )
    return methods, params


def method_infos() -> dict[str, MethodInfo]:
    return {m.name: m for m in _tables()[0]}


def param_infos() -> tuple[ParamInfo, ...]:
    return _tables()[1]


def method_names() -> tuple[str, ...]:
    return tuple(method_infos())


def fixed_cache(method: str) -> bool:
    return method_infos()[method].fixed_cache


class _MethodParamsBase:
    """Parameters of an attention method; 0 means "from the model or the method's default"."""

    method: str

    @classmethod
    def names(cls) -> list[str]:
        return [p.name for p in param_infos()]

    @classmethod
    def from_kwargs(cls, method: str, values: dict[str, Any]) -> Any:
        methods = method_names()
        if method not in methods:
            raise FarctxError(f"unknown method '{method}' (choose from {', '.join(methods)})")
        params = cls(method=method)  # type: ignore[call-arg]
        for name, value in values.items():
            if value is None:
                continue
            if name not in cls.names():
                raise FarctxError(f"unknown parameter '{name}' for method '{method}'")
            if isinstance(value, bool) or not isinstance(value, int):
                raise FarctxError(f"{name} must be an integer (got {value!r})")
            if not -2**31 <= value < 2**31:  # the parameter table's fields are int32_t
                raise FarctxError(f"{name} must fit in 32 bits (got {value})")
            setattr(params, name, value)
        return params

    def to_c(self, ffi: Any, lib: Any) -> Any:
        c = ffi.new("struct farctx_params *", lib.farctx_default_params())
        c.method = lib.farctx_method_from_name(self.method.encode())
        for i, name in enumerate(self.names()):
            lib.farctx_param_set(c, i, getattr(self, name))
        return c

    @classmethod
    def from_c(cls, c: Any, ffi: Any, lib: Any) -> Any:
        ptr = ffi.new("struct farctx_params *", c)
        method = ffi.string(lib.farctx_method_name(ptr.method)).decode()
        return cls(method=method, **{name: int(lib.farctx_param_get(ptr, i))  # type: ignore[call-arg]
                                     for i, name in enumerate(cls.names())})

    @property
    def info(self) -> MethodInfo:
        """The method's row of the method table."""
        return method_infos()[self.method]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload, no-any-return]

    def relevant(self) -> dict[str, int]:
        """The parameters this method reads, with their values in force."""
        return {p.name: getattr(self, p.name) for p in param_infos() if self.method in p.methods}

    def describe(self) -> str:
        values = ", ".join(f"{k} {v}" for k, v in self.relevant().items())
        return f"{self.method} ({values})"


@lru_cache(maxsize=1)
def _method_params_class() -> type:
    spec: list[Any] = [("method", str, "vanilla")] + [(p.name, int, p.default) for p in param_infos()]
    cls = make_dataclass("MethodParams", spec, bases=(_MethodParamsBase,), namespace={"__module__": __name__})
    cls.__doc__ = _MethodParamsBase.__doc__
    assert [f.name for f in fields(cls)][1:] == cls.names()
    return cls


def cache_cells(params: Any, n_ctx_train: int, n_ubatch: int, n_prompt: int = 0, n_predict: int = 0) -> int:
    """KV cells a stream needs (libfarctx's farctx_cache_cells): fixed-cache methods head + n_local +
    n_ubatch; the others the whole stream, n_prompt + n_predict (n_ctx_train when both are 0)."""
    n = _native()
    return int(n.lib.farctx_cache_cells(params.to_c(n.ffi, n.lib), n_ctx_train, n_ubatch, n_prompt, n_predict))


# -- cache sizing: the one rule the CLI, eval, bench, server, chat and the llm plugin follow -------------------

DEFAULT_GENERATION = 256  # cells kept for the answer when a request or a command sets no token limit
WHOLE_STREAM_DEFAULT = 4  # a whole-stream method's cache without -c: 4 x n_ctx_train cells per stream


def ubatch_size(n_batch: Optional[int] = None, n_ubatch: Optional[int] = None) -> int:
    """The physical batch llama.cpp uses: n_ubatch, at most n_batch (512 each by default)."""
    return min(n_ubatch or 512, n_batch or 512)


def fit_local_min() -> int:
    """The smallest window libfarctx fits into a cache given as a memory budget (FARCTX_FIT_LOCAL_MIN)."""
    return int(_native().lib.FARCTX_FIT_LOCAL_MIN)


def _cells_of(n_ctx: int, n_seq: int = 1) -> int:
    """The cells per stream llama.cpp makes of n_ctx for n_seq streams (it rounds both up to 256)."""
    def pad(n: int) -> int:
        return (n + 255) // 256 * 256
    return pad(pad(n_ctx) // max(1, n_seq)) if n_seq > 1 else pad(n_ctx)


def fixed_minimum(params: Any, n_ctx_train: int, n_ubatch: int) -> int:
    """The fewest cells a fixed-cache stream runs in: head + n_local + n_ubatch, where an unset n_local (0) may
    shrink to the room of the cache down to fit_local_min() (libfarctx fits it; an n_local given is kept)."""
    default = cache_cells(params, n_ctx_train, n_ubatch)
    if params.n_local > 0:
        return default
    return min(default, cache_cells(replace(params, n_local=fit_local_min()), n_ctx_train, n_ubatch))


def window_words(params: Any, n_ctx_train: int) -> str:
    """The window a fixed-cache refusal names: the n_local given, or the smallest one libfarctx would fit."""
    if params.n_local > 0:
        return f"n_local {params.n_local}"
    return f"n_local unset: a window of at least {min(fit_local_min(), n_ctx_train)}"


def budget_ubatch(params: Any, n_ctx_train: int, n_ctx: int, n_batch: Optional[int], window: int = 0) -> Optional[int]:
    """The ubatch of a fixed-cache stream in a cache of n_ctx cells when the caller set none (None: llama.cpp's).

    With n_local set: the room head + n_local leave (at most the default ubatch). With n_local unset (the cache as a
    memory budget): the default ubatch if the default window fits beside it, else a quarter of the cache, so that
    most of it holds the window. Either way at most what a sliding window leaves (iSWA)."""
    full = ubatch_size(n_batch)
    cells = _cells_of(n_ctx)
    room = cells - cache_cells(params, n_ctx_train, 0)
    if params.n_local <= 0 and room < full:
        room = max(1, cells // 4)
    if window:
        room = min(room, cells - window)
    return room if 0 < room < full else None


def stream_cache(params: Any, n_ctx_train: int, n_ubatch: int, *, n_ctx: int = 0, n_seq: int = 1,
                 n_prompt: int = 0, n_predict: int = 0, window: int = 0) -> int:
    """The KV cells of each of `n_seq` streams under `params`.

    `n_ctx` > 0 is the cells of all streams together (llama.cpp's -c): each stream gets n_ctx / n_seq. A
    fixed-cache method with n_local unset fits its window into that share (libfarctx: the cache as a memory budget)
    and refuses a share below `fixed_minimum` (an n_local given: head + n_local + n_ubatch), with the sizes.
    `n_ctx` 0: fixed-cache methods get that minimum (at least a sliding window + n_ubatch on a model with
    sliding-window layers, as llama.cpp sizes those layers' cache); a stream of known length (n_prompt +
    n_predict) what it needs under its method; otherwise the stock graph n_ctx_train and the whole-stream
    methods WHOLE_STREAM_DEFAULT x n_ctx_train.
    """
    info = params.info
    # a model with sliding-window layers: those layers' cache holds the window + a ubatch
    swa = window + n_ubatch if info.fixed_cache and window else 0
    if n_ctx > 0:
        share = n_ctx // max(1, n_seq)
        if info.fixed_cache:
            need = max(fixed_minimum(params, n_ctx_train, n_ubatch), swa)
            if _cells_of(n_ctx, n_seq) < need:
                per = f" per stream ({n_ctx} cells / {n_seq} streams)" if n_seq > 1 else ""
                shown = params if params.n_ctx_train else replace(params, n_ctx_train=n_ctx_train)
                raise FarctxError(f"{shown.describe()} needs {need} KV cells{per}: head + n_local + n_ubatch "
                                  f"({window_words(params, n_ctx_train)}, n_ubatch {n_ubatch}); -c {n_ctx} gives "
                                  f"{share}")
        return share
    if info.fixed_cache:
        return max(cache_cells(params, n_ctx_train, n_ubatch), swa)
    if n_prompt or n_predict:
        return cache_cells(params, n_ctx_train, n_ubatch, n_prompt, n_predict)
    return n_ctx_train if info.stock_graph else WHOLE_STREAM_DEFAULT * n_ctx_train


def split_method_kwargs(kwargs: dict[str, Any]) -> Any:
    """MethodParams from farctx.Llama-style keyword arguments (`method` and the parameters; the rest is
    left alone)."""
    names = set(_method_params_class().names())
    values = {k: v for k, v in kwargs.items() if k in names}
    return _method_params_class().from_kwargs(kwargs.get("method", "vanilla"), values)


def llama_stream_cache(model_path: Any, kwargs: dict[str, Any], n_prompt: int = 0, n_predict: int = 0) -> int:
    """stream_cache for farctx.Llama's keyword arguments (`n_ctx`, `n_batch`, `n_ubatch`, the method's) and a
    model file: the cache of a stream of n_prompt + n_predict tokens (0 and 0: of unknown length)."""
    from .models import context_and_window, resolve_model_path

    params = split_method_kwargs(kwargs)
    n_train, window = context_and_window(resolve_model_path(model_path))
    n_train = getattr(params, "n_ctx_train", 0) or n_train
    return stream_cache(params, n_train, ubatch_size(kwargs.get("n_batch"), kwargs.get("n_ubatch")),
                        n_ctx=int(kwargs.get("n_ctx") or 0), n_prompt=n_prompt, n_predict=n_predict, window=window)


def method_support(model: ModelInfo | str | os.PathLike[str] | None = None) -> dict[str, str]:
    """For each method: "yes", or libfarctx's reason why it cannot run on this model in this build
    (farctx_method_supported, the check farctx_session_init makes), as "no: <reason>"."""
    from .engine import load_model_params_only
    from .models import ModelInfo

    path = model.path if isinstance(model, ModelInfo) else model
    with load_model_params_only(path) as (nat, c_model):
        err = nat.ffi.new("char[]", 512)
        result = {}
        for code in range(nat.lib.farctx_method_count()):
            name = nat.ffi.string(nat.lib.farctx_method_name(code)).decode()
            rc = nat.lib.farctx_method_supported(code, c_model, err, 512)
            result[name] = "yes" if rc == nat.lib.FARCTX_OK else "no: " + nat.ffi.string(err).decode()
    return result


def native_mesa_schedule(n: int, **params: int) -> tuple[bool, int, int]:
    """libfarctx's Mesa split of an n-token prompt: (chunked, chunk width C, middle chunks N)."""
    nat = _native()
    c = _method_params_class().from_kwargs("mesa", params).to_c(nat.ffi, nat.lib)
    chunk, n_middle = nat.ffi.new("int64_t *"), nat.ffi.new("int64_t *")
    chunked = nat.lib.farctx_mesa_schedule(c, n, chunk, n_middle)
    return bool(chunked), int(chunk[0]), int(n_middle[0])


def __getattr__(name: str) -> Any:
    # METHODS, MethodParams, WHOLE_STREAM_METHODS: built from the native table on first use
    if name == "METHODS":
        return method_names()
    if name == "MethodParams":
        return _method_params_class()
    if name == "WHOLE_STREAM_METHODS":  # the extrapolating methods that keep every token in the cache
        return tuple(m.name for m in method_infos().values() if m.whole_stream)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
