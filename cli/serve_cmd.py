"""farctx serve: an OpenAI-compatible server (llama-server's flag names) past the trained context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from .options import llama_kwargs, method_options, model_option, runtime_options


@click.command()
@model_option()
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on (loopback by default)")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="port to listen on")
@click.option("-a", "--alias", default=None, help="the model's name in the API (default: the file name)")
@click.option("-np", "--parallel", "parallel", type=click.IntRange(1, 256), default=1, show_default=True,
              help="slots: requests served at once (continuous batching); -c is shared among them")
@click.option("-n", "--n-predict", "n_predict", type=click.IntRange(0), default=0, show_default=True,
              help="cap on a request's max_tokens: asking more (or nothing) gets the cap (0: no cap)")
@click.option("-to", "--timeout", "timeout", type=click.FloatRange(0), default=0, show_default=True,
              help="seconds a request may take from its arrival; past it, it is cancelled and answered 408 (0: none)")
@click.option("--deterministic", is_flag=True,
              help="batch-invariant kernels: a request's logits are bitwise the same whatever runs beside it (CPU "
                   "backend only; slower, docs/server.md)")
@click.option("--metrics", is_flag=True, help="serve /metrics (Prometheus text format)")
@click.option("--no-override", is_flag=True, help="refuse a per-request method (the `farctx` body field)")
@click.option("--api-key", default=None, help="require `Authorization: Bearer KEY` (comma-separated keys; /health stays open)")
@click.option("--api-key-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="as --api-key, one key per line")
@click.option("--ssl-key-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="serve HTTPS with this PEM private key (with --ssl-cert-file)")
@click.option("--ssl-cert-file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="serve HTTPS with this PEM certificate (with --ssl-key-file)")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]),
              default="info", show_default=True)
@runtime_options()
@method_options()
def serve(model: str | None, host: str, port: int, alias: str | None, parallel: int,
          n_predict: int, timeout: float, deterministic: bool, metrics: bool, no_override: bool, api_key: str | None,
          api_key_file: str | None, ssl_key_file: str | None, ssl_cert_file: str | None, log_level: str,
          **opts: Any) -> None:
    """OpenAI-compatible server: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.

    Requests are served in -np slots at once (1 by default), fed together step by step; a follow-up
    turn reuses the slot whose stream shares the longest prefix with its prompt. -c is the KV cells
    of all slots (each gets c / np); without it each slot gets what --method needs: the fixed-cache
    methods (e.g. lminf) head + n_local + n_ubatch, through which prompts of any length stream;
    auto (the default) and vanilla n_ctx_train, auto reading past it when -c is larger; the other methods
    that keep the whole stream (e.g. mesa) 4 x n_ctx_train. A request
    that does not fit its slot gets llama.cpp's exceed_context_size_error with the sizes. A request
    may ask for another method with a `farctx` field ({"method": "mesa", ...}): its slot's stream is
    opened again under it.
    """
    from farctx.models import resolve_model_path

    try:
        from farctx.serve.app import limit_malloc_arenas
        from farctx.serve.app import serve as run_server
        from farctx.serve.server import Limits, Server
    except ImportError as exc:
        raise click.ClickException(f"farctx serve needs the server packages: pip install 'farctx[serve]' ({exc})")
    limit_malloc_arenas()  # before the model, the scheduler and uvicorn start threads

    keys = api_keys(api_key, api_key_file)
    if (ssl_key_file is None) != (ssl_cert_file is None):
        raise click.BadParameter("give both or neither", param_hint="--ssl-key-file / --ssl-cert-file")
    kwargs = llama_kwargs(opts)
    if deterministic:
        kwargs["deterministic"] = True
    name = alias or Path(resolve_model_path(model)).stem
    server = Server(model, kwargs, name, n_parallel=parallel, allow_override=not no_override,
                    limits=Limits(n_predict=n_predict, timeout=timeout), metrics=metrics)
    run_server(server, host=host, port=port, log_level=log_level, api_keys=keys,
               ssl=(ssl_key_file, ssl_cert_file) if ssl_key_file else None)


def api_keys(api_key: str | None, api_key_file: str | None) -> frozenset[str]:
    """The keys of --api-key (comma-separated) and --api-key-file (one per line; blank lines skipped)."""
    keys = [k.strip() for k in (api_key or "").split(",")]
    if api_key_file:
        keys += [line.strip() for line in Path(api_key_file).read_text().splitlines()]
    keys = [k for k in keys if k]
    if (api_key is not None or api_key_file) and not keys:
        raise click.BadParameter("no key given", param_hint="--api-key / --api-key-file")
    return frozenset(keys)

