"""farctx bench: speed and memory per method and length, with stock llama.cpp in the same run."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any, Optional

import click

from .eval_cmd import parse_lengths, parse_methods
from .options import KV_TYPES, method_options, rpc_option


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
@click.option("-t", "--threads", "n_threads", type=int, default=None)
@click.option("-ngl", "--gpu-layers", "n_gpu_layers", default="0")
@click.option("-fa", "--flash-attn", "flash_attn", type=click.Choice(["on", "off"]), default="off")
@click.option("-ctk", "--cache-type-k", "cache_type_k", type=click.Choice(sorted(KV_TYPES)), default="f16")
@click.option("-ub", "--ubatch-size", "n_ubatch", type=click.IntRange(1), default=512)
@rpc_option()
@click.option("--json", "json_path", default=None, metavar="FILE")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png")
@method_options(with_method=False)
def bench(model: Optional[str], methods: str, lengths: str, reps: int, n_gen: int, stock_max: int,
          n_threads: Optional[int], n_gpu_layers: str, flash_attn: str, cache_type_k: str, n_ubatch: int,
          rpc: Optional[str], json_path: Optional[str], plot_path: Optional[str], **method_opts: Any) -> None:
    """Prefill and decode tokens/s, KV bytes and RSS per method and length, as ratios to stock."""
    import farctx
    from farctx.bench.harness import bench as run_bench
    from farctx.bench.harness import markdown_table, plot_bench, scaling, scaling_table, vanilla_table

    path = str(farctx.model_info(model).path)
    info = farctx.model_info(path)
    kwargs: dict[str, Any] = {
        "n_gpu_layers": -1 if n_gpu_layers == "all" else int(n_gpu_layers),
        "flash_attn": flash_attn == "on",
        "type_k": KV_TYPES[cache_type_k],
        "n_batch": n_ubatch,
        "n_ubatch": n_ubatch,
    }
    if n_threads:
        kwargs.update(n_threads=n_threads, n_threads_batch=n_threads)
    if rpc:  # stock llama.cpp too, on the same servers
        kwargs["rpc_servers"] = rpc

    def show(who: str, length: int, rep: int, s: dict[str, Any]) -> None:
        click.echo(f"farctx bench: rep {rep + 1}/{reps} {who:<12} {length:>7}: prefill {s['prefill_tps']:.1f} tok/s, "
                   f"decode {s['decode_tps']:.1f} tok/s", err=True)

    # the methods' parameters (--n-ctx-train, --n-local, ...) go to farctx only, never to stock
    params = {k: v for k, v in method_opts.items() if v is not None}
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
