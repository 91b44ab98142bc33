"""A progress line on stderr for long work: done/total, tokens/s, ETA."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Call with (done, total); prints at most every `interval` seconds, and once at the end. (0, total) starts
    the clock again: one Progress serves every prompt an engine reads, each with its own rate and ETA."""

    def __init__(self, label: str, stream: TextIO | None = None, interval: float = 0.5,
                 min_total: int = 0) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.interval = interval
        self.min_total = min_total
        self.start = time.monotonic()
        self.last = 0.0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __call__(self, done: int, total: int) -> None:
        if total < self.min_total:
            return
        now = time.monotonic()
        if done == 0:  # a new feed: its rate counts from here
            self.start = self.last = now
            return
        finished = done >= total
        if not finished and now - self.last < self.interval:
            return
        self.last = now
        elapsed = max(now - self.start, 1e-9)
        rate = done / elapsed
        eta = (total - done) / rate if rate > 0 else float("inf")
        line = (f"{self.label}: {done}/{total} tokens ({100.0 * done / max(total, 1):5.1f}%), "
                f"{rate:,.0f} tok/s, ETA {eta:,.0f} s")
        if self.tty:
            self.stream.write("\r" + line + ("\n" if finished else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
