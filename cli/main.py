"""farctx command line: generate, info (one click group, llama.cpp's flag names)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from .options import llama_kwargs, method_options, model_option, runtime_options


def _fail(message: str, code: int) -> None:
    click.echo(f"farctx: error: {message}", err=True)
    sys.exit(code)


class FarctxGroup(click.Group):
    """Every error as one line on stderr: usage errors exit 2, failed runs 1 (no traceback)."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        from farctx.errors import FarctxError

        kwargs["standalone_mode"] = False
        try:
            result = super().main(*args, **kwargs)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            _fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            _fail("aborted", 1)
        except (FarctxError, ValueError, RuntimeError, OSError) as exc:
            _fail(str(exc), 1)
        if isinstance(result, int):  # standalone_mode=False returns the exit code of --help and co.
            sys.exit(result)
        return result


@click.group(cls=FarctxGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="farctx")
def main() -> None:
    """Run GGUF language models past their trained context (LM-Infinite, Mesa-Extrapolation, baselines)."""


def _read_prompt(prompt: str | None, file: str | None) -> str:
    if prompt is not None and file is not None:
        raise click.UsageError("give the prompt with -p or -f, not both")
    if file is not None:
        if file == "-":
            return sys.stdin.read()
        path = Path(file)
        if not path.is_file():
            raise click.BadParameter(f"no such file: {file}", param_hint="-f")
        return path.read_text(encoding="utf-8", errors="replace")
    if prompt is None:
        raise click.UsageError("no prompt: give -p TEXT or -f FILE (- for stdin)")
    return prompt


def _count_tokens(model: str | None, text: str) -> int:
    """Tokens of the prompt, from a vocabulary-only load of the model."""
    import farctx
    from farctx.models import resolve_model_path
    from farctx._native import llama_log
    from farctx.stream import open_tokenizer

    LOG = llama_log()

    farctx.model_info(model)  # a clear error for a bad file before llama.cpp opens it
    path = resolve_model_path(model)
    LOG.clear()
    try:
        vocab = open_tokenizer(path)
    except ValueError as exc:  # the reason from llama.cpp's log, as farctx.Llama gives it
        raise farctx.FarctxError(f"llama.cpp could not load {path}: {LOG.reason() or exc}") from None
    try:
        return len(vocab.tokenize(text.encode("utf-8")))
    finally:
        vocab.close()


@main.command()
@model_option()
@click.option("-p", "--prompt", default=None, help="prompt text")
@click.option("-f", "--file", default=None, metavar="FNAME", help="read the prompt from a file (- for stdin)")
@click.option("-n", "--n-predict", "n_predict", type=click.IntRange(0), default=128, show_default=True,
              help="tokens to generate")
