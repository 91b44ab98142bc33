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
    """--methods: comma-separated names, or `all` (every method of libfarctx's table, in its order)."""
    from farctx.methods import METHODS

    if text.strip() == "all":
        return list(METHODS)
    methods = [m.strip() for m in text.split(",") if m.strip()]
    for m in methods:
        if m not in METHODS:
            raise click.BadParameter(f"unknown method '{m}' (choose from {', '.join(METHODS)})", param_hint="--method")
    return methods


def _make_llm(model: Optional[str], method: str, n_ctx_whole: int, base: dict[str, Any]) -> Any:
    import farctx
    from farctx.progress import Progress

    # n_ctx 0: the plan's cache; the methods that keep the whole stream get one for n_ctx_whole tokens (vanilla: even
    # past n_ctx_train)
    kwargs = dict(base, method=method, n_prompt=n_ctx_whole)
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
    """Quality against length: perplexity, passkey retrieval, out-of-distribution factors."""


@eval_group.command()
@model_option()
@click.option("-f", "--file", default=None, metavar="FNAME",
              help="the long document (default: Jane Austen's Emma from the Debian package)")
@click.option("--methods", "--method", "methods", default="auto", show_default=True, help="comma-separated methods, or all")
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
    from farctx.eval.ppl import PROTOCOL, check_lengths, perplexity_of_method, pool
    from farctx.eval.plots import plot_ppl

    method_list = parse_methods(methods)
    base = _method_keys(opts)
    info = farctx.model_info(model)
    if file is None:
        from farctx.eval.data import austen

        text, source = austen("emma"), "Jane Austen, Emma (r-cran-janeaustenr)"
    else:
        text, source = Path(file).read_text(encoding="utf-8", errors="replace"), file
    protocol = PROTOCOL.format(window=window)
    if docs > 1:
        protocol += f"; {docs} streams starting at evenly spaced points of the text, their scored tokens pooled"
    results = []
    quiet = json_path == "-"
    started = time.monotonic()
    probe = farctx.Llama(model, vocab_only=True)  # the tokenizer: no weights, no context
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


def parse_depths(text: Optional[str]) -> list[Optional[float]]:
    """'0.1,0.5,0.9' -> [0.1, 0.5, 0.9]; None or 'random' -> [None] (a random depth per sample)."""
    if text is None or text.strip().lower() == "random":
        return [None]
    try:
        depths = [float(d) for d in text.split(",") if d.strip()]
    except ValueError:
        raise click.BadParameter(f"'{text}' is not a list of numbers", param_hint="--depths") from None
    if not depths or any(not 0.0 <= d <= 1.0 for d in depths):
        raise click.BadParameter("depths are between 0 and 1", param_hint="--depths")
    return list(dict.fromkeys(depths))


