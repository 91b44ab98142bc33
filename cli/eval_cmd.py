"""farctx eval ppl / eval passkey: quality against length, a table, JSON and a PNG."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

import click

from .options import llama_kwargs, method_options, model_option, runtime_options


def parse_lengths(text: str) -> list[int]:
    """'2k,4k,6000' -> [2048, 4096, 6000] (k = 1024, as llama.cpp counts contexts)."""
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        try:
            out.append(int(float(part[:-1]) * 1024) if part.endswith("k") else int(part))
        except ValueError:
            raise click.BadParameter(f"'{part}' is not a length (e.g. 2048 or 2k)", param_hint="--lengths") from None
    if not out or min(out) <= 0:
        raise click.BadParameter("give positive lengths", param_hint="--lengths")
    return out


def parse_methods(text: str) -> list[str]:
    from farctx.methods import METHODS

    methods = [m.strip() for m in text.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            raise click.BadParameter(f"unknown method '{m}' (choose from {', '.join(METHODS)})", param_hint="--method")
    return methods


def _make_llm(model: Optional[str], method: str, n_ctx_whole: int, base: dict[str, Any]) -> Any:
    import farctx
    from farctx.methods import fixed_cache, stream_cells
    from farctx.progress import Progress

    kwargs = dict(base, method=method)
    if kwargs.get("n_ctx", 0) == 0 and not fixed_cache(method):
        # the whole stream in the cache (vanilla: even past n_ctx_train), sized by libfarctx
        kwargs["n_ctx"] = stream_cells(model, kwargs, n_ctx_whole, 0)
    llm = farctx.Llama(model, progress=Progress(f"{method}", min_total=2048), **kwargs)
    click.echo(f"farctx: {llm.method_params.describe()}, cache {llm.n_ctx()} cells", err=True)
    return llm


def _write_outputs(payload: dict[str, Any], json_path: Optional[str], plot: Any, plot_path: Optional[str]) -> None:
    if json_path:
        text = json.dumps(payload, indent=1)
        if json_path == "-":
            click.echo(text)
        else:
            Path(json_path).write_text(text + "\n")
    if plot_path:
        plot(Path(plot_path))


def _method_keys(opts: dict[str, Any]) -> dict[str, Any]:
    opts = dict(opts)
    opts["method"] = "vanilla"
    kwargs = llama_kwargs(opts)
    kwargs.pop("method")
    return kwargs


@click.group(name="eval")
def eval_group() -> None:
    """Quality against length: perplexity and passkey retrieval."""


@eval_group.command()
@model_option()
@click.option("-f", "--file", default=None, metavar="FNAME",
              help="the long document (default: Jane Austen's Emma from the Debian package)")
@click.option("--methods", "--method", "methods", default="vanilla", show_default=True, help="comma-separated methods")
@click.option("--lengths", default="1k,2k,4k,8k", show_default=True, help="positions to score at (k = 1024)")
@click.option("--window", type=click.IntRange(2), default=256, show_default=True, help="tokens scored per length")
@click.option("--docs", type=click.IntRange(1), default=1, show_default=True,
              help="streams starting at evenly spaced points of the text; their scored tokens are pooled")
@click.option("--json", "json_path", default=None, metavar="FILE", help="write the results as JSON (- for stdout)")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png", help="write a PNG plot")
@runtime_options()
@method_options(with_method=False)
def ppl(model: Optional[str], file: Optional[str], methods: str, lengths: str, window: int, docs: int,
        json_path: Optional[str], plot_path: Optional[str], **opts: Any) -> None:
    """Perplexity of one long document near each length, per method."""
    import farctx
    from farctx.eval_ppl import PROTOCOL, check_lengths, perplexity_of_method, pool
    from farctx.plots import plot_ppl

    method_list = parse_methods(methods)
    base = _method_keys(opts)
    info = farctx.model_info(model)
    if file is None:
        from farctx.data import austen

        text, source = austen("emma"), "Jane Austen, Emma (r-cran-janeaustenr)"
    else:
        text, source = Path(file).read_text(encoding="utf-8", errors="replace"), file
    protocol = PROTOCOL.format(window=window)
    if docs > 1:
        protocol += f"; {docs} streams starting at evenly spaced points of the text, their scored tokens pooled"
    results = []
    quiet = json_path == "-"
    started = time.monotonic()
    probe = farctx.Llama(model, n_ctx=256, n_batch=256)
    tokens = probe.tokenize(text.encode("utf-8"))
    probe.close()
    length_list = check_lengths(parse_lengths(lengths), window, len(tokens) // docs)
    starts = [d * (len(tokens) // docs) for d in range(docs)]
    for method in method_list:
        llm = _make_llm(model, method, max(length_list) + 1, base)
        per_doc = [perplexity_of_method(llm, tokens[s:], length_list, window) for s in starts]
        for r in pool(per_doc):
            results.append(r)
            click.echo(f"farctx: {r.method:<12} length {r.length:>7}: ppl {r.ppl:.3f}", err=True)
        llm.close()
    elapsed = time.monotonic() - started
    payload = {"model": info.path, "n_ctx_train": info.n_ctx_train, "protocol": protocol, "source": source,
               "seconds": round(elapsed, 1), "results": [r.as_dict() for r in results]}
    if not quiet:
        click.echo(f"protocol: {protocol}")
        click.echo(f"document: {source}, {len(tokens)} tokens; model n_ctx_train {info.n_ctx_train}; {elapsed:.0f} s")
        click.echo(f"| {'method':<12} | " + " | ".join(f"{x:>8}" for x in length_list) + " |")
        click.echo("|" + "-" * 14 + "|" + "|".join("-" * 10 for _ in length_list) + "|")
        for method in method_list:
            row = {r.length: r.ppl for r in results if r.method == method}
            click.echo(f"| {method:<12} | " + " | ".join(f"{row[x]:>8.2f}" for x in length_list) + " |")
    _write_outputs(payload, json_path, lambda p: plot_ppl(results, info.n_ctx_train, p, Path(info.path).name),
                   plot_path)


@eval_group.command()
@model_option()
@click.option("--methods", "--method", "methods", default="vanilla", show_default=True, help="comma-separated methods")
@click.option("--lengths", default="1k,2k", show_default=True, help="prompt lengths (k = 1024)")
@click.option("--depths", default=None, help="comma-separated depths in [0, 1] (default: random per sample)")
@click.option("--samples", type=click.IntRange(1), default=5, show_default=True, help="samples per length and depth")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "json_path", default=None, metavar="FILE", help="write the results as JSON (- for stdout)")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png", help="write a PNG plot")
@runtime_options()
@method_options(with_method=False)
def passkey(model: Optional[str], methods: str, lengths: str, depths: Optional[str], samples: int, seed: int,
            json_path: Optional[str], plot_path: Optional[str], **opts: Any) -> None:
    """Passkey retrieval accuracy per method, length (and depth)."""
    import farctx
    from farctx.eval_passkey import ANSWER_TOKENS, passkey_of_method
    from farctx.plots import plot_passkey

    method_list = parse_methods(methods)
    length_list = sorted(set(parse_lengths(lengths)))
    depth_list: list[Optional[float]] = [None]
    if depths:
        try:
            depth_list = [float(d) for d in depths.split(",") if d.strip()]
        except ValueError:
            raise click.BadParameter(f"'{depths}' is not a list of numbers", param_hint="--depths") from None
        if any(not 0.0 <= d <= 1.0 for d in depth_list):  # type: ignore[operator]
            raise click.BadParameter("depths are between 0 and 1", param_hint="--depths")
    base = _method_keys(opts)
    info = farctx.model_info(model)
    results = []
    started = time.monotonic()
    for method in method_list:
        llm = _make_llm(model, method, max(length_list) + ANSWER_TOKENS + 1, base)

        def show(r: Any) -> None:
            depth = "random" if r.depth is None else f"{r.depth:.2f}"
            click.echo(f"farctx: {r.method:<12} length {r.length:>7} depth {depth}: {r.accuracy:.2f}", err=True)

        results += passkey_of_method(llm, length_list, depth_list, samples, seed, on_result=show)
        llm.close()
    elapsed = time.monotonic() - started
    payload = {"model": info.path, "n_ctx_train": info.n_ctx_train, "seconds": round(elapsed, 1),
               "results": [r.as_dict() for r in results]}
    if json_path != "-":
        click.echo(f"passkey retrieval, {samples} samples per cell, seed {seed}; model n_ctx_train "
                   f"{info.n_ctx_train}; {elapsed:.0f} s")
        click.echo(f"| {'method':<12} | {'depth':>6} | " + " | ".join(f"{x:>7}" for x in length_list) + " |")
        for method in method_list:
            for depth in depth_list:
                row = {r.length: r.accuracy for r in results if r.method == method and r.depth == depth}
                label = "random" if depth is None else f"{depth:.2f}"
                click.echo(f"| {method:<12} | {label:>6} | " + " | ".join(f"{row[x]:>7.2f}" for x in length_list) + " |")
    _write_outputs(payload, json_path, lambda p: plot_passkey(results, info.n_ctx_train, p, Path(info.path).name),
                   plot_path)
    sys.stdout.flush()
