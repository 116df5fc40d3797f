"""CpuExecutor: the executor interface over eager step programs on the CPU.

A worker thread plays the device: it applies a submission's uploads to the
buffers, runs the program and copies the frame's outputs, while the model
thread plans the next step (torch releases the GIL inside its kernels, so the
overlap is real). It keeps the frame window and fence ordering of the CUDA
executor, so the runtime and its tests exercise the same protocol here.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Sequence

import numpy as np

from ..contract import GraphKind, Upload
from ..errors import ExecutionError
from ..model.programs import StepPrograms
from .base import FRAMES, ExecutionCompletion, FenceTimeline, check_release, check_submission, upload_size


class CpuExecutor(FenceTimeline):
    def __init__(self, programs: StepPrograms, *, name: str = "flare-cpu-executor"):
        self.programs = programs
        self.contract = programs.contract
        self._views = {name: programs.host_view(name).reshape(-1).view(np.uint8)
                       for name in programs.buffers}
        self._capacities = {name: view.shape[0] for name, view in self._views.items()}
        self._frame_view = programs.host_view("step.frame")
        self._lock = threading.Condition()
        self._pending: collections.deque[_Entry] = collections.deque()
        self._done: collections.deque[ExecutionCompletion] = collections.deque()
        self._next_fence = 1
        self._completed_fence = 0
        self._outstanding = 0
        self._poison: BaseException | None = None
        self._held: _Entry | None = None  # a grammar-constrained step waiting for its release
        self._closing = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    # -- interface -------------------------------------------------------------

    @property
    def graph_estimates_ns(self) -> tuple[int, ...]:
        return ()  # the CPU programs are not timed ahead: the scheduler measures them as they run

    @property
    def outstanding(self) -> int:
        return self._outstanding

    @property
    def poisoned(self) -> BaseException | None:
        return self._poison

    def can_submit(self) -> bool:
        return (self._outstanding < FRAMES and self._poison is None and not self._closing
                and self._held is None)

    def _staged(self, uploads: Sequence[Upload]) -> list:
        staged = []
        for name, offset, data in uploads:
            upload_size(self._capacities, name, offset, data)
            staged.append((self._views[name], offset, bytes(data)))  # the host frame owns a copy
        return staged

    def submit(self, graph_index: int, uploads: Sequence[Upload], grammar_constrained: bool = False) -> int:
        """Enqueue one graph; returns its fence. A grammar-constrained submission is held: the
        worker runs a DECODE graph's forward part, then waits for ``release``."""
        graph = self.contract.graphs[graph_index]
        with self._lock:
            check_submission(poison=self._poison, closed=self._closing, held_fence=self._held_fence,
                             window_full=self._outstanding >= FRAMES)
            staged = self._staged(uploads)
            fence = self._next_fence
            self._next_fence += 1
            self._outstanding += 1
            entry = _Entry(fence, graph, fence % FRAMES, staged, held=grammar_constrained)
            if grammar_constrained:
                self._held = entry
            self._pending.append(entry)
            self._lock.notify_all()
        return fence

    @property
    def _held_fence(self) -> int:
        return self._held.fence if self._held is not None else 0

    def release(self, fence: int, uploads: Sequence[Upload]) -> None:
        with self._lock:
            check_release(poison=self._poison, closed=self._closing, held_fence=self._held_fence, fence=fence,
                          uploads=uploads)
            self._held.masks = self._staged(uploads)
            self._held = None
            self._lock.notify_all()

    def poll(self, timeout: float = 0.0) -> ExecutionCompletion | None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._done:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self._outstanding == 0):
                    return None
                self._lock.wait(remaining)
            completion = self._done.popleft()
            self._outstanding -= 1
            self._completed_fence = completion.fence
            self._lock.notify_all()
            return completion

    def close(self) -> None:
        """Finish queued work, stop the worker. Idempotent."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._thread.join()

    # -- worker ----------------------------------------------------------------

    def _work(self) -> None:
        out = self.programs.buffers
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._lock.wait()
                if not self._pending:
                    return
                entry = self._pending[0]
            error = None
            start = time.perf_counter_ns()
            try:
                if self._poison is not None:
                    raise ExecutionError(f"executor is poisoned: {self._poison}")
                split = entry.held and entry.graph.kind == GraphKind.DECODE
                if not entry.held or split:
                    self._apply(entry.staged, entry.frame)
                if split:
                    self.programs.run_part(entry.graph, "forward")
                if entry.held and not self._await_release(entry):
                    return  # closing: a held step that was never released does not complete
                if split:
                    self._apply(entry.masks, entry.frame)
                    self.programs.run_part(entry.graph, "sample")
                else:
                    if entry.held:
                        self._apply(entry.staged + entry.masks, entry.frame)
                    self.programs.run(entry.graph)
                records = out["out.records"][entry.frame].numpy().copy()
                logprobs = out["out.logprobs"][entry.frame].numpy().copy()
                top_ids = out["out.top_ids"][entry.frame].numpy().copy()
            except BaseException as exc:  # noqa: BLE001 - poison on any failure
                error = exc if isinstance(exc, ExecutionError) else ExecutionError(
                    f"{entry.graph.label} failed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc if error is not exc else None
                records = logprobs = top_ids = np.zeros(0)
            duration = time.perf_counter_ns() - start - entry.waited_ns
            with self._lock:
                self._pending.popleft()
                if error is not None and self._poison is None:
                    self._poison = error
                self._done.append(ExecutionCompletion(entry.fence, entry.graph.index, records, logprobs, top_ids,
                                                      duration, error))
                self._lock.notify_all()

    def _apply(self, staged: list, frame: int) -> None:
        for view, offset, data in staged:
            view[offset:offset + len(data)] = np.frombuffer(data, dtype=np.uint8)
        self._frame_view[0] = frame

    def _await_release(self, entry: "_Entry") -> bool:
        """Wait for a held entry's masks; False when the executor closes first."""
        start = time.perf_counter_ns()
        with self._lock:
            while entry.masks is None and not self._closing:
                self._lock.wait()
        entry.waited_ns = time.perf_counter_ns() - start
        return entry.masks is not None


class _Entry:
    """One submission on its way through the worker."""

    __slots__ = ("fence", "graph", "frame", "staged", "held", "masks", "waited_ns")

    def __init__(self, fence: int, graph, frame: int, staged: list, *, held: bool):
        self.fence, self.graph, self.frame, self.staged, self.held = fence, graph, frame, staged, held
        self.masks: list | None = None  # a held entry's release uploads
        self.waited_ns = 0
