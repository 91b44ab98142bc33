"""farctx bench: speed and memory per method and length, with stock llama.cpp in the same run."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Optional

import click

from .eval_cmd import parse_lengths, parse_methods
from .options import method_options, runtime, runtime_options

# the runtime options a benchmark sets (the table's flags and defaults); the cache is each measurement's own
BENCH_OPTIONS = ("n_ubatch", "n_threads", "flash_attn", "type_k", "n_gpu_layers", "rpc_servers")


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            names = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        if names:
            cpu = names[0]
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


@click.command()
@click.option("-m", "--model", "model", default=None, metavar="FNAME", help="GGUF model (default: the bundled one)")
@click.option("--methods", "--method", "methods", default="auto,lminf", show_default=True,
              help="comma-separated methods, or all")
@click.option("--lengths", default="512,1k", show_default=True, help="context lengths (k = 1024)")
@click.option("--reps", type=click.IntRange(1), default=3, show_default=True, help="repetitions (medians)")
@click.option("-n", "--n-gen", type=click.IntRange(1), default=16, show_default=True, help="decoded tokens per run")
@click.option("--stock-max", type=int, default=1 << 30, help="longest length to run stock llama.cpp at")
@runtime_options(only=BENCH_OPTIONS)
@click.option("--json", "json_path", default=None, metavar="FILE")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png")
@method_options(with_method=False)
def bench(model: Optional[str], methods: str, lengths: str, reps: int, n_gen: int, stock_max: int,
          json_path: Optional[str], plot_path: Optional[str], **opts: Any) -> None:
    """Prefill and decode tokens/s, KV bytes and RSS per method and length, as ratios to stock."""
    import farctx
    from farctx.bench.harness import bench as run_bench
    from farctx.bench.harness import markdown_table, plot_bench, scaling, scaling_table, vanilla_table

    path = str(farctx.model_info(model).path)
    info = farctx.model_info(path)
    from farctx._native import native

    options = runtime(opts)  # the runtime options table's flags and defaults, as every command's
    # The one difference, and why: stock llama.cpp and farctx must read the prompt in the same batches, so the
    # ubatch is set (the plan's default when -ub is not given) and -b is the ubatch, for both
    ubatch = options.n_ubatch or native().lib.FARCTX_N_UBATCH_DEFAULT
    kwargs: dict[str, Any] = {"flash_attn": options.flash_attn, "n_gpu_layers": options.n_gpu_layers,
                              **options.kwargs(), "n_batch": ubatch, "n_ubatch": ubatch}
    if options.rpc_servers:  # stock llama.cpp too, on the same servers
        kwargs["rpc_servers"] = ",".join(options.rpc_servers)

    def show(who: str, length: int, rep: int, s: dict[str, Any]) -> None:
        click.echo(f"farctx bench: rep {rep + 1}/{reps} {who:<12} {length:>7}: prefill {s['prefill_tps']:.1f} tok/s, "
                   f"decode {s['decode_tps']:.1f} tok/s", err=True)

    # the methods' parameters (--n-ctx-train, --n-local, ...) go to farctx only, never to stock
    params = {k: v for k, v in opts.items() if v is not None}
    results = run_bench(path, parse_methods(methods), sorted(set(parse_lengths(lengths))), reps, n_gen, kwargs,
                        stock_max, on_sample=show, method_kwargs=params)
    desc = machine()
    click.echo(f"model {Path(path).name} (n_ctx_train {info.n_ctx_train}); {desc}; medians of {reps}; "
               f"ratios against stock llama.cpp (vanilla, same pinned source, no patches) in the same run")
    click.echo(markdown_table(results))
    if vanilla_table(results):
        click.echo("\nagainst vanilla (farctx, the same cache), medians of the ratios of each round")
        click.echo(vanilla_table(results))
    if len(set(r.length for r in results)) > 1:
        click.echo("\nscaling with length (least-squares exponent over the lengths run)")
        click.echo(scaling_table(results))
    if json_path:
        payload = {"model": path, "n_ctx_train": info.n_ctx_train, "machine": desc,
                   "settings": {"reps": reps, "n_gen": n_gen, **kwargs, **params},
                   "results": [r.as_dict() for r in results], "scaling": scaling(results)}
        Path(json_path).write_text(json.dumps(payload, indent=1) + "\n")
    if plot_path:
        plot_bench(results, Path(plot_path), Path(path).name)
