"""`farctx bench`: speed and memory per method and length, each figure next to stock llama.cpp
(the same pinned source without farctx's patches) measured in the same run, interleaved."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .. import _paths
from ..errors import FarctxError


@dataclass
class BenchResult:
    method: str
    length: int
    prefill_tps: float
    decode_tps: Optional[float]
    kv_bytes: Optional[int]
    rss_bytes: int
    stock_prefill_tps: Optional[float]
    stock_decode_tps: Optional[float]
    # with vanilla among the methods: the median over rounds of this method's figure over vanilla's in the same
    # round (paired, so that a machine that speeds up or slows down between rounds moves both)
    vs_vanilla_prefill: Optional[float] = None
    vs_vanilla_decode: Optional[float] = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def ratio(self, what: str) -> Optional[float]:
        ours, stock = getattr(self, f"{what}_tps"), getattr(self, f"stock_{what}_tps")
        return ours / stock if ours and stock else None


def stock_lib_dir() -> Path:
    """Stock llama.cpp built from the same source: FARCTX_STOCK_LIB_DIR, or a checkout's build/cmake-stock,
    which the first caller in a checkout builds (once, scripts/build.sh with FARCTX_STOCK=1)."""
    checkout = Path(__file__).resolve().parents[3]  # meaningful in a checkout (editable install) only
    override = os.environ.get("FARCTX_STOCK_LIB_DIR")
    folder = Path(override) if override else checkout / "build" / "cmake-stock" / "bin"
    build = checkout / "scripts" / "build.sh"
    if not _has_libllama(folder) and not override and build.is_file():
        print("farctx: building stock llama.cpp from the pinned source into build/cmake-stock (the baseline that "
              "benchmarks compare with; once, about 4 minutes on 2 cores)", file=sys.stderr, flush=True)
        bin_dir = str(Path(sys.executable).parent)
        env = dict(os.environ, FARCTX_STOCK="1", PYTHON=sys.executable,
                   PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
        if subprocess.run(["bash", str(build)], env=env, stdout=sys.stderr).returncode != 0:
            raise FarctxError("building stock llama.cpp failed (messages above): FARCTX_STOCK=1 scripts/build.sh")
    if not _has_libllama(folder):
        raise FarctxError(f"stock llama.cpp not built in {folder}: run FARCTX_STOCK=1 scripts/build.sh "
                          "(or set FARCTX_STOCK_LIB_DIR)")
    return folder


def _has_libllama(folder: Path) -> bool:
    return (folder / "libllama.so").exists() or (folder / "libllama.dylib").exists()


def median(values: Sequence[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def paired_ratio(samples: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]], key: str) -> Optional[float]:
    """The median over rounds of samples[r][key] / base[r][key] (rounds where both are known)."""
    return median([s[key] / b[key] if s.get(key) and b.get(key) else None for s, b in zip(samples, base)])


def run_worker(model: str, method: str, length: int, n_gen: int, kwargs: dict[str, Any],
               stock: bool, method_kwargs: Optional[dict[str, Any]] = None) -> Optional[dict[str, Any]]:
    env = dict(os.environ)
    if not stock and method_kwargs:
        kwargs = {**kwargs, **method_kwargs}
    cmd = [sys.executable, "-m", "farctx.bench.worker", "--model", model, "--method", method,
           "--length", str(length), "--n-gen", str(n_gen), "--kwargs", json.dumps(kwargs)]
    if stock:
        env["LLAMA_CPP_LIB_PATH"] = str(stock_lib_dir())
        cmd.append("--stock")
    else:
        env["LLAMA_CPP_LIB_PATH"] = str(_paths.lib_dir())
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        if stock:
            return None  # stock cannot run this length (memory, ...): reported as null
        lines = proc.stderr.strip().splitlines()
        raise FarctxError(f"benchmark of {method} at {length} failed: {lines[-1] if lines else proc.returncode}")
    return json.loads(proc.stdout)


def bench(model: str, methods: Sequence[str], lengths: Sequence[int], reps: int, n_gen: int,
          kwargs: dict[str, Any], stock_max: int,
          on_sample: Callable[[str, int, int, dict[str, Any]], None] | None = None,
          method_kwargs: Optional[dict[str, Any]] = None) -> list[BenchResult]:
    """Medians over `reps` rounds; every round runs, per length, stock then each method (interleaved)."""
    ours: dict[tuple[str, int], list[dict[str, Any]]] = {(m, x): [] for m in methods for x in lengths}
    stock: dict[int, list[Optional[dict[str, Any]]]] = {x: [] for x in lengths}
    for rep in range(reps):
        for length in lengths:
            if length <= stock_max:
                sample = run_worker(model, "vanilla", length, n_gen, kwargs, stock=True)
                stock[length].append(sample)
                if on_sample and sample:
                    on_sample("stock", length, rep, sample)
            for method in methods:
                sample = run_worker(model, method, length, n_gen, kwargs, stock=False, method_kwargs=method_kwargs)
                assert sample is not None
                ours[(method, length)].append(sample)
                if on_sample:
                    on_sample(method, length, rep, sample)
    results = []
    for method in methods:
        for length in lengths:
            samples = ours[(method, length)]
            base = [s for s in stock[length] if s]
            vanilla = ours.get(("vanilla", length))
            results.append(BenchResult(
                method=method, length=length,
                prefill_tps=median([s["prefill_tps"] for s in samples]) or 0.0,
                decode_tps=median([s["decode_tps"] for s in samples]),
                kv_bytes=samples[-1]["kv_bytes"],
                rss_bytes=max(s["rss_bytes"] for s in samples),
                stock_prefill_tps=median([s["prefill_tps"] for s in base]),
                stock_decode_tps=median([s["decode_tps"] for s in base]),
                vs_vanilla_prefill=paired_ratio(samples, vanilla, "prefill_tps") if vanilla else None,
                vs_vanilla_decode=paired_ratio(samples, vanilla, "decode_tps") if vanilla else None,
            ))
    return results


def scaling(results: Sequence[BenchResult]) -> dict[str, dict[str, Optional[float]]]:
    """Per method, the least-squares exponent a of cost ~ length^a over the lengths run: prefill time
    (length / prefill_tps: 1 = linear, 2 = quadratic) and time per decoded token (0 = constant)."""
    import math

    def slope(points: list[tuple[float, float]]) -> Optional[float]:
        if len(points) < 2:
            return None
        xs, ys = [math.log(x) for x, _ in points], [math.log(y) for _, y in points]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else None

    out: dict[str, dict[str, Optional[float]]] = {}
    for method in dict.fromkeys(r.method for r in results):
        rows = [r for r in results if r.method == method]
        out[method] = {
            "prefill_time": slope([(r.length, r.length / r.prefill_tps) for r in rows if r.prefill_tps]),
            "decode_time_per_token": slope([(r.length, 1.0 / r.decode_tps) for r in rows if r.decode_tps]),
        }
    return out


def scaling_table(results: Sequence[BenchResult]) -> str:
    rows = [f"| {m} | {_fmt(e['prefill_time'], '.2f')} | {_fmt(e['decode_time_per_token'], '.2f')} |"
            for m, e in scaling(results).items()]
    return "\n".join(["| method | prefill time ~ n^a | decode time per token ~ n^a |", "|---|---:|---:|", *rows])


def _fmt(x: Optional[float], spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def markdown_table(results: Sequence[BenchResult]) -> str:
    head = ("| method | length | prefill tok/s | vs stock | decode tok/s | vs stock | KV MiB | RSS MiB |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = [
        f"| {r.method} | {r.length} | {_fmt(r.prefill_tps)} | {_fmt(r.ratio('prefill'), '.3f')} | "
        f"{_fmt(r.decode_tps)} | {_fmt(r.ratio('decode'), '.3f')} | "
        f"{_fmt(r.kv_bytes / 2**20 if r.kv_bytes is not None else None)} | {r.rss_bytes / 2**20:.0f} |"
        for r in results
    ]
    return "\n".join([head, *rows])


def vanilla_table(results: Sequence[BenchResult]) -> str:
    """Each method against vanilla (farctx's, same cache) in the same rounds; empty without vanilla."""
    rows = [f"| {r.method} | {r.length} | {_fmt(r.vs_vanilla_prefill, '.3f')} | {_fmt(r.vs_vanilla_decode, '.3f')} |"
            for r in results if r.vs_vanilla_prefill is not None and r.method != "vanilla"]
    if not rows:
        return ""
    return "\n".join(["| method | length | prefill vs vanilla | decode vs vanilla |", "|---|---:|---:|---:|", *rows])


def plot_bench(results: Sequence[BenchResult], path: Path, title: str = "") -> None:
    from ..eval.plots import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), dpi=100)
    methods = list(dict.fromkeys(r.method for r in results))
    for what, ax in zip(("prefill", "decode"), axes[:2]):
        for method in methods:
            rows = sorted((r.length, getattr(r, f"{what}_tps")) for r in results if r.method == method)
            ax.plot([x for x, _ in rows], [y for _, y in rows], marker="o", label=method)
        stock = sorted({(r.length, getattr(r, f"stock_{what}_tps")) for r in results
                        if getattr(r, f"stock_{what}_tps") is not None})
        if stock:
            ax.plot([x for x, _ in stock], [y for _, y in stock], "k--", marker="x", label="stock llama.cpp")
        ax.set_title(f"{what} tokens/s")
    for method in methods:
        rows = sorted((r.length, (r.kv_bytes or 0) / 2**20) for r in results if r.method == method)
        axes[2].plot([x for x, _ in rows], [y for _, y in rows], marker="o", label=method)
    axes[2].set_title("KV cache (MiB)")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "farctx bench")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
