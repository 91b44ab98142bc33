"""Options shared by the farctx commands, with llama.cpp's flag names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import click

from farctx.kv_types import KV_TYPES

if TYPE_CHECKING:
    from farctx.context import OptionInfo, RuntimeOptions

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _stack(*decorators: Decorator) -> Decorator:
    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


def model_option() -> Decorator:
    return click.option("-m", "--model", "model", default=None, metavar="FNAME",
                        help="GGUF model path (default: the bundled SmolLM2-135M-Instruct)")


def _check_rpc(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from farctx.errors import FarctxError
    from farctx.rpc import parse_servers

    if value is None:
        return None
    try:
        return ",".join(parse_servers(value))
    except FarctxError as exc:
        raise click.BadParameter(str(exc)) from None


# how each kind of runtime option (farctx.context.OptionInfo.kind) is a flag: its click type, default and metavar
_FLAG_KINDS: dict[str, dict[str, Any]] = {
    "cells": dict(type=click.IntRange(0), default=0, show_default=True),
    "threads": dict(type=int, default=None),
    "layers": dict(default="0", show_default=True),
    "switch": dict(type=click.Choice(["on", "off"]), default="off", show_default=True),
    "kv": dict(type=click.Choice(sorted(KV_TYPES)), default="f16", show_default=True),
    "split": dict(default=None, metavar="N0,N1,..."),
    "servers": dict(default=None, metavar="SERVERS", callback=_check_rpc),
}


def _flag(info: "OptionInfo") -> Decorator:
    return click.option(*info.flags, info.name, help=info.help, **_FLAG_KINDS[info.kind])


def runtime_options(only: tuple[str, ...] = ()) -> Decorator:
    """The flags of the runtime options table (farctx.context.RuntimeOptions: -c -b -ub -t -fa -ctk -ctv -ngl -ts
    --rpc), or of the options named in `only`: how llama.cpp runs the model."""
    from farctx.context import option_infos

    return _stack(*(_flag(o) for o in option_infos() if o.flags and (not only or o.name in only)))


def method_options(with_method: bool = True) -> Decorator:
    """--method and every method's parameters, from libfarctx's parameter table (unset: from the model
    or the method's default)."""
    from farctx.methods import DEFAULT_METHOD, method_names, param_infos

    methods = method_names()
    method = [click.option("--method", type=click.Choice(methods), default=DEFAULT_METHOD, show_default=True,
                           help="attention method (auto: stock inside the trained context, an extension past it)")] if with_method else []
    return _stack(
        *method,
        *(click.option(p.flag, p.name, type=click.IntRange(p.minimum), default=None,
                       help=p.option_help(methods)) for p in param_infos()),
    )


def method_keys() -> tuple[str, ...]:
    """The options method_options adds (without --method): the parameter table's names."""
    from farctx.methods import param_infos

    return tuple(p.name for p in param_infos())


def _value(kind: str, text: Any, flag: str) -> Any:
    """A runtime option's value from its flag's parsed text."""
    if kind == "cells":
        return text or None  # 0: unset, the context plan's
    if kind == "switch":
        return text == "on"
    if kind == "kv":
        return KV_TYPES[text]
    if kind == "layers":
        if str(text) == "all":
            return -1
        try:
            return int(text)
        except ValueError:
            raise click.BadParameter(f"'{text}' is not a number or 'all'", param_hint=flag) from None
    if kind == "split" and text:
        try:
            return [float(x) for x in text.split(",")]
        except ValueError:
            raise click.BadParameter(f"'{text}' is not a comma-separated list of numbers", param_hint=flag) from None
    if kind == "servers":
        return text.split(",") if text else []
    return text


def runtime(opts: dict[str, Any]) -> "RuntimeOptions":
    """The runtime options from the parsed flags of runtime_options (consumes them; a flag not given keeps the
    option's default)."""
    from farctx.context import RuntimeOptions, option_infos
    from farctx.errors import FarctxError

    values: dict[str, Any] = {}
    for info in option_infos():
        if info.flags and info.name in opts:
            value = _value(info.kind, opts.pop(info.name), info.flags[0])
            if value is not None:
                values[info.name] = value
    if "n_threads" in values:
        values["n_threads_batch"] = values["n_threads"]  # llama.cpp's -t sets both
    if values.get("rpc_servers") and values.get("n_gpu_layers", 0) == 0:
        click.echo("farctx: warning: --rpc with -ngl 0 puts no layer on the RPC servers (-ngl all: every layer)",
                   err=True)
    try:
        return RuntimeOptions(**values)
    except FarctxError as exc:
        raise click.UsageError(str(exc)) from None


def llama_kwargs(opts: dict[str, Any]) -> dict[str, Any]:
    """keyword arguments of farctx.Llama from the parsed options (consumes them): the method, its parameters and
    the runtime options set."""
    kwargs: dict[str, Any] = {"method": opts.pop("method"), "n_ctx": 0, **runtime(opts).kwargs()}
    for key in method_keys():
        value = opts.pop(key)
        if value is not None:
            kwargs[key] = value
    return kwargs
