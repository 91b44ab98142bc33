"""One request's work in the server: run in a thread of its own, its events handed to the event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional


class Cancelled(Exception):
    """The request's client went away, or its time ran out."""


@dataclass
class Job:
    """One request's work, run in a thread; events go to the event loop's queue."""

    loop: asyncio.AbstractEventLoop
    queue: "asyncio.Queue[tuple[str, Any]]" = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    deadline: Optional[float] = None  # time.monotonic() past which the request is cancelled (--timeout)
    timed_out: bool = False

    def expired(self) -> bool:
        """Past the deadline: the request is cancelled (and answered with a timeout error)."""
        if self.deadline is not None and time.monotonic() > self.deadline and not self.timed_out:
            self.timed_out = True
            self.cancel.set()
        return self.timed_out

    def emit(self, kind: str, value: Any = None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))
        except RuntimeError:  # the loop is gone (server shutting down)
            self.cancel.set()
