"""Attention methods and their parameters (docs/methods.md), read from libfarctx's method table.

Nothing here knows a method or a parameter by name: `METHODS`, `MethodParams` (its fields, defaults
and `relevant()`), the CLI options, the server's request fields and the llm plugin's options are all
built from `farctx_method_get_info` / `farctx_param_get_info`, and every size comes from the context plan
(`farctx_context_plan`). The table is read on first use (it loads the native libraries).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, make_dataclass
from functools import lru_cache
from typing import Any, Optional

from .errors import FarctxError, NoSpaceError


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
    stock_inside: bool  # llama.cpp's own graph inside the trained context, a cache sized as stock's (vanilla, auto)

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


# what every surface runs when no method is named: stock inside the trained context, an extension past it
DEFAULT_METHOD = "auto"


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
                   bool(r.whole_prompt), bool(r.stock_inside))
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
        if self.info.stock_inside and not self.info.stock_graph:  # auto: what it runs where
            return f"{self.method}: {self.info.help} ({values})"
        return f"{self.method} ({values})"


@lru_cache(maxsize=1)
def _method_params_class() -> type:
    spec: list[Any] = [("method", str, DEFAULT_METHOD)] + [(p.name, int, p.default) for p in param_infos()]
    cls = make_dataclass("MethodParams", spec, bases=(_MethodParamsBase,), namespace={"__module__": __name__})
    cls.__doc__ = _MethodParamsBase.__doc__
    assert [f.name for f in fields(cls)][1:] == cls.names()
    return cls


# -- cache sizing: the one rule the CLI, eval, bench, server, chat and the llm plugin follow -------------------

DEFAULT_GENERATION = 256  # cells a cache sized for a conversation keeps for an answer that sets no token limit


@dataclass(frozen=True)
class ContextPlan:
    """What a context under a method holds (libfarctx's struct farctx_plan)."""

    n_ctx: int          # cells to make the context with (all streams)
    n_ctx_seq: int      # cells per stream
    n_batch: int        # in force
    n_ubatch: int       # in force: fitted to a fixed cache of the caller's size when unset
    n_local: int        # fixed-cache methods: the window in force (0 for the others)
    window_fitted: bool  # n_local was unset and is the room the cache leaves
    n_predict_max: int  # the most tokens a stream may generate after its n_prompt (-1: without bound)


def context_plan(params: Any, n_ctx_train: int, *, n_swa: int = 0, n_ctx: int = 0, n_batch: Optional[int] = None,
                 n_ubatch: Optional[int] = None, n_seq: int = 1, n_prompt: int = 0, n_predict: int = 0) -> ContextPlan:
    """The context `params` needs, or runs in for a given n_ctx (cells of all streams, llama.cpp's -c): libfarctx's
    farctx_context_plan, the one decider of the cells, the batch sizes in force and the window, which every
    surface asks and farctx_session_init holds its context to. None or 0 leaves a size unset. Raises FarctxError
    with every size when the cache cannot hold the method, NoSpaceError when a cache of n_ctx cannot hold n_prompt +
    n_predict tokens (at least one to generate) under a method that keeps every token."""
    n = _native()
    c_in = n.ffi.new("struct farctx_plan_params *", n.lib.farctx_plan_default_params())
    c_in.n_ctx_train, c_in.n_swa, c_in.n_ctx = n_ctx_train, n_swa or 0, n_ctx or 0
    c_in.n_batch, c_in.n_ubatch, c_in.n_seq = n_batch or 0, n_ubatch or 0, max(1, n_seq)
    c_in.n_prompt, c_in.n_predict = n_prompt or 0, n_predict or 0
    out = n.ffi.new("struct farctx_plan *")
    err = n.ffi.new("char[]", 512)
    rc = n.lib.farctx_context_plan(params.to_c(n.ffi, n.lib), c_in, out, err, 512)
    if rc != 0:
        raise (NoSpaceError if rc == n.lib.FARCTX_ERR_NO_SPACE else FarctxError)(n.ffi.string(err).decode())
    return ContextPlan(out.n_ctx, out.n_ctx_seq, out.n_batch, out.n_ubatch, out.n_local, bool(out.window_fitted),
                       out.n_predict_max)


def split_method_kwargs(kwargs: dict[str, Any]) -> Any:
    """MethodParams from farctx.Llama-style keyword arguments (`method` and the parameters; the rest is
    left alone)."""
    names = set(_method_params_class().names())
    values = {k: v for k, v in kwargs.items() if k in names}
    return _method_params_class().from_kwargs(kwargs.get("method", DEFAULT_METHOD), values)


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