def _niah_command(name: str, summary: str, defaults: dict[str, Any]) -> Any:
    """`farctx eval niah` and `farctx eval passkey`: one sampler and one runner, with their own defaults."""
    from farctx.eval.niah import KIND_NAMES, PLACEMENTS, QUESTIONS

    def command(model: Optional[str], methods: str, lengths: str, depths: Optional[str], samples: int, kind: str,
                haystack: str, placement: str, digits: int, question: str, chat: Optional[bool], distractors: int,
                seed: int,
                threshold: float, absolute: bool, json_path: Optional[str], plot_path: Optional[str],
                report_only: bool, **opts: Any) -> None:
        from farctx.eval.niah import Protocol

        if chat is None:  # the model's chat template where it has one (an instruct model), else raw text
            chat = defaults["chat"] and model_has_chat_template(model)
        try:
            protocol = Protocol(kind=kind, haystack=haystack, placement=placement, digits=digits, question=question,
                                chat=chat, distractors=distractors)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
        run_niah(model, parse_methods(methods), sorted(set(parse_lengths(lengths))), parse_depths(depths), samples,
                 protocol, seed, threshold, absolute, json_path, plot_path, report_only, opts)

    command.__doc__ = summary
    decorators = [
        eval_group.command(name=name),
        model_option(),
        click.option("--methods", "--method", "methods", default="auto", show_default=True,
                     help="comma-separated methods, or all"),
        click.option("--lengths", default=defaults["lengths"], show_default=True,
                     help="lengths (k = 1024): each prompt and its answer fit in its length"),
        click.option("--depths", default=defaults["depths"], show_default=True,
                     help="comma-separated needle depths in [0, 1], or random (one per sample)"),
        click.option("--samples", type=click.IntRange(1), default=defaults["samples"], show_default=True,
                     help="samples per length and depth"),
        click.option("--kind", type=click.Choice(KIND_NAMES), default=defaults["kind"], show_default=True,
                     help="the needle: a pass key, a word's number (RULER niah_single_2), or one word's number among "
                          "distractors (RULER niah_multikey_1)"),
        click.option("--haystack", default=defaults["haystack"], show_default=True, metavar="TEXT",
                     help="the filler: austen:NOVEL, shakespeare:NAME, a file, or repeat (the LM-Infinite passkey's "
                          "repeated sentences)"),
        click.option("--placement", type=click.Choice(PLACEMENTS), default=defaults["placement"], show_default=True,
                     help="the needle on a line of its own, or inline, at the sentence boundary nearest its depth"),
        click.option("--digits", type=click.IntRange(1, 12), default=defaults["digits"], show_default=True,
                     help="digits of the key"),
        click.option("--question", type=click.Choice(QUESTIONS), default="cue", show_default=True,
                     help="cue: the question then the answer's start ('... The pass key is'); bare: the question alone"),
        click.option("--chat/--raw", default=None,
                     help="the document and the question as a user message of the model's chat template, or raw text "
                          + ("[default: --chat where the model has a chat template, else --raw]" if defaults["chat"]
                             else "[default: --raw]")),
        click.option("--distractors", type=click.IntRange(0), default=3, show_default=True,
                     help="multikey: needles of the same form with other words"),
        click.option("--seed", type=int, default=1, show_default=True),
        click.option("--threshold", type=click.FloatRange(0.0, 1.0), default=0.85, show_default=True,
                     help="effective length: the longest length at or above this fraction of the method's own "
                          "accuracy at its trained context (with --absolute: this accuracy)"),
        click.option("--absolute", is_flag=True, help="--threshold is an accuracy, not a fraction of the 1x score"),
        click.option("--json", "json_path", default=None, metavar="FILE",
                     help="every sample and the summary as JSON; a run given an existing file resumes it (- for stdout)"),
        click.option("--plot", "plot_path", default=None, metavar="FILE.png", help="a heat map per method"),
        click.option("--report-only", is_flag=True,
                     help="run nothing: the table, effective lengths and plot of what --json holds (a cell not run: -)"),
        runtime_options(),
        method_options(with_method=False),
    ]
    for d in reversed(decorators[1:]):
        command = d(command)
    return decorators[0](command)


def model_has_chat_template(model: Optional[str]) -> bool:
    import farctx

    vocab = farctx.Llama(model, vocab_only=True)
    try:
        return bool(vocab.metadata.get("tokenizer.chat_template"))
    finally:
        vocab.close()


