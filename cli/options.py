"""Options shared by the farctx commands, with llama.cpp's flag names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import click

from farctx.kv_types import KV_TYPES  # noqa: F401  (-ctk/-ctv choices; bench_cmd reads it here too)

if TYPE_CHECKING:
    from farctx.context import RuntimeOptions

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


def rpc_option() -> Decorator:
    return click.option("--rpc", "rpc", default=None, metavar="SERVERS", callback=_check_rpc,
                        help="comma-separated HOST:PORT of ggml RPC servers (`farctx rpc-server`): the offloaded "
                             "layers (-ngl) go to them, then to the local GPUs")


def runtime_options() -> Decorator:
    """-c -b -ub -t -ngl -fa -ctk -ctv -ts --rpc: how llama.cpp runs the model."""
    return _stack(
        click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(0), default=0, show_default=True,
                     help="KV cache size in tokens (0: what the method needs: head + n_local + n_ubatch for a "
                          "fixed-cache method; the prompt and the generation, else 4 x the trained context, for "
                          "the others)"),
        click.option("-b", "--batch-size", "n_batch", type=click.IntRange(0), default=0, show_default=True,
                     help="logical batch size (0: 512, at most the cache)"),
        click.option("-ub", "--ubatch-size", "n_ubatch", type=click.IntRange(0), default=0, show_default=True,
                     help="physical batch size (0: 512, or what a fixed-cache method's -c leaves room for)"),
        click.option("-t", "--threads", "n_threads", type=int, default=None, help="CPU threads"),
        click.option("-ngl", "--gpu-layers", "--n-gpu-layers", "n_gpu_layers", default="0", show_default=True,
                     help="layers to offload to the GPU (a number or 'all')"),
        click.option("-fa", "--flash-attn", "flash_attn", type=click.Choice(["on", "off"]), default="off",
                     show_default=True, help="flash attention"),
        click.option("-ctk", "--cache-type-k", "cache_type_k", type=click.Choice(sorted(KV_TYPES)), default="f16",
                     show_default=True, help="KV cache type for K"),
        click.option("-ctv", "--cache-type-v", "cache_type_v", type=click.Choice(sorted(KV_TYPES)), default="f16",
                     show_default=True, help="KV cache type for V"),
        click.option("-ts", "--tensor-split", "tensor_split", default=None, metavar="N0,N1,...",
                     help="proportions of the offloaded layers per device, in llama.cpp's order: the --rpc servers, "
                          "then the local GPUs (default: by free memory)"),
        rpc_option(),
    )


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


def runtime(opts: dict[str, Any]) -> "RuntimeOptions":
    """The runtime options from the parsed flags of runtime_options (consumes them)."""
    from farctx.context import RuntimeOptions
    from farctx.errors import FarctxError

    ngl = str(opts.pop("n_gpu_layers"))
    if ngl == "all":
        n_gpu_layers = -1
    else:
        try:
            n_gpu_layers = int(ngl)
        except ValueError:
            raise click.BadParameter(f"'{ngl}' is not a number or 'all'", param_hint="-ngl") from None
    split = opts.pop("tensor_split")
    try:
        tensor_split = [float(x) for x in split.split(",")] if split else None
    except ValueError:
        raise click.BadParameter(f"'{split}' is not a comma-separated list of numbers", param_hint="-ts") from None
    rpc_servers = opts.pop("rpc")
    if rpc_servers and n_gpu_layers == 0:
        click.echo("farctx: warning: --rpc with -ngl 0 puts no layer on the RPC servers (-ngl all: every layer)",
                   err=True)
    threads = opts.pop("n_threads")
    try:
        return RuntimeOptions(
            n_ctx=opts.pop("n_ctx"),
            n_batch=opts.pop("n_batch") or None,  # 0: unset, the context plan's
            n_ubatch=opts.pop("n_ubatch") or None,
            n_threads=threads, n_threads_batch=threads,
            flash_attn=opts.pop("flash_attn") == "on",
            type_k=KV_TYPES[opts.pop("cache_type_k")],
            type_v=KV_TYPES[opts.pop("cache_type_v")],
            n_gpu_layers=n_gpu_layers, tensor_split=tensor_split,
            rpc_servers=rpc_servers.split(",") if rpc_servers else [],
        )
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
