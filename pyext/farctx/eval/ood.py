"""`farctx eval ood`: one document streamed through each method, the out-of-distribution factors
recorded per layer and position bucket (farctx.eval.ood_recorder), the positions where they leave the range the
same run showed inside the trained context.

Protocol: the first max(lengths) tokens of the document are fed once, as one prompt (so mesa
chunks it as it chunks any prompt), with flash attention off (the attention scores exist as
tensors only then); llama.cpp's evaluation callback reads the tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..errors import FarctxError
from .ood_recorder import FACTORS, OodRecorder, OodReport, OodSettings
from .tensor_probe import eval_callback_installed

PROTOCOL = (
    "the first {n} tokens of the document fed once as one prompt per method, flash attention off; per layer "
    "and bucket of {bucket} positions: {measured}; a factor leaves the in-context range at the first of {persist} "
    "consecutive buckets past n_ctx_train where a layer's value is outside [lo - m, hi + m] (lo, hi: that layer's "
    "range over the buckets inside n_ctx_train, m = {tolerance} x (hi - lo)); for hidden_out outside [0, "
    "{threshold:.1%}]"
)


@dataclass
class OodRun:
    method: str
    report: OodReport
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "seconds": round(self.seconds, 1), **self.report.as_dict()}


def cost_line(methods: Sequence[str], n_tokens: int, n_ctx_train: int, n_head: int, n_layer: int,
              fixed: Callable[[str], bool]) -> str:
    """What the run will do, in numbers a user can weigh before it starts."""
    whole = sum(1 for m in methods if not fixed(m))
    window = len(methods) - whole
    scores_whole = n_tokens * n_tokens / 2 * n_head
    scores_fixed = n_tokens * (n_ctx_train + 512) * n_head
    total = (whole * scores_whole + window * scores_fixed) * n_layer
    return (f"cost: {len(methods)} method(s) x {n_tokens} tokens of prefill with flash attention off; about "
            f"{total / 1e9:.2f} G attention scores copied to the host and reduced in numpy "
            f"({n_layer} layers x {n_head} heads; whole-cache methods grow with the square of the length)")


def ood_of_method(make_llm: Callable[[], Any], tokens: Sequence[int], settings: OodSettings) -> OodReport:
    """Feed `tokens` once through the farctx.Llama that make_llm builds (with flash attention off),
    the recorder installed as its evaluation callback."""
    recorder = OodRecorder(settings)
    with eval_callback_installed(recorder):
        llm = make_llm()
    try:
        if llm.context_params.flash_attn_type != 0:  # LLAMA_FLASH_ATTN_TYPE_DISABLED
            raise FarctxError("the OOD factors need flash attention off (the attention scores exist only then)")
        llm.eval(list(tokens))
        recorder.check()
    finally:
        llm.close()
    if recorder.n_tokens != len(tokens):
        raise FarctxError(f"the callback counted {recorder.n_tokens} query positions for {len(tokens)} tokens fed: "
                          "positions would be wrong")
    return recorder.report()


def value_at(report: OodReport, factor: str, length: int) -> Optional[float]:
    """The factor's plotted value in the bucket that holds position length - 1."""
    b = (length - 1) // report.settings.bucket
    values = report.summary(factor)
    return values[b] if 0 <= b < len(values) else None


def exit_cell(report: OodReport, factor: str) -> str:
    e = report.exits.get(factor)
    if e is not None:
        return e.describe()
    if not report.series.get(factor):
        return "not measured"
    return "stays inside"


__all__ = ["FACTORS", "OodRun", "PROTOCOL", "cost_line", "exit_cell", "ood_of_method", "value_at"]
