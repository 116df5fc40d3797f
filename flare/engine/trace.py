"""Dashboard telemetry: graph completions and request state, written by the model thread.

Nothing here exists unless a dashboard runs: :meth:`ModelRuntime.start_trace` creates one
:class:`CompletionTrace` and the model thread checks ``runtime.trace is None`` once per
completion, so a server without a dashboard pays one attribute test.

The model thread writes each graph completion into a preallocated ring of
:data:`TRACE_CAPACITY` entries under a nonblocking lock. When the lock is held (the
dashboard is draining) or the ring is full (the dashboard fell behind), the completion is
dropped and counted in :attr:`CompletionTrace.dropped`, never waited for: the model thread
must not block on a display. An entry stores references, not copies: the step's slot and
generation columns are fresh arrays per plan, never written after it is built.

Request state is sampled on demand: the dashboard sets :attr:`CompletionTrace.wants_sample`
and the model thread, at the top of its next turn, publishes a :class:`RequestSample`
(one :class:`RequestState` per request holding a slot) with its monotonic time, whose age
the display shows.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

TRACE_CAPACITY = 1024  # completions the model thread may write before the dashboard drains them


class Completion(NamedTuple):
    """One completed graph as the model thread observed it."""

    at_ns: int  # time.monotonic_ns() when the completion was observed
    graph_index: int
    duration_ns: int  # measured GPU (or CPU) duration; 0 when the executor had no timing
    slots: np.ndarray  # the rows' slots
    generations: np.ndarray  # the rows' slot generations (slot.generation names a request)


@dataclass(frozen=True)
class RequestState:
    """A request holding a slot, at a request-state sample."""

    slot: int
    generation: int
    phase: str  # the scheduler phase, lower case (prefilling, decoding, ...)
    prompt_consumed: int  # prompt tokens consumed so far (reused prefix included)
    prompt_tokens: int
    output_tokens: int
    arrival_ns: int  # when the server handed it to the model runtime
    last_commit_ns: int  # when a committed step last advanced its prompt or output (or it took its slot)
    last_output_ns: int  # when output was last published; 0 before the first publication
    bursts: int  # completed submissions whose output was published (a speculative round counts once)


@dataclass(frozen=True)
class RequestSample:
    at_ns: int
    requests: tuple[RequestState, ...]


class CompletionTrace:
    """The ring of completions and the latest request sample (see the module docstring)."""

    def __init__(self, capacity: int = TRACE_CAPACITY) -> None:
        if capacity <= 0 or capacity & (capacity - 1):
            raise ValueError(f"the ring's capacity must be a power of two, got {capacity}")
        self.capacity = capacity
        self._mask = capacity - 1
        self._lock = threading.Lock()
        self._at = [0] * capacity
        self._graph = [0] * capacity
        self._duration = [0] * capacity
        self._slots: list = [None] * capacity
        self._generations: list = [None] * capacity
        self._written = 0  # completions written since the start (model thread)
        self._read = 0  # completions drained (dashboard thread, under the lock)
        self.dropped = 0  # completions not written: ring full or lock held
        self.wants_sample = False
        self.sample: RequestSample | None = None
        # the last submitted graph and the scheduler's estimate of it when it was planned (0: none)
        self.last_submitted: tuple[int, int] | None = None

    # -- model thread -----------------------------------------------------------

    def record(self, graph_index: int, duration_ns: int, slots: np.ndarray, generations: np.ndarray) -> None:
        if not self._lock.acquire(False):
            self.dropped += 1
            return
        n = self._written
        if n - self._read >= self.capacity:
            self._lock.release()
            self.dropped += 1
            return
        i = n & self._mask
        self._at[i] = time.monotonic_ns()
        self._graph[i] = graph_index
        self._duration[i] = duration_ns
        self._slots[i] = slots
        self._generations[i] = generations
        self._written = n + 1
        self._lock.release()

    def publish_sample(self, requests: tuple[RequestState, ...]) -> None:
        self.sample = RequestSample(time.monotonic_ns(), requests)
        self.wants_sample = False

    # -- dashboard thread -------------------------------------------------------

    def drain(self) -> list[Completion]:
        """Every completion written since the last drain, oldest first."""
        with self._lock:
            start, end = self._read, self._written
            out = []
            mask = self._mask
            for n in range(start, end):
                i = n & mask
                out.append(Completion(self._at[i], self._graph[i], self._duration[i], self._slots[i],
                                      self._generations[i]))
                self._slots[i] = self._generations[i] = None  # the arrays go with the dashboard's copy
            self._read = end
        return out

    def request_sample(self) -> None:
        """Ask the model thread for a fresh :class:`RequestSample` (it answers within a turn)."""
        self.wants_sample = True
