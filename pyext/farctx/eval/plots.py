"""PNG plots of the evaluations (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..errors import FarctxError


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise FarctxError("plots need matplotlib: pip install 'farctx[eval]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ppl(results: Sequence[Any], n_ctx_train: int, path: Path, title: str = "") -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for method in dict.fromkeys(r.method for r in results):
        rows = sorted((r.length, r.ppl) for r in results if r.method == method)
        ax.plot([x for x, _ in rows], [y for _, y in rows], marker="o", label=method)
    ax.axvline(n_ctx_train, color="grey", linestyle="--", label=f"n_ctx_train = {n_ctx_train}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("position in the document (tokens)")
    ax.set_ylabel("perplexity")
    ax.set_title(title or "perplexity against length")
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_passkey(results: Sequence[Any], n_ctx_train: int, path: Path, title: str = "") -> None:
    plt = _pyplot()
    methods = list(dict.fromkeys(r.method for r in results))
    depths = sorted({r.depth for r in results if r.depth is not None})
    if not depths:
        fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
        for method in methods:
            rows = sorted((r.length, r.accuracy) for r in results if r.method == method)
            ax.plot([x for x, _ in rows], [y for _, y in rows], marker="o", label=method)
        ax.axvline(n_ctx_train, color="grey", linestyle="--", label=f"n_ctx_train = {n_ctx_train}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("passkey accuracy")
        ax.legend()
        ax.grid(True, alpha=0.3)
    else:  # a depth x length heat map per method
        lengths = sorted({r.length for r in results})
        fig, axes = plt.subplots(1, len(methods), figsize=(4 * len(methods) + 1, 4), dpi=100, squeeze=False)
        for ax, method in zip(axes[0], methods):
            grid = [[next((r.accuracy for r in results if r.method == method and r.length == x and r.depth == d),
                          float("nan")) for x in lengths] for d in depths]
            im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
            ax.set_xticks(range(len(lengths)), [str(x) for x in lengths], rotation=45)
            ax.set_yticks(range(len(depths)), [f"{d:.2f}" for d in depths])
            ax.set_xlabel("length")
            ax.set_ylabel("depth")
            ax.set_title(method)
        fig.colorbar(im, ax=axes[0].tolist())
    fig.suptitle(title or "passkey retrieval")
    fig.savefig(path)
    plt.close(fig)


def plot_ood(runs: Sequence[Any], n_ctx_train: int, path: Path, title: str = "") -> None:
    """LM-Infinite's Figure 1 style: one panel per factor, position on x, one line per method."""
    from .ood_recorder import FACTOR_LABELS, FACTORS

    plt = _pyplot()
    fig, axes = plt.subplots(1, len(FACTORS), figsize=(4.2 * len(FACTORS), 4), dpi=100, squeeze=False)
    for ax, factor in zip(axes[0], FACTORS):
        for run in runs:
            report = run.report
            half = report.settings.bucket / 2
            points = [(x + half, y) for x, y in zip(report.buckets, report.summary(factor)) if y is not None]
            if points:
                ax.plot([x for x, _ in points], [y for _, y in points], label=run.method)
        ax.axvline(n_ctx_train, color="grey", linestyle="--", label=f"n_ctx_train = {n_ctx_train}")
        if factor == "hidden_out" and runs:
            ax.axhline(runs[0].report.settings.threshold, color="black", linestyle=":", label="threshold")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("position (tokens)")
        reduce = "max" if factor in ("logit_max", "entropy_max") else "mean"
        ax.set_title(f"{FACTOR_LABELS[factor]}\n({reduce} over layers)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title or "out-of-distribution factors against position")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
