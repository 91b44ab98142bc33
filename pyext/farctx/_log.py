"""llama.cpp's log: errors are kept so that a failed load can say why; the rest follows llama_cpp's verbosity."""

from __future__ import annotations

import ctypes
import sys
from collections import deque
from typing import Any

# ggml_log_level of the pinned ggml (llama_cpp's _logger still maps the older enum)
_WARN, _ERROR, _CONT = 3, 4, 5


class LlamaLog:
    """Receives llama.cpp's log lines (installed once per process, as llama.cpp's log is per process)."""

    def __init__(self, llama_cpp: Any) -> None:
        self.errors: deque[str] = deque(maxlen=16)
        self.verbose = False
        self._last_level = 0
        self._callback = llama_cpp.llama_log_callback(self._on_log)
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))

    def _on_log(self, level: int, text: bytes, _user_data: Any) -> None:
        level = self._last_level if level == _CONT else level
        self._last_level = level
        line = text.decode("utf-8", errors="replace")
        if level == _ERROR and line.strip():
            self.errors.append(line.strip())
        if self.verbose:  # otherwise errors reach the user through FarctxError
            print(line, end="", flush=True, file=sys.stderr)

    def reason(self) -> str:
        """The first error since clear(): the root cause, before the follow-up failures."""
        if not self.errors:
            return ""
        line = self.errors[0]
        for marker in ("error loading model: ", "failed to load model: "):
            if marker in line:
                return line.split(marker, 1)[1]
        return line.split(": ", 1)[1] if ": " in line and " " not in line.split(": ", 1)[0] else line

    def clear(self) -> None:
        self.errors.clear()
