"""Attention methods and their parameters (docs/methods.md), read from libfarctx's method table.

Nothing here knows a method or a parameter by name: `METHODS`, `MethodParams` (its fields, defaults
and `relevant()`), the CLI options, the server's request fields and the llm plugin's options are all
built from `farctx_method_get_info` / `farctx_param_get_info`, and cache sizes come from
`farctx_cache_cells`. The table is read on first use (it loads the native libraries).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, make_dataclass
from functools import lru_cache
from typing import Any, Optional

from .errors import FarctxError


@dataclass(frozen=True)
class MethodInfo:
    """One row of libfarctx's method table."""

    name: str
    help: str
    fixed_cache: bool  # a fixed-size cache that evicts (else the whole stream stays in the cache)
    stock_graph: bool  # llama.cpp's own graph: the baseline, no extrapolation
    head: Optional[str]  # the parameter counting the head tokens never evicted (n_global, n_sink)
    model_kinds: int  # enum farctx_model_kind bits


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
                   params[r.head_param].name if r.head_param >= 0 else None, int(r.model_kinds))
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


def split_method_kwargs(kwargs: dict[str, Any]) -> Any:
    """MethodParams from farctx.Llama-style keyword arguments (`method` and the parameters; the rest is
    left alone)."""
    names = set(_method_params_class().names())
    values = {k: v for k, v in kwargs.items() if k in names}
    return _method_params_class().from_kwargs(kwargs.get("method", "vanilla"), values)


def stream_cells(model_path: Any, kwargs: dict[str, Any], n_prompt: int, n_predict: int) -> int:
    """farctx_cache_cells for farctx.Llama's keyword arguments and a model file: the cache a stream of
    n_prompt + n_predict tokens needs under the method they name."""
    from .models import n_ctx_train, resolve_model_path

    n_ubatch = min(kwargs.get("n_ubatch") or 512, kwargs.get("n_batch") or 512)
    return cache_cells(split_method_kwargs(kwargs), n_ctx_train(resolve_model_path(model_path)), n_ubatch,
                       n_prompt, n_predict)


def __getattr__(name: str) -> Any:
    # METHODS, MethodParams, WHOLE_STREAM_METHODS: built from the native table on first use
    if name == "METHODS":
        return method_names()
    if name == "MethodParams":
        return _method_params_class()
    if name == "WHOLE_STREAM_METHODS":  # the extrapolating methods that keep every token in the cache
        return tuple(m.name for m in method_infos().values() if not m.fixed_cache and not m.stock_graph)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
