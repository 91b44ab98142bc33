"""The out-of-distribution factors of LM-Infinite and Mesa-Extrapolation, read from llama.cpp's graph.

Per layer and per position bucket, from the tensors of the attention graph (flash attention off):

- `logit_max`: each query's largest attention logit over heads and visible keys, after the query
  scale and before the softmax, averaged over the bucket's queries: the K.Q product (`kq-<il>`, or
  the concatenation of both segments' products under a farctx method) times the softmax's scale,
  masked entries (-inf in the mask) left out.
- `entropy_mean`, `entropy_max`: the entropy of each head's attention distribution (the softmax
  output, `kq_soft_max-<il>` / `kq_soft_max_extrap-<il>`), mean and max over heads, averaged over
  the bucket's queries.
- `hidden_out`: for each layer's output (`l_out-<il>`), the fraction of hidden dimensions outside
  the [min, max] range the same layer showed over the tokens inside n_ctx_train of the same run
  (Mesa-Extrapolation's acceptable range), averaged over the bucket's tokens.

A factor leaves the in-context range where it stays out of it: the first bucket of the first run of
`persist` consecutive buckets past n_ctx_train in which some layer's value is outside
[lo - m, hi + m] (lo and hi: the smallest and largest value of that layer over the buckets inside
n_ctx_train, m = tolerance x (hi - lo)); for `hidden_out` outside [0, threshold]. A single bucket
outside is not enough: the reference is a handful of buckets of one document, and the text alone
moves a bucket's value past it now and then. The first single token whose hidden_out passes the
threshold is reported too (`hidden_first_token`). A reference range from n tokens leaves each
dimension of an in-distribution token outside it with probability about 2 / (n + 1): with
n_ctx_train = 256 that floor is 0.8%, below the default threshold of 2%.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import numpy as np

from .tensor_probe import Probe, Tensor

FACTORS = ("logit_max", "entropy_mean", "entropy_max", "hidden_out")
FACTOR_LABELS = {
    "logit_max": "max attention logit",
    "entropy_mean": "attention entropy (mean over heads)",
    "entropy_max": "attention entropy (max over heads)",
    "hidden_out": "hidden dims outside the in-context range",
}

_LAYER = re.compile(r"^(kq|kq_soft_max|kq_soft_max_extrap|kq_scaled_2|kq_plus_kq_b|l_out)-(\d+)$")
_SOFTMAX = ("kq_soft_max", "kq_soft_max_extrap")
_PRE_SOFTMAX = ("kq", "kq_scaled_2", "kq_plus_kq_b")  # the tensors a softmax can read (stock graph)


@dataclass
class OodSettings:
    n_ctx_train: int
    bucket: int
    layers: Optional[list[int]] = None  # None: every layer
    threshold: float = 0.02  # hidden_out: the fraction of dimensions that counts as leaving
    tolerance: float = 0.25  # the other factors: the margin, as a fraction of the in-context spread
    persist: int = 4  # consecutive buckets outside that count as leaving


@dataclass
class Exit:
    """Where a factor first left its in-context range."""

    position: int
    layer: int
    direction: str  # "above" / "below"
    value: float
    reference: tuple[float, float]

    def describe(self) -> str:
        return f"{self.position} (L{self.layer} {self.direction})"


@dataclass
class OodReport:
    settings: OodSettings
    n_tokens: int
    buckets: list[int]  # the first position of each bucket
    series: dict[str, dict[int, list[Optional[float]]]]  # factor -> layer -> value per bucket
    references: dict[str, dict[int, tuple[float, float]]]  # factor -> layer -> (lo, hi) inside n_ctx_train
    exits: dict[str, Optional[Exit]]
    hidden_first_token: Optional[Exit] = None
    measured: list[str] = field(default_factory=list)  # what was read, in words

    def as_dict(self) -> dict[str, Any]:
        def clean(v: Optional[float]) -> Optional[float]:
            return None if v is None or not math.isfinite(v) else round(float(v), 6)

        return {
            "settings": asdict(self.settings),
            "n_tokens": self.n_tokens,
            "buckets": self.buckets,
            "series": {f: {str(layer): [clean(v) for v in vals] for layer, vals in per.items()}
                       for f, per in self.series.items()},
            "references": {f: {str(layer): [clean(lo), clean(hi)] for layer, (lo, hi) in per.items()}
                           for f, per in self.references.items()},
            "exits": {f: (None if e is None else {**asdict(e), "reference": [clean(x) for x in e.reference]})
                      for f, e in self.exits.items()},
            "hidden_first_token": None if self.hidden_first_token is None else asdict(self.hidden_first_token),
            "measured": self.measured,
        }

    def summary(self, factor: str) -> list[Optional[float]]:
        """One line per factor for the plot: max over layers (logits, max entropy), mean over layers (the others)."""
        per = self.series[factor]
        out: list[Optional[float]] = []
        for b in range(len(self.buckets)):
            vals = [v[b] for v in per.values() if b < len(v) and v[b] is not None]
            if not vals:
                out.append(None)
            elif factor in ("logit_max", "entropy_max"):
                out.append(max(vals))
            else:
                out.append(sum(vals) / len(vals))
        return out


class _Accum:
    """Per-bucket sums (or maxima) of one factor in one layer."""

    def __init__(self, reduce_max: bool) -> None:
        self.reduce_max = reduce_max
        self.value = np.zeros(0)
        self.count = np.zeros(0, dtype=np.int64)

    def add(self, buckets: np.ndarray, values: np.ndarray) -> None:
        n = int(buckets.max()) + 1
        if n > len(self.value):
            grow = n - len(self.value)
            self.value = np.concatenate([self.value, np.full(grow, -np.inf if self.reduce_max else 0.0)])
            self.count = np.concatenate([self.count, np.zeros(grow, dtype=np.int64)])
        if self.reduce_max:
            np.maximum.at(self.value, buckets, values)
        else:
            np.add.at(self.value, buckets, values)
        np.add.at(self.count, buckets, 1)

    def per_bucket(self, n_buckets: int) -> list[Optional[float]]:
        out: list[Optional[float]] = []
        for b in range(n_buckets):
            if b >= len(self.count) or self.count[b] == 0:
                out.append(None)
            else:
                out.append(float(self.value[b] if self.reduce_max else self.value[b] / self.count[b]))
        return out


def sampled_layers(n_layer: int, k: int = 4) -> list[int]:
    """k layers evenly spread from the first to the last (all of them when there are fewer)."""
    if n_layer <= k:
        return list(range(n_layer))
    return sorted({round(i * (n_layer - 1) / (k - 1)) for i in range(k)})


def settings_for(n_ctx_train: int, layers: Optional[list[int]] = None) -> OodSettings:
    """The defaults: buckets of n_ctx_train / 8 positions."""
    return OodSettings(n_ctx_train=n_ctx_train, bucket=max(1, n_ctx_train // 8), layers=layers)


def _first_run_outside(values: list[Optional[float]], candidates: list[int], low: float, high: float,
                       persist: int) -> Optional[int]:
    """The first bucket of the first `persist` consecutive candidate buckets whose value is outside [low, high]
    (or all of them, when there are fewer than `persist`)."""
    run_start, run = None, 0
    for b in candidates:
        v = values[b]
        if v is not None and (v > high or v < low):
            if run == 0:
                run_start = b
            run += 1
            if run >= persist:
                return run_start
        else:
            run = 0
    return run_start if 0 < run == len(candidates) else None  # a stream too short for `persist`: all of it


class OodRecorder(Probe):
    """The evaluation callback that records the factors; install it with
    tensor_probe.eval_callback_installed around the farctx.Llama it observes, then feed tokens once,
    in order (positions are counted from the queries of layer 0's attention)."""

    def __init__(self, settings: OodSettings) -> None:
        super().__init__()
        self.settings = settings
        self.layers = None if settings.layers is None else set(settings.layers)
        self.n_tokens = 0  # positions seen so far (layer 0 counts them)
        self.pos0 = 0  # first position of the graph being computed
        self.n_graph = 0  # its number of query tokens
        self.kq: dict[int, np.ndarray] = {}  # pre-softmax products of this graph, by tensor address
        self.acc: dict[tuple[str, int], _Accum] = {}
        self.ref_lo: dict[int, np.ndarray] = {}
        self.ref_hi: dict[int, np.ndarray] = {}
        self.hidden_exit: Optional[Exit] = None
        self.hidden_skipped: set[int] = set()
        self.seen_kinds: set[str] = set()

    # -- which nodes ----------------------------------------------------------------------------

    def _layer(self, tensor: Tensor) -> tuple[str, int] | None:
        match = _LAYER.match(tensor.name)
        if match is None:
            return None
        return match.group(1), int(match.group(2))

    def _observed(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers

    def want(self, tensor: Tensor) -> bool:
        named = self._layer(tensor)
        if named is not None:
            kind, layer = named
            return (kind in _SOFTMAX and (layer == 0 or self._observed(layer))) or self._observed(layer)
        # both segments' K.Q products joined before one softmax (farctx's second key segment)
        if tensor.op == "CONCAT":
            a, b = tensor.src(0), tensor.src(1)
            return a is not None and b is not None and a.op == "MUL_MAT" and b.op == "MUL_MAT"
        return False

    def seen(self, tensor: Tensor) -> None:
        named = self._layer(tensor)
        if named is None:  # a concatenated K.Q product
            self._keep_kq(tensor)
            return
        kind, layer = named
        if kind in _PRE_SOFTMAX:
            self._keep_kq(tensor)
        elif kind in _SOFTMAX:
            if layer == 0:  # a new graph: its queries follow the ones before
                self.pos0 = self.n_tokens
                self.n_graph = tensor.ne[1]
                self.n_tokens += self.n_graph
            if self._observed(layer):
                self._attention(tensor, layer)
            if layer == 0:
                self.kq.clear()  # the products kept so far were layer 0's (or of layers not observed)
            self.kq.pop(tensor.t.src[0] or 0, None)
        elif kind == "l_out" and self._observed(layer):
            self._hidden(tensor, layer)

    def _keep_kq(self, tensor: Tensor) -> None:
        # the softmax runs in place on this buffer: keep a copy until it comes
        array = tensor.array()
        if array is not None:
            self.kq[tensor.address] = array

    # -- the factors ---------------------------------------------------------------------------

    def _positions(self, n: int) -> np.ndarray:
        return self.pos0 + np.arange(n)

    def _add(self, factor: str, layer: int, values: np.ndarray, reduce_max: bool = False) -> None:
        key = (factor, layer)
        if key not in self.acc:
            self.acc[key] = _Accum(reduce_max)
        buckets = self._positions(len(values)) // self.settings.bucket
        self.acc[key].add(buckets, values)

    def _attention(self, softmax: Tensor, layer: int) -> None:
        probs = softmax.array()  # (streams, heads, queries, keys)
        if probs is None:
            return
        n_q = probs.shape[2]
        with np.errstate(divide="ignore", invalid="ignore"):
            plogp = np.where(probs > 0, probs * np.log(np.where(probs > 0, probs, 1.0)), 0.0)
        entropy = -plogp.sum(axis=3)  # (streams, heads, queries)
        entropy = entropy.reshape(-1, n_q)
        self._add("entropy_mean", layer, entropy.mean(axis=0))
        self._add("entropy_max", layer, entropy.max(axis=0))
        self.seen_kinds.add("softmax")

        kq = self.kq.get(softmax.t.src[0] or 0)
        mask_t = softmax.src(1)
        if kq is None:
            return
        scale = softmax.op_param_f32(0)
        visible = np.ones((1, 1, n_q, kq.shape[3]), dtype=bool)
        if mask_t is not None:
            mask = mask_t.array()
            if mask is not None:
                visible = np.isfinite(mask[:, :, :n_q, : kq.shape[3]])
        logits = np.where(visible, kq * scale, -np.inf)
        self._add("logit_max", layer, logits.max(axis=3).reshape(-1, n_q).max(axis=0))
        self.seen_kinds.add("kq")

    def _hidden(self, out: Tensor, layer: int) -> None:
        h = out.array()
        if h is None:
            return
        h = h.reshape(-1, h.shape[-1])  # (tokens, n_embd)
        if h.shape[0] != self.n_graph:  # the last layer keeps only the rows of the requested outputs
            self.hidden_skipped.add(layer)
            return
        pos = self._positions(h.shape[0])
        inside = pos < self.settings.n_ctx_train
        if inside.any():
            lo, hi = h[inside].min(axis=0), h[inside].max(axis=0)
            if layer in self.ref_lo:
                lo, hi = np.minimum(lo, self.ref_lo[layer]), np.maximum(hi, self.ref_hi[layer])
            self.ref_lo[layer], self.ref_hi[layer] = lo, hi
        fraction = np.zeros(h.shape[0])
        if (~inside).any() and layer in self.ref_lo:
            rows = h[~inside]
            outside = (rows < self.ref_lo[layer]) | (rows > self.ref_hi[layer])
            fraction[~inside] = outside.mean(axis=1)
            over = np.nonzero(fraction > self.settings.threshold)[0]
            if len(over):
                first = int(pos[over[0]])
                if self.hidden_exit is None or first < self.hidden_exit.position:
                    self.hidden_exit = Exit(first, layer, "above", float(fraction[over[0]]),
                                            (0.0, self.settings.threshold))
        self._add("hidden_out", layer, fraction)
        self.seen_kinds.add("l_out")

    # -- the report ----------------------------------------------------------------------------

    def report(self) -> OodReport:
        self.check()
        s = self.settings
        n_buckets = max(1, math.ceil(self.n_tokens / s.bucket))
        buckets = [b * s.bucket for b in range(n_buckets)]
        inside = [b for b in range(n_buckets) if (b + 1) * s.bucket <= s.n_ctx_train]
        outside = [b for b in range(n_buckets) if b * s.bucket >= s.n_ctx_train]
        series: dict[str, dict[int, list[Optional[float]]]] = {f: {} for f in FACTORS}
        for (factor, layer), acc in sorted(self.acc.items()):
            if factor == "hidden_out" and layer in self.hidden_skipped:
                continue
            series[factor][layer] = acc.per_bucket(n_buckets)
        references: dict[str, dict[int, tuple[float, float]]] = {f: {} for f in FACTORS}
        exits: dict[str, Optional[Exit]] = {}
        for factor in FACTORS:
            first: Optional[Exit] = None
            for layer, values in series[factor].items():
                if factor == "hidden_out":
                    lo, hi, margin = 0.0, s.threshold, 0.0
                else:
                    ref = [values[b] for b in inside if values[b] is not None]
                    if not ref:
                        continue
                    lo, hi = min(ref), max(ref)  # type: ignore[type-var]
                    margin = s.tolerance * (hi - lo)
                references[factor][layer] = (lo, hi)
                found = _first_run_outside(values, outside, lo - margin, hi + margin, s.persist)
                if found is not None and (first is None or buckets[found] < first.position):
                    v = values[found]
                    assert v is not None
                    first = Exit(buckets[found], layer, "above" if v > hi else "below", v, (lo, hi))
            exits[factor] = first
        measured = [
            "logit_max: K.Q product x the softmax's scale, masked keys left out, max over heads and keys"
            if "kq" in self.seen_kinds else "logit_max: not measured (no K.Q product seen)",
            "entropy: -sum p log p of each head's softmax output, mean and max over heads"
            if "softmax" in self.seen_kinds else "entropy: not measured (no softmax seen)",
            "hidden_out: fraction of each layer's output dimensions outside that layer's [min, max] over the "
            f"tokens before {s.n_ctx_train} (sampling alone leaves about {2 / (s.n_ctx_train + 1):.1%} outside)" + (f" (layers {sorted(self.hidden_skipped)} left out: their output "
                                                  "keeps only the sampled rows)" if self.hidden_skipped else ""),
        ]
        return OodReport(s, self.n_tokens, buckets, series, references, exits, self.hidden_exit, measured)

    def verdict(self) -> str:
        """One line: stayed inside the trained distribution, or where it left it first."""
        report = self.report()
        left = [(e.position, f, e) for f, e in report.exits.items() if e is not None]
        layers = "every layer" if self.layers is None else "layers " + ",".join(str(x) for x in sorted(self.layers))
        if not left:
            if report.n_tokens <= self.settings.n_ctx_train:
                return (f"stayed inside the trained distribution ({report.n_tokens} tokens, none past "
                        f"n_ctx_train {self.settings.n_ctx_train}; {layers})")
            return f"stayed inside the trained distribution ({report.n_tokens} tokens; {layers})"
        position, factor, e = min(left, key=lambda x: x[0])
        return (f"left the trained distribution at token {position}: {FACTOR_LABELS[factor]} {e.direction} its "
                f"in-context range in layer {e.layer} (value {e.value:.3g}, in context {e.reference[0]:.3g}.."
                f"{e.reference[1]:.3g}; {layers})")