def run_niah(model: Optional[str], method_list: list[str], length_list: list[int], depth_list: list[Optional[float]],
             samples: int, protocol: Any, seed: int, threshold: float, absolute: bool, json_path: Optional[str],
             plot_path: Optional[str], report_only: bool, opts: dict[str, Any]) -> None:
    import farctx
    from farctx.errors import FarctxError
    from farctx.eval.data import long_text
    from farctx.eval.niah import (FILLER, REPEAT, GridFile, Sampler, chat_formatter, effective_length,
                                  haystack_paragraphs, length_accuracy, plan_order, run_cells, summarize)
    from farctx.eval.plots import plot_niah

    base = _method_keys(opts)
    info = farctx.model_info(model)
    if protocol.haystack == REPEAT:
        paragraphs, source = [FILLER], "the repeated sentences of the LM-Infinite passkey"
    else:
        try:
            text, source = long_text(protocol.haystack)
        except FarctxError as exc:
            raise click.BadParameter(str(exc), param_hint="--haystack") from None
        paragraphs = haystack_paragraphs(text)
        if not paragraphs:
            raise click.BadParameter(f"{protocol.haystack} has no text", param_hint="--haystack")
    vocab = farctx.Llama(model, vocab_only=True)  # the tokenizer: no weights, no context

    def tokenize(text: str) -> list[int]:
        return vocab.tokenize(text.encode("utf-8"), special=True)

    fmt = chat_formatter(vocab) if protocol.chat else None
    if protocol.chat and fmt is None:
        raise click.BadParameter(f"{Path(info.path).name} has no chat template", param_hint="--chat")
    sampler = Sampler(protocol, paragraphs, lambda t: len(tokenize(t)), seed, fmt)
    try:
        sampler.filler(min(length_list))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--lengths") from None
    path = None if json_path in (None, "-") else Path(json_path)
    if report_only and (path is None or not path.is_file()):
        raise click.BadParameter("--report-only reads the grid of an existing --json FILE", param_hint="--json")
    header = {"model": Path(info.path).name, "n_ctx_train": info.n_ctx_train, "protocol": protocol.as_dict(),
              "protocol_text": protocol.describe(), "haystack_source": source, "seed": seed, "methods": {}}
    try:
        grid = GridFile.open(path, header)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--json") from None
    done = grid.done()
    order = plan_order(length_list, depth_list, samples)
    started = time.monotonic()
    reserve = sampler.answer_tokens + 1
    for method in [] if report_only else method_list:
        cells = [c for c in order if (method, *c) not in done]
        click.echo(f"farctx: niah {method}: {len(order) - len(cells)} of {len(order)} samples already in "
                   f"{json_path}" if path and len(cells) < len(order) else f"farctx: niah {method}: "
                   f"{len(order)} samples", err=True)

        def show(r: Any) -> None:
            grid.add(r)
            where = "random" if r.depth is None else f"{r.depth:.2f}"
            click.echo(f"farctx: niah {r.method:<10} {r.length:>6} depth {where:>6} #{r.index}: "
                       f"{'right' if r.correct else 'wrong'} {r.answer!r} (key {r.key}; read {r.prompt_read} of "
                       f"{r.prompt_tokens} prompt tokens, {r.seconds:.0f} s)", err=True)

        # one engine per length, set up as a user reading that many tokens gets it (selfextend's group grows with
        # the length); the samples of a length share their prefixes through its prompt cache
        for length in sorted({c[0] for c in cells}):
            llm = _make_llm(model, method, length + reserve, base)
            try:
                grid.set_method(method, length, llm.method_params.describe())
            except ValueError as exc:
                llm.close()
                raise click.BadParameter(str(exc), param_hint="--json") from None
            try:
                run_cells(llm, sampler, method, [c for c in cells if c[0] == length], tokenize, show)
            finally:
                llm.close()
    vocab.close()
    elapsed = time.monotonic() - started
    records = [r for r in grid.records if r.method in method_list and r.length in length_list
               and r.depth in depth_list and r.index < samples]
    effective = {m: effective_length(records, m, info.n_ctx_train, threshold, absolute) for m in method_list}
    total = sum(r.prompt_tokens for r in records)
    read = sum(r.prompt_read for r in records)
    extra = {"effective_length": {m: vars(e) for m, e in effective.items()},
             "threshold": {"value": threshold, "absolute": absolute},
             "prompt_tokens": total, "prompt_tokens_read": read}
    grid.write(extra)
    if json_path == "-":
        click.echo(json.dumps(grid.payload(extra), indent=1))
    else:
        click.echo(f"needle in a haystack: {protocol.describe()}; {samples} samples per cell, seed {seed}; "
                   f"model {Path(info.path).name}, n_ctx_train {info.n_ctx_train}; {elapsed:.0f} s")
        saved = f"{100.0 * (1 - read / total):.0f}%" if total else "-"
        click.echo(f"prompt tokens: {total} in all, {read} read (the shared prefixes saved {saved})")
        head = " | ".join(f"{n:>9}" + ("*" if n <= info.n_ctx_train else " ") for n in length_list)
        click.echo(f"| {'method':<12} | {'depth':>6} | {head} |")
        click.echo("|" + "-" * 14 + "|" + "-" * 8 + "|" + "|".join("-" * 12 for _ in length_list) + "|")
        cells_by = {(c.method, c.length, c.depth): c for c in summarize(records)}

        def fmt_cell(correct: int, n: int) -> str:
            return f"{correct / n:.2f} {correct}/{n}" if n else "-"

        for method in method_list:
            for depth in depth_list:
                row = []
                for n in length_list:
                    c = cells_by.get((method, n, depth))
                    row.append(f"{fmt_cell(c.correct, c.n) if c else '-':>10}")
                label = "random" if depth is None else f"{depth:.2f}"
                click.echo(f"| {method:<12} | {label:>6} | " + " | ".join(row) + " |")
            if len(depth_list) > 1:
                by_length = length_accuracy(records, method)
                row = [f"{fmt_cell(*by_length[n]) if n in by_length else '-':>10}" for n in length_list]
                click.echo(f"| {method:<12} | {'all':>6} | " + " | ".join(row) + " |")
        click.echo(f"* inside the trained context ({info.n_ctx_train})")
        kind = "accuracy" if absolute else "of the method's own accuracy at its trained context"
        click.echo(f"effective length (the longest length with every length up to it at or above {threshold:g} {kind}):")
        for method, e in effective.items():
            if e.reference is None and not absolute:
                click.echo(f"  {method:<12} -: no length inside the trained context to take its score from")
                continue
            where = "no length" if e.length is None else str(e.length)
            ref = "" if e.reference is None else f" (reference: {e.reference})"
            click.echo(f"  {method:<12} {where:>8}  threshold {e.threshold:.2f}{ref}")
    if plot_path:
        plot_niah(summarize(records), info.n_ctx_train, Path(plot_path), effective,
                  f"{Path(info.path).name}: {protocol.describe()}", method_list, length_list)
    sys.stdout.flush()


