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


def plot_niah(cells: Sequence[Any], n_ctx_train: int, path: Path, effective: dict[str, Any] | None = None,
              title: str = "", methods: Sequence[str] | None = None, lengths: Sequence[int] | None = None) -> None:
    """The needle-in-a-haystack heat map, one panel per method: length across, depth down, accuracy as colour, each
    cell's right/samples written in it (grey: not run), the trained context marked; a random-depth grid is a line per
    method. `methods` and `lengths`: the grid's, in order (default: those of the cells)."""
    import math

    plt = _pyplot()
    methods = list(methods or dict.fromkeys(c.method for c in cells))
    lengths = sorted(set(lengths or ()) | {c.length for c in cells})
    depths = sorted({c.depth for c in cells if c.depth is not None})
    if not depths:
        fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
        for method in methods:
            rows = sorted((c.length, c.accuracy) for c in cells if c.method == method)
            ax.plot([x for x, _ in rows], [y for _, y in rows], marker="o", label=method)
        ax.axvline(n_ctx_train, color="grey", linestyle="--", label=f"n_ctx_train = {n_ctx_train}")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("length (tokens)")
        ax.set_ylabel("accuracy")
        ax.legend()
        ax.grid(True, alpha=0.3)
    else:
        cmap = plt.get_cmap("RdYlGn").copy()
        cmap.set_bad("#dddddd")
        fig, axes = plt.subplots(1, len(methods), figsize=(1.1 * len(lengths) * len(methods) + 2.5, 0.55 * len(depths) + 2.2),
                                 dpi=100, squeeze=False)
        im = None
        for ax, method in zip(axes[0], methods):
            by = {(c.length, c.depth): c for c in cells if c.method == method}
            grid = [[by[(x, d)].accuracy if (x, d) in by else math.nan for x in lengths] for d in depths]
            im = ax.imshow(grid, vmin=0, vmax=1, cmap=cmap, aspect="auto")
            for i, d in enumerate(depths):
                for j, x in enumerate(lengths):
                    if (x, d) in by:
                        ax.text(j, i, f"{by[(x, d)].correct}/{by[(x, d)].n}", ha="center", va="center", fontsize=8)
            inside = sum(1 for x in lengths if x <= n_ctx_train)
            if 0 < inside < len(lengths):
                ax.axvline(inside - 0.5, color="black", linewidth=2)
            ax.set_xticks(range(len(lengths)), [f"{x // 1024}k" if x % 1024 == 0 else str(x) for x in lengths])
            ax.set_yticks(range(len(depths)), [f"{100 * d:.0f}%" for d in depths])
            ax.set_xlabel("length (tokens); | = trained context")
            if ax is axes[0][0]:
                ax.set_ylabel("needle depth")
            e = (effective or {}).get(method)
            note = "" if e is None else f"\neffective length {e.length if e.length is not None else '-'}"
            ax.set_title(method + note, fontsize=10)
        fig.colorbar(im, ax=axes[0].tolist(), label="accuracy")
    fig.suptitle(title or "needle in a haystack", fontsize=10, y=1.04 if depths else 0.98)
    fig.savefig(path, bbox_inches="tight")
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
