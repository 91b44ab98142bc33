"""`/metrics`: the server's counters in Prometheus' text exposition format (version 0.0.4)."""

from __future__ import annotations

import ctypes
import os
from typing import Any, Optional


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def process_memory() -> dict[str, int]:
    """The process's resident set (bytes, from /proc) and, with glibc, the bytes malloc has handed out and not
    had back (mallinfo2: in-use chunks of the arenas plus mmapped ones) and the bytes its arenas hold. A leak
    raises the heap in use; memory freed but kept by the allocator raises only the arenas and the resident set."""
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{os.getpid()}/statm") as fh:
            found["resident"] = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return found
    fn.restype = _MallInfo2
    info = fn()
    found["heap_in_use"] = int(info.uordblks + info.hblkhd)
    found["heap_arenas"] = int(info.arena + info.hblkhd)
    return found


def _family(lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        lines.append(f"{name}{labels} {value:g}" if isinstance(value, float) else f"{name}{labels} {value}")


def render(statuses: dict[str, int], snapshot: Optional[dict[str, Any]]) -> str:
    """The text of /metrics: requests by HTTP status (499: the client left first), and with a scheduler's
    snapshot (--parallel) its token counters, queue length, busy slots and KV cells in use per slot; then the
    process's memory (resident, and malloc's own count where glibc gives it)."""
    lines: list[str] = []
    _family(lines, "farctx_requests_total", "counter", "Requests answered, by HTTP status (499: the client left).",
            [(f'{{status="{status}"}}', n) for status, n in sorted(statuses.items())] or [('{status="200"}', 0)])
    if snapshot is not None:
        counters = snapshot["counters"]
        _family(lines, "farctx_prompt_tokens_total", "counter", "Prompt tokens read (evaluated).",
                [("", counters.prompt_tokens)])
        _family(lines, "farctx_prompt_tokens_cached_total", "counter",
                "Prompt tokens reused from a slot's stream (not read again).", [("", counters.prompt_tokens_cached)])
        _family(lines, "farctx_generated_tokens_total", "counter", "Tokens generated.",
                [("", counters.generated_tokens)])
        _family(lines, "farctx_decode_steps_total", "counter", "Batch steps (one step feeds every busy slot).",
                [("", counters.steps)])
        _family(lines, "farctx_requests_waiting", "gauge", "Requests waiting for a free slot.",
                [("", snapshot["waiting"])])
        _family(lines, "farctx_slots", "gauge", "Slots (--parallel).", [("", snapshot["n_slots"])])
        _family(lines, "farctx_slots_busy", "gauge", "Slots serving a request.", [("", snapshot["slots_busy"])])
        _family(lines, "farctx_kv_cells_used", "gauge", "KV cache cells in use, per slot.",
                [(f'{{slot="{i}"}}', n) for i, n in enumerate(snapshot["cells"])])
    memory = process_memory()
    if "resident" in memory:
        _family(lines, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
                [("", memory["resident"])])
    if "heap_in_use" in memory:
        _family(lines, "farctx_heap_in_use_bytes", "gauge", "Bytes malloc has handed out and not had back.",
                [("", memory["heap_in_use"])])
        _family(lines, "farctx_heap_arena_bytes", "gauge", "Bytes malloc's arenas and mmapped chunks hold.",
                [("", memory["heap_arenas"])])
    return "\n".join(lines) + "\n"