niah = _niah_command(
    "niah", "Needle in a haystack: accuracy per method, length and depth, every answer kept, the effective length.",
    {"kind": "word-value", "haystack": "austen:emma", "placement": "line", "digits": 5, "depths": "0.1,0.5,0.9",
     "samples": 3, "lengths": "4k,8k,16k", "chat": True})
passkey = _niah_command(
    "passkey", "Passkey retrieval (the LM-Infinite protocol: repeated sentences, a 7-digit key): `eval niah` with "
    "these defaults.",
    {"kind": "passkey", "haystack": "repeat", "placement": "inline", "digits": 7, "depths": "random", "samples": 5,
     "lengths": "1k,2k", "chat": False})


def parse_layers(text: Optional[str], n_layer: int) -> Optional[list[int]]:
    """'0,2,5' -> [0, 2, 5]; None or 'all' -> None (every layer)."""
    if text is None or text.strip().lower() == "all":
        return None
    try:
        layers = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise click.BadParameter(f"'{text}' is not a list of layer numbers", param_hint="--layers") from None
    if not layers or layers[0] < 0 or layers[-1] >= n_layer:
        raise click.BadParameter(f"layers are 0..{n_layer - 1} for this model", param_hint="--layers")
    return layers


@eval_group.command()
@model_option()
@click.option("-f", "--file", default=None, metavar="FNAME",
              help="the document (default: Jane Austen's Emma from the Debian package)")
@click.option("--methods", "--method", "methods", default="vanilla,lminf", show_default=True,
              help="comma-separated methods, or all")
@click.option("--lengths", default=None,
              help="lengths to report the factors at (k = 1024); the document is streamed to the largest "
                   "[default: 1x,2x,4x n_ctx_train]")
@click.option("--layers", default=None, help="comma-separated layers to record (default: all)")
@click.option("--bucket", type=click.IntRange(1), default=None, help="positions per bucket [default: n_ctx_train/8]")
@click.option("--threshold", type=click.FloatRange(0.0, 1.0), default=0.02, show_default=True,
              help="hidden_out: the fraction of a layer's dimensions outside their in-context range that counts as leaving it")
@click.option("--tolerance", type=click.FloatRange(0.0), default=0.25, show_default=True,
              help="logits and entropy: the margin past the in-context range, as a fraction of its spread")
@click.option("--persist", type=click.IntRange(1), default=4, show_default=True,
              help="consecutive buckets outside the range that count as leaving it")
