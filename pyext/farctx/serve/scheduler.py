"""Continuous batching: requests share a `SequenceBatch`, one slot (stream) each, fed together step by step.

One thread owns the batch. Each step it admits waiting requests into free slots (the slot whose stream
shares the longest prefix with the prompt, rewound to it; else one already under the request's method;
else the least recently used), drops cancelled and timed-out ones, gathers
for every busy slot either its next prompt piece or its last sampled token (at most `n_batch` tokens
in all), calls `step` once, samples each fed slot from its own logits row and hands the tokens to
the request's queue. A request that ends or fails frees its slot and leaves the other streams as
they were.

Prompt pieces are `chunk` tokens (a multiple of n_ubatch, n_batch / n_seq rounded down) starting at
multiples of `chunk`, and a reused prefix is cut back to a multiple of `chunk` within the tokens the
slot read as prompt: every token is then computed in the same ubatch, at the same place, as when
its request is served alone, so answers do not depend on what else runs. The methods that keep the
method table's `whole_prompt` (mesa: its chunk schedule is planned from the prompt as one feed) read each
prompt whole, in one feed, from an empty stream.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..batch import SequenceBatch
from ..errors import ContextSizeError, FarctxError, NoSpaceError
from ..methods import MethodParams, context_plan, method_infos
from .sampling import RowSampler

MAX_GENERATION = 2**31 - 1
_EXCEEDS = "the request exceeds the available context size, try increasing it"


class RequestTimeout(FarctxError):
    """The request ran past the server's --timeout and was cancelled (the server answers 408)."""


MethodKey = tuple[str, tuple[tuple[str, int], ...]]


def method_key(method: dict[str, Any]) -> MethodKey:
    """A request's method and parameters as a hashable key (what a slot's stream was opened with)."""
    return method["method"], tuple(sorted((k, int(v)) for k, v in method.items() if k != "method"))


@dataclass
class Request:
    """One generation: its prompt tokens, method, sampler and limits; tokens come out on `events`
    as ("token", id), then ("end", reason) or ("error", exception)."""

    prompt: list[int]
    method: dict[str, Any]
    sampler: RowSampler
    max_tokens: int = MAX_GENERATION
    deadline: Optional[float] = None  # time.monotonic()
    progress: Optional[Callable[[int, int], None]] = None  # (prompt tokens read, prompt tokens to read)
    events: "queue.Queue[tuple[str, Any]]" = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    n_cached: int = 0  # prompt tokens reused from the slot's stream
    n_generated: int = 0
    slot: int = -1

    @property
    def key(self) -> MethodKey:
        return method_key(self.method)


@dataclass
class Slot:
    """One stream of the server's SequenceBatch and the request it serves."""

    key: Optional[MethodKey] = None  # the method its stream was opened with (None: not open / unknown)
    request: Optional[Request] = None
    pending: list[int] = field(default_factory=list)  # prompt tokens still to feed
    n_total: int = 0  # prompt tokens to read for this request (after the reused prefix)
    prompt_end: int = 0  # the stream's first prompt_end tokens were read as aligned prompt pieces
    last: Optional[int] = None  # the last sampled token, fed at the next step
    used: float = 0.0


@dataclass
class Counters:
    """What /metrics reports from the scheduler."""

    prompt_tokens: int = 0  # prompt tokens read
    prompt_tokens_cached: int = 0  # prompt tokens reused from a slot's stream
    generated_tokens: int = 0
    steps: int = 0


