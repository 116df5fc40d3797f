"""CpuExecutor: the executor interface over eager step programs on the CPU.

A worker thread plays the device: it applies a submission's uploads to the
buffers, runs the program and copies the frame's outputs, while the model
thread plans the next step (torch releases the GIL inside its kernels, so the
overlap is real). It keeps the two-frame window and fence ordering of the CUDA
executor, so the runtime and its tests exercise the same protocol here.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Sequence

import numpy as np

from ..contract import Upload
from ..errors import ExecutionError
from ..model.programs import StepPrograms
from .base import FRAMES, ExecutionCompletion, FenceTimeline, check_submission, upload_size


class CpuExecutor(FenceTimeline):
    def __init__(self, programs: StepPrograms, *, name: str = "flare-cpu-executor"):
        self.programs = programs
        self.contract = programs.contract
        self._views = {name: programs.host_view(name).reshape(-1).view(np.uint8)
                       for name in programs.buffers}
        self._capacities = {name: view.shape[0] for name, view in self._views.items()}
        self._frame_view = programs.host_view("step.frame")
        self._lock = threading.Condition()
        self._pending: collections.deque = collections.deque()  # (fence, graph, frame, uploads)
        self._done: collections.deque[ExecutionCompletion] = collections.deque()
        self._next_fence = 1
        self._completed_fence = 0
        self._outstanding = 0
        self._poison: BaseException | None = None
        self._grammar_fence = 0  # in-flight grammar-constrained step (0: none)
        self._closing = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    # -- interface -------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        return self._outstanding

    @property
    def poisoned(self) -> BaseException | None:
        return self._poison

    def can_submit(self) -> bool:
        return (self._outstanding < FRAMES and self._poison is None and not self._closing
                and self._grammar_fence == 0)

    def submit(self, graph_index: int, uploads: Sequence[Upload], grammar_constrained: bool = False) -> int:
        """Enqueue one graph; returns its fence. A grammar-constrained submission needs an empty
        window and blocks further submissions until its completion has been polled."""
        graph = self.contract.graphs[graph_index]
        with self._lock:
            check_submission(poison=self._poison, closed=self._closing, grammar_fence=self._grammar_fence,
                             grammar_constrained=grammar_constrained, outstanding=self._outstanding,
                             window_full=self._outstanding >= FRAMES)
            staged = []
            for name, offset, data in uploads:
                upload_size(self._capacities, name, offset, data)
                staged.append((self._views[name], offset, bytes(data)))  # the host frame owns a copy
            fence = self._next_fence
            self._next_fence += 1
            self._outstanding += 1
            if grammar_constrained:
                self._grammar_fence = fence
            self._pending.append((fence, graph, fence % FRAMES, staged))
            self._lock.notify_all()
        return fence

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
            if self._grammar_fence == completion.fence:
                self._grammar_fence = 0
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
                fence, graph, frame, staged = self._pending[0]
            error = None
            start = time.perf_counter_ns()
            try:
                if self._poison is not None:
                    raise ExecutionError(f"executor is poisoned: {self._poison}")
                for view, offset, data in staged:
                    view[offset:offset + len(data)] = np.frombuffer(data, dtype=np.uint8)
                self._frame_view[0] = frame
                self.programs.run(graph)
                records = out["out.records"][frame].numpy().copy()
                logprobs = out["out.logprobs"][frame].numpy().copy()
                top_ids = out["out.top_ids"][frame].numpy().copy()
            except BaseException as exc:  # noqa: BLE001 - poison on any failure
                error = exc if isinstance(exc, ExecutionError) else ExecutionError(
                    f"{graph.label} failed: {type(exc).__name__}: {exc}")
                error.__cause__ = exc if error is not exc else None
                records = logprobs = top_ids = np.zeros(0)
            duration = time.perf_counter_ns() - start
            with self._lock:
                self._pending.popleft()
                if error is not None and self._poison is None:
                    self._poison = error
                self._done.append(ExecutionCompletion(fence, graph.index, records, logprobs, top_ids,
                                                      duration, error))
                self._lock.notify_all()