@click.option("--json", "json_path", default=None, metavar="FILE", help="write the results as JSON (- for stdout)")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png", help="write a PNG plot")
@runtime_options()
@method_options(with_method=False)
def ood(model: Optional[str], file: Optional[str], methods: str, lengths: Optional[str], layers: Optional[str],
        bucket: Optional[int], threshold: float, tolerance: float, persist: int, json_path: Optional[str],
        plot_path: Optional[str], **opts: Any) -> None:
    """Out-of-distribution factors (attention logits, entropy, hidden-state ranges) against position, per method.

    Flash attention is always off here: the attention scores exist as tensors only without it."""
    import farctx
    from farctx.eval.ood import PROTOCOL, OodRun, cost_line, exit_cell, ood_of_method, value_at
    from farctx.methods import fixed_cache
    from farctx.eval.ood_recorder import FACTORS, OodSettings
    from farctx.eval.plots import plot_ood

    method_list = parse_methods(methods)
    if opts.get("flash_attn") == "on":
        click.echo("farctx: flash attention forced off: the attention scores exist as tensors only without it",
                   err=True)
    opts["flash_attn"] = "off"
    if opts.get("type_v") not in ("f32", "f16", "bf16"):
        raise click.BadParameter("a quantized V cache needs flash attention, which this command turns off",
                                 param_hint="-ctv")
    base = _method_keys(opts)
    info = farctx.model_info(model)
    n_train = info.n_ctx_train
    length_list = sorted(set(parse_lengths(lengths))) if lengths else [n_train, 2 * n_train, 4 * n_train]
    layer_list = parse_layers(layers, info.n_layer)
    settings = OodSettings(n_ctx_train=n_train, bucket=bucket or max(1, n_train // 8), layers=layer_list,
                           threshold=threshold, tolerance=tolerance, persist=persist)
    if file is None:
        from farctx.eval.data import austen

        text, source = austen("emma"), "Jane Austen, Emma (r-cran-janeaustenr)"
    else:
        path = Path(file)
        if not path.is_file():
            raise click.BadParameter(f"no such file: {file}", param_hint="-f")
        text, source = path.read_text(encoding="utf-8", errors="replace"), file
    probe = farctx.Llama(model, vocab_only=True)  # the tokenizer: no weights, no context
    tokens = probe.tokenize(text.encode("utf-8"))
    probe.close()
    n = max(length_list)
    if n > len(tokens):
        raise click.BadParameter(f"the document has {len(tokens)} tokens, fewer than the largest length {n}",
                                 param_hint="--lengths")
    tokens = tokens[:n]
    n_layer_seen = info.n_layer if layer_list is None else len(layer_list)
    click.echo("farctx: " + cost_line(method_list, n, n_train, info.n_head, n_layer_seen, fixed_cache), err=True)
    runs = []
    started = time.monotonic()
    for method in method_list:
        t0 = time.monotonic()
        report = ood_of_method(lambda: _make_llm(model, method, n + 1, base), tokens, settings)
        runs.append(OodRun(method, report, time.monotonic() - t0))
        cells = ", ".join(f"{f} {exit_cell(report, f)}" for f in FACTORS)
        click.echo(f"farctx: {method:<12} ({runs[-1].seconds:.0f} s): {cells}", err=True)
    elapsed = time.monotonic() - started
    protocol = PROTOCOL.format(n=n, bucket=settings.bucket, measured="; ".join(runs[0].report.measured),
                               tolerance=tolerance, threshold=threshold, persist=persist)
    payload = {"model": info.path, "n_ctx_train": n_train, "protocol": protocol, "source": source,
               "lengths": length_list, "flash_attn": "off", "seconds": round(elapsed, 1),
               "runs": [r.as_dict() for r in runs]}
    if json_path != "-":
        click.echo(f"protocol: {protocol}")
        click.echo(f"document: {source}, first {n} tokens; model n_ctx_train {n_train}; layers "
                   f"{'all' if layer_list is None else layer_list}; {elapsed:.0f} s")
        click.echo("first position past n_ctx_train where each factor leaves its in-context range (layer, side):")
        click.echo(f"| {'method':<12} | " + " | ".join(f"{f:<18}" for f in FACTORS) + " |")
        click.echo("|" + "-" * 14 + "|" + "|".join("-" * 20 for _ in FACTORS) + "|")
        for run in runs:
            click.echo(f"| {run.method:<12} | " + " | ".join(f"{exit_cell(run.report, f):<18}" for f in FACTORS) + " |")
        click.echo("values at each length (bucket ending there; logit and max entropy: max over layers, "
                   "the others: mean over layers):")
        click.echo(f"| {'method':<12} | {'length':>7} | " + " | ".join(f"{f:>12}" for f in FACTORS) + " |")
        for run in runs:
            for length in length_list:
                vals = [value_at(run.report, f, length) for f in FACTORS]
                click.echo(f"| {run.method:<12} | {length:>7} | "
                           + " | ".join(f"{'-' if v is None else format(v, '.4g'):>12}" for v in vals) + " |")
    _write_outputs(payload, json_path, lambda p: plot_ood(runs, n_train, p, Path(info.path).name), plot_path)
    sys.stdout.flush()