class Scheduler:
    """The thread that owns `batch` and serves `Request`s in its slots."""

    def __init__(self, batch: SequenceBatch, *, n_batch: int, n_ubatch: int, n_ctx_train: int,
                 is_eog: Callable[[int], bool], n_swa: int = 0) -> None:
        self.batch = batch
        self.n_batch = n_batch
        self.n_ubatch = max(1, min(n_ubatch, n_batch))
        self.chunk = max(1, (n_batch // batch.n_seq) // self.n_ubatch) * self.n_ubatch
        self.n_ctx_train = n_ctx_train
        self.n_swa = n_swa  # the model's sliding window (0: none): the plan's term for its layers' cache
        self.is_eog = is_eog
        self.counters = Counters()
        self._slots = [Slot() for _ in range(batch.n_seq)]
        self._cells = [0] * batch.n_seq
        self._waiting: deque[Request] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._rr = 0
        self._thread = threading.Thread(target=self._run, name="farctx-scheduler", daemon=True)

    # -- the request side (any thread) ---------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(30)

    def generation_limit(self, method: dict[str, Any], n_prompt: int, max_tokens: Optional[int]) -> int:
        """The most tokens a request may generate in a slot, as the context plan of a slot's cache answers for its
        prompt and max_tokens; raises ContextSizeError / FarctxError with the sizes when they cannot fit."""
        params = MethodParams.from_kwargs(method["method"], {k: v for k, v in method.items() if k != "method"})
        asked = max_tokens if max_tokens is not None and max_tokens > 0 else None
        try:
            plan = context_plan(params, self.n_ctx_train, n_swa=self.n_swa, n_ctx=self.batch.n_ctx_seq,
                                n_batch=self.n_batch, n_ubatch=self.n_ubatch, n_prompt=n_prompt,
                                n_predict=asked or 0)
        except NoSpaceError as exc:
            raise ContextSizeError(f"{_EXCEEDS}: {exc} (per slot: -c / -np)", n_prompt,
                                   self.batch.n_ctx_seq) from None
        except FarctxError as exc:
            raise FarctxError(f"{exc} (per slot: -c / -np)") from None
        limit = asked or MAX_GENERATION
        return limit if plan.n_predict_max < 0 else max(1, min(limit, plan.n_predict_max))

    def submit(self, request: Request) -> None:
        with self._cond:
            self._waiting.append(request)
            self._cond.notify_all()

    def cancel(self, request: Request) -> None:
        request.cancelled.set()
        with self._cond:
            self._cond.notify_all()

    def snapshot(self) -> dict[str, Any]:
        """Counters, queue length, busy slots and KV cells in use per slot (as of the last step)."""
        with self._cond:
            return {
                "n_slots": len(self._slots),
                "slots_busy": sum(s.request is not None for s in self._slots),
                "waiting": len(self._waiting),
                "cells": list(self._cells),
                "counters": Counters(**vars(self.counters)),
            }

    # -- the scheduler thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    break
                self._expire_waiting()
                admitted = self._admit()
                if not admitted and all(s.request is None for s in self._slots):
                    self._cond.wait(0.1)
                    continue
            for i, request, keep in admitted:
                self._start(i, request, keep)
            self._drop_cancelled()
            feeds = self._gather()
            if feeds:
                self._step(feeds)
        for i, s in enumerate(self._slots):
            if s.request is not None:
                self._finish(i, "error", RequestTimeout("the server is shutting down"))
        with self._cond:
            while self._waiting:
                self._waiting.popleft().events.put(("error", RequestTimeout("the server is shutting down")))

    def _expire_waiting(self) -> None:
        now = time.monotonic()
        kept: deque[Request] = deque()
        for r in self._waiting:
            if r.cancelled.is_set():
                r.events.put(("end", "cancelled"))
            elif r.deadline is not None and now > r.deadline:
                r.events.put(("error", RequestTimeout("the request timed out waiting for a slot (--timeout)")))
            else:
                kept.append(r)
        self._waiting = kept

    def _admit(self) -> list[tuple[int, Request, int]]:
        """Waiting requests into free slots, first come first served (under the lock)."""
        admitted = []
        while self._waiting:
            free = [i for i, s in enumerate(self._slots) if s.request is None]
            if not free:
                break
            request = self._waiting.popleft()
            best = max(free, key=lambda i: (self._reusable(i, request), self._slots[i].key == request.key,
                                            -self._slots[i].used))
            keep = self._reusable(best, request)
            self._slots[best].request = request
            request.slot = best
            admitted.append((best, request, keep))
        return admitted

    def _whole_prompt(self, request: Request) -> bool:
        return method_infos()[request.method["method"]].whole_prompt

    def _reusable(self, i: int, request: Request) -> int:
        """Tokens of slot i's stream this request can keep: the common prefix within what the slot read as
        prompt, cut back to a multiple of `chunk`, leaving at least one prompt token to read."""
        s = self._slots[i]
        if s.key != request.key or s.prompt_end == 0 or self._whole_prompt(request):
            return 0
        stream = self.batch.tokens(i)[: s.prompt_end]
        n = 0
        for a, b in zip(stream, request.prompt):
            if a != b:
                break
            n += 1
        n = min(n, len(request.prompt) - 1)
        return n // self.chunk * self.chunk

    def _start(self, i: int, request: Request, keep: int) -> None:
        s = self._slots[i]
        try:
            if s.key != request.key:
                s.key = None
                params = {k: v for k, v in request.method.items() if k != "method"}
                self.batch.open(i, request.method["method"], **params)
                s.key = request.key
            else:
                self.batch.rewind(i, keep)
        except Exception as exc:  # a method the model cannot run, parameters libfarctx refuses
            s.key = None
            self._finish(i, "error", exc)
            return
        s.pending = list(request.prompt[keep:])
        s.n_total = len(s.pending)
        s.prompt_end = keep
        s.last = None
        request.n_cached = keep
        with self._cond:
            self.counters.prompt_tokens_cached += keep

    def _drop_cancelled(self) -> None:
        now = time.monotonic()
        for i, s in enumerate(self._slots):
            r = s.request
            if r is None:
                continue
            if r.cancelled.is_set():
                self._finish(i, "end", "cancelled")
            elif r.deadline is not None and now > r.deadline:
                self._finish(i, "error", RequestTimeout("the request ran past the server's --timeout and was "
                                                        "cancelled"))

    def _gather(self) -> dict[int, list[int]]:
        """This step's tokens per slot: sampled tokens first, then prompt pieces (round robin, from a
        slot further on each step) while the n_batch budget lasts. A piece is never cut short, and the
        first piece of a step goes in whatever its size, so every prompt moves on."""
        feeds: dict[int, list[int]] = {}
        budget = self.n_batch
        n_pieces = 0
        n = len(self._slots)
        for i, s in enumerate(self._slots):
            if s.request is not None and not s.pending and s.last is not None:
                feeds[i] = [s.last]
                budget -= 1
        for k in range(n):
            i = (self._rr + k) % n
            s = self._slots[i]
            if s.request is None or not s.pending:
                continue
            piece = s.pending if self._whole_prompt(s.request) else s.pending[: self.chunk]
            if len(piece) <= budget or n_pieces == 0:
                feeds[i] = list(piece)
                budget -= len(piece)
                n_pieces += 1
        self._rr = (self._rr + 1) % n
        return feeds

    def _step(self, feeds: dict[int, list[int]]) -> None:
        before = {i: self.batch.n_past(i) for i in feeds}
        try:
            rows = self.batch.step(feeds)
        except Exception:
            rows = self._recover(feeds, before)
        with self._cond:
            self.counters.steps += 1
        for i, tokens in feeds.items():
            if i in rows:
                self._advance(i, tokens, rows[i])

    def _recover(self, feeds: dict[int, list[int]], before: dict[int, int]) -> dict[int, Any]:
        """A step failed: every stream that took its tokens gets its logits again (its last token fed
        again after a rewind); the others are fed alone, and a stream that still fails ends its request."""
        rows: dict[int, Any] = {}
        for i, tokens in feeds.items():
            try:
                if self.batch.n_past(i) == before[i] + len(tokens):
                    self.batch.rewind(i, before[i] + len(tokens) - 1)
                    rows.update(self.batch.step({i: tokens[-1:]}))
                else:
                    rows.update(self.batch.step({i: tokens}))
            except Exception as exc:
                self._slots[i].key = None if not isinstance(exc, NoSpaceError) else self._slots[i].key
                self._finish(i, "error", exc)
        return rows

    def _advance(self, i: int, fed: list[int], logits: Any) -> None:
        s = self._slots[i]
        r = s.request
        if r is None:
            return
        self._cells[i] = self.batch.stats(i)["n_cells_used"]
        if s.pending:
            s.pending = s.pending[len(fed):]
            if not self._whole_prompt(r):
                s.prompt_end += len(fed)
            with self._cond:
                self.counters.prompt_tokens += len(fed)
            if r.progress is not None:
                try:
                    r.progress(s.n_total - len(s.pending), s.n_total)
                except Exception:
                    r.cancelled.set()
            if s.pending:
                return
        try:
            token = r.sampler.sample(logits)
        except Exception as exc:
            self._finish(i, "error", exc)
            return
        s.last = token
        r.n_generated += 1
        with self._cond:
            self.counters.generated_tokens += 1
        r.events.put(("token", token))
        if self.is_eog(token):
            self._finish(i, "end", "stop")
        elif r.n_generated >= r.max_tokens:
            self._finish(i, "end", "length")

    def _finish(self, i: int, kind: str, value: Any) -> None:
        s = self._slots[i]
        r = s.request
        s.request = None
        s.pending = []
        s.last = None
        s.used = time.monotonic()
        if r is not None:
            r.events.put((kind, value))