@click.option("--temp", type=click.FloatRange(0.0), default=0.8, show_default=True, help="temperature (0: greedy)")
@click.option("--seed", type=int, default=-1, show_default=True, help="sampling seed (-1: random)")
@click.option("--top-k", type=int, default=40, show_default=True)
@click.option("--top-p", type=float, default=0.95, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of streaming text")
@click.option("--ood-report", is_flag=True,
              help="record the out-of-distribution factors on a sample of layers (flash attention off) and end "
                   "with one line: inside the trained distribution, or where it left it")
@runtime_options()
@method_options()
def generate(model: str | None, prompt: str | None, file: str | None, n_predict: int, temp: float, seed: int,
             top_k: int, top_p: float, as_json: bool, ood_report: bool, **opts: Any) -> None:
    """Generate text from a prompt."""
    import farctx
    from farctx.progress import Progress

    from farctx.methods import fixed_cache

    text = _read_prompt(prompt, file)
    if ood_report and opts.get("flash_attn") == "on":
        click.echo("farctx: --ood-report turns flash attention off (the attention scores exist only without it)",
                   err=True)
    if ood_report:
        opts["flash_attn"] = "off"
    kwargs = llama_kwargs(opts)
    if seed >= 0:
        kwargs["seed"] = seed
    if kwargs["n_ctx"] == 0 and not fixed_cache(kwargs["method"]):
        # the methods that keep the whole stream (vanilla too): the plan's cache for the prompt plus the generation
        kwargs.update(n_prompt=_count_tokens(model, text), n_predict=n_predict)
    recorder = None
    if ood_report:
        from farctx.eval.ood_recorder import OodRecorder, sampled_layers, settings_for
        from farctx.eval.tensor_probe import eval_callback_installed

        details = farctx.model_info(model)
        recorder = OodRecorder(settings_for(details.n_ctx_train, sampled_layers(details.n_layer)))
        with eval_callback_installed(recorder):
            llm = farctx.Llama(model, progress=Progress("prefill", min_total=1024), **kwargs)
    else:  # no callback installed: the graph runs as it always does
        llm = farctx.Llama(model, progress=Progress("prefill", min_total=1024), **kwargs)
    if not as_json:
        click.echo(f"farctx: {llm.method_params.describe()}, cache {llm.n_ctx()} cells", err=True)
    started = time.monotonic()
    stream = llm.create_completion(text, max_tokens=n_predict, temperature=temp, top_k=top_k, top_p=top_p,
                                   seed=seed if seed >= 0 else None, stream=True)
    pieces = []
    finish_reason = None
    for chunk in stream:
        choice = chunk["choices"][0]
        pieces.append(choice["text"])
        finish_reason = choice.get("finish_reason") or finish_reason
        if not as_json:
            click.echo(choice["text"], nl=False)
            sys.stdout.flush()
    if as_json:
        result = {
            "model": llm.model_path,
            "method": llm.method_params.as_dict(),
            "prompt_tokens": len(llm.tokenize(text.encode("utf-8"))),
            "text": "".join(pieces),
            "finish_reason": finish_reason,
            "seconds": round(time.monotonic() - started, 3),
            "stats": llm.stats(),
        }
        if recorder is not None:
            result["ood"] = {"verdict": recorder.verdict(), **recorder.report().as_dict()}
        click.echo(json.dumps(result))
    else:
        click.echo()
        if recorder is not None:
            click.echo(f"farctx: ood: {recorder.verdict()}", err=True)


@main.command()
@model_option()
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def info(model: str | None, as_json: bool) -> None:
    """Architecture, trained context, RoPE, sliding window, and the methods the model supports."""
    import farctx

    from farctx.backends import backends, devices

    details = farctx.model_info(model)
    details.methods = farctx.method_support(details)
    build = {"version": farctx.__version__, "backends": backends(), "devices": [d.as_dict() for d in devices()]}
    if as_json:
        click.echo(json.dumps({**details.as_dict(), "build": build}))
        return
    rows = [
        ("model", details.path),
        ("name", details.name),
        ("architecture", details.architecture),
        ("n_ctx_train", details.n_ctx_train),
        ("layers", details.n_layer),
        ("embedding", details.n_embd),
        ("heads (q/kv)", f"{details.n_head}/{details.n_head_kv}"),
        ("rope freq_base", details.rope_freq_base),
        ("rope scaling", details.rope_scaling or "none"),
        ("sliding window", details.sliding_window or "none"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        click.echo(f"{key:<{width}}  {value}")
    click.echo(f"{'backends':<{width}}  {', '.join(build['backends'])}")
    click.echo(f"{'devices':<{width}}  {', '.join(d['name'] for d in build['devices']) or 'none'}")
    click.echo("methods:")
    from farctx.methods import method_infos

    infos = method_infos()
    for method, support in details.methods.items():
        if support == "yes" and infos[method].stock_inside and not infos[method].stock_graph:  # what auto does here
            support = f"yes: {infos[method].help} ({details.n_ctx_train} tokens)"
        click.echo(f"  {method:<12} {support}")


from .bench_cmd import bench  # noqa: E402
from .eval_cmd import eval_group  # noqa: E402
from .chat_cmd import chat  # noqa: E402
from .rpc_cmd import rpc_server  # noqa: E402
from .serve_cmd import serve  # noqa: E402

main.add_command(eval_group)
main.add_command(bench)
main.add_command(serve)
main.add_command(chat)
main.add_command(rpc_server)


if __name__ == "__main__":
    main()
