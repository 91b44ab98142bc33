"""Attention methods and their parameters (DESIGN.md section 1), as the native layer sees them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from .errors import FarctxError

METHODS: tuple[str, ...] = (
    "vanilla",
    "lminf",
    "window",
    "lambda-only",
    "rerope",
    "streaming",
    "mesa",
    "selfextend",
)


@dataclass
class MethodParams:
    """Parameters of an attention method; 0 means "from the model or the method's default"."""

    method: str = "vanilla"
    n_ctx_train: int = 0
    n_global: int = 10
    n_local: int = 0
    n_sink: int = 4
    first_chunk: int = 100
    stair_width: int = 50
    last_context: int = 512
    gen_budget: int = 50
    group: int = 0
    neighbor: int = 0

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name != "method"]

    @classmethod
    def from_kwargs(cls, method: str, values: dict[str, Any]) -> "MethodParams":
        if method not in METHODS:
            raise FarctxError(f"unknown method '{method}' (choose from {', '.join(METHODS)})")
        params = cls(method=method)
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
        for name in self.names():
            setattr(c, name, getattr(self, name))
        return c

    @classmethod
    def from_c(cls, c: Any, ffi: Any, lib: Any) -> "MethodParams":
        method = ffi.string(lib.farctx_method_name(c.method)).decode()
        return cls(method=method, **{name: int(getattr(c, name)) for name in cls.names()})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def relevant(self) -> dict[str, int]:
        """The parameters this method reads, with their values in force."""
        return {name: getattr(self, name) for name in _RELEVANT[self.method]}

    def describe(self) -> str:
        values = ", ".join(f"{k} {v}" for k, v in self.relevant().items())
        return f"{self.method} ({values})"


_RELEVANT: dict[str, tuple[str, ...]] = {
    "vanilla": ("n_ctx_train",),
    "lminf": ("n_ctx_train", "n_global", "n_local"),
    "window": ("n_ctx_train", "n_local"),
    "lambda-only": ("n_ctx_train", "n_global", "n_local"),
    "rerope": ("n_ctx_train", "n_local"),
    "streaming": ("n_ctx_train", "n_sink", "n_local"),
    "mesa": ("n_ctx_train", "first_chunk", "stair_width", "last_context", "gen_budget"),
    "selfextend": ("n_ctx_train", "group", "neighbor"),
}

# methods that keep every token in the cache beyond the trained context
WHOLE_STREAM_METHODS = ("rerope", "mesa", "selfextend")
