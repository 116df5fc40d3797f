"""GraphExecutor: CUDA-graph execution in a window of frames, through the driver API.

The step path makes cuda-python driver calls only (no torch ops, no CUDA
allocation): ``submit`` stages the upload ranges in a pinned input frame,
enqueues ``cuMemcpyHtoDAsync`` for each range and ``cuGraphLaunch`` on the
model stream between two timing events, then makes the copy stream wait for
the launch and queues the completion copies (records, logprobs, top ids of
the frame's output slot) into a pinned completion frame. ``poll`` returns
completions in fence order once their copy has finished, then frees the frame.

``FRAMES`` (4) submissions are in flight at most; one more gets backpressure (an
ExecutionError: callers check ``can_submit``). Any driver error poisons the
executor. ``close`` drains both streams before releasing the pinned frames and
the owner (the object keeping graphs, tensors and the pool alive); when the
drain cannot be confirmed it keeps them, leaking rather than freeing memory a
queued kernel may still touch.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Sequence

import numpy as np

from ..contract import Upload
from ..errors import ExecutionError
from .base import FRAMES, ExecutionCompletion, FenceTimeline, check_release, check_submission, upload_size

_POLL_SLEEP_S = 0.0002

Progress = Callable[[str], None]


def _driver():
    from cuda.bindings import driver
    return driver


def check(result, what: str):
    """Unpack a cuda-python result tuple, raising ExecutionError with the CUDA status."""
    cu = _driver()
    err = result[0]
    if err != cu.CUresult.CUDA_SUCCESS:
        raise ExecutionError(f"{what} failed: {err.name} ({int(err)})")
    return result[1] if len(result) == 2 else result[1:]


class _Frame:
    """One pinned input staging buffer and one pinned completion frame, with their events."""

    def __init__(self, torch, input_bytes: int, outputs: dict[str, tuple[tuple[int, ...], object]]):
        cu = _driver()
        self.staging = torch.empty(max(input_bytes, 64), dtype=torch.uint8, pin_memory=True)
        self.staging_np = self.staging.numpy()
        self.staging_ptr = self.staging.data_ptr()
        self.outputs = {name: torch.empty(shape, dtype=dtype, pin_memory=True)
                        for name, (shape, dtype) in outputs.items()}
        timed = int(cu.CUevent_flags.CU_EVENT_DEFAULT)
        untimed = int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        self.start = check(cu.cuEventCreate(timed), "cuEventCreate")
        self.end = check(cu.cuEventCreate(timed), "cuEventCreate")
        self.copied = check(cu.cuEventCreate(untimed), "cuEventCreate")
        # a held step's two parts: forward ends at mid, sampling starts at resume after masks
        self.mid = check(cu.cuEventCreate(timed), "cuEventCreate")
        self.resume = check(cu.cuEventCreate(timed), "cuEventCreate")
        self.masks = check(cu.cuEventCreate(untimed), "cuEventCreate")

    def destroy(self) -> None:
        cu = _driver()
        for event in (self.start, self.end, self.copied, self.mid, self.resume, self.masks):
            cu.cuEventDestroy(event)


class GraphExecutor(FenceTimeline):
    """The executor interface (flare.execution.base) over captured CUDA graphs."""

    def __init__(self, owner, contract, buffers: dict, graph_execs: Sequence[int],
                 part_handles: dict[int, tuple[int, int]] | None = None, estimates_ns: Sequence[int] = ()):
        import torch

        cu = _driver()
        self.contract = contract
        # NOTE: driver calls need the context current on the calling thread; the runtime
        # calls from its own model thread, so every entry point makes it current once.
        self._context = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        self._context_threads = {threading.get_ident()}
        self._owner = owner  # keeps graphs, captured tensors and the memory pool alive
        self._execs = [cu.CUgraphExec(int(h)) for h in graph_execs]
        if len(set(int(h) for h in graph_execs)) != len(graph_execs):
            raise ExecutionError("graph executables are not unique")
        self._dev = {name: (t.data_ptr(), t.numel() * t.element_size()) for name, t in buffers.items()}
        self._capacities = {name: size for name, (_, size) in self._dev.items()}
        self._frame_buffer = buffers["step.frame"]
        flags = int(cu.CUstream_flags.CU_STREAM_NON_BLOCKING)
        self.model_stream = check(cu.cuStreamCreate(flags), "cuStreamCreate")
        self.copy_stream = check(cu.cuStreamCreate(flags), "cuStreamCreate")
        input_bytes = sum(size for name, (_, size) in self._dev.items() if not name.startswith("out."))
        outputs = {}
        for name in ("out.records", "out.logprobs", "out.top_ids"):
            t = buffers[name]
            outputs[name] = (tuple(t.shape[1:]), t.dtype)
        self._out_dev = {name: (buffers[name].data_ptr(), buffers[name][0].numel() * buffers[name].element_size())
                         for name in outputs}
        self._frames = [_Frame(torch, input_bytes + 64, outputs) for _ in range(FRAMES)]
        self._frame_values = [np.array([i], dtype=np.int64) for i in range(FRAMES)]
        self._pending: collections.deque = collections.deque()  # (fence, graph_index, frame index)
        self._free = collections.deque(range(FRAMES))
        self._next_fence = 1
        self._completed_fence = 0
        self._poison: ExecutionError | None = None
        self._held = None  # (fence, graph index, frame, staged inputs, staging end) of a held step
        self._split = [False] * FRAMES  # per frame: its step ran as two parts
        self._parts = {int(i): (cu.CUgraphExec(int(f)), cu.CUgraphExec(int(p)))
                       for i, (f, p) in (part_handles or {}).items()}
        self._closed = False
        self.drained = False
        self._estimates_ns = tuple(int(ns) for ns in estimates_ns)

    # -- interface ---------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    @property
    def graph_estimates_ns(self) -> tuple[int, ...]:
        return self._estimates_ns  # the capture's timed replays (model/capture.py)

    def can_submit(self) -> bool:
        return bool(self._free) and self._poison is None and not self._closed and self._held is None

    def _bind(self) -> None:
        thread = threading.get_ident()
        if thread not in self._context_threads:
            check(_driver().cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
            self._context_threads.add(thread)

    def _stage(self, frame: _Frame, uploads: Sequence[Upload], pos: int = 0) -> tuple[list, int]:
        """Validate every range and place it in the frame's staging buffer from ``pos``;
        returns the copies to enqueue ((device address, staging offset, bytes)) and the end."""
        plan = []
        for name, offset, data in uploads:
            size = upload_size(self._capacities, name, offset, data)
            if pos + size > frame.staging_np.shape[0] - 8:
                raise ExecutionError("uploads exceed the input frame")
            plan.append((self._dev[name][0] + offset, pos, size, data))
            pos += size
        for _, at, size, data in plan:
            frame.staging_np[at:at + size] = np.frombuffer(data, dtype=np.uint8)
        return plan, pos

    def _copy_in(self, frame: _Frame, plan: list, stream) -> None:
        cu = _driver()
        for dst, at, size, _ in plan:
            check(cu.cuMemcpyHtoDAsync(dst, frame.staging_ptr + at, size, stream), "cuMemcpyHtoDAsync")

    def _begin(self, index: int, plan: list, pos: int) -> None:
        """Inputs and the frame index onto the model stream, then the start event."""
        cu = _driver()
        frame = self._frames[index]
        self._copy_in(frame, plan, self.model_stream)
        frame.staging_np[pos:pos + 8] = self._frame_values[index].view(np.uint8)
        check(cu.cuMemcpyHtoDAsync(self._dev["step.frame"][0], frame.staging_ptr + pos, 8, self.model_stream),
              "cuMemcpyHtoDAsync")
        check(cu.cuEventRecord(frame.start, self.model_stream), "cuEventRecord")

    def _end(self, index: int) -> None:
        """The end event, then the completion copies behind it on the copy stream."""
        cu = _driver()
        frame = self._frames[index]
        check(cu.cuEventRecord(frame.end, self.model_stream), "cuEventRecord")
        copy = self.copy_stream
        check(cu.cuStreamWaitEvent(copy, frame.end, 0), "cuStreamWaitEvent")
        for name, (base, size) in self._out_dev.items():
            check(cu.cuMemcpyDtoHAsync(frame.outputs[name].data_ptr(), base + index * size, size, copy),
                  "cuMemcpyDtoHAsync")
        check(cu.cuEventRecord(frame.copied, copy), "cuEventRecord")

    def submit(self, graph_index: int, uploads: Sequence[Upload], grammar_constrained: bool = False) -> int:
        """Enqueue one graph; returns its fence. A grammar-constrained submission is held: a
        DECODE graph's forward part is enqueued now and its sampling part at ``release``
        (other kinds are enqueued whole at ``release``)."""
        self._bind()
        check_submission(poison=self._poison, closed=self._closed, held_fence=self._held_fence,
                         window_full=not self._free)
        cu = _driver()
        index = self._free[0]
        frame = self._frames[index]
        plan, pos = self._stage(frame, uploads)  # validates every range before anything is enqueued
        fence = self._next_fence
        parts = self._parts.get(graph_index) if grammar_constrained else None
        try:
            if grammar_constrained:
                if parts is not None:
                    self._begin(index, plan, pos)
                    check(cu.cuGraphLaunch(parts[0], self.model_stream), "cuGraphLaunch")
                    check(cu.cuEventRecord(frame.mid, self.model_stream), "cuEventRecord")
                self._held = (fence, graph_index, index, plan, pos + 8)
            else:
                self._begin(index, plan, pos)
                check(cu.cuGraphLaunch(self._execs[graph_index], self.model_stream), "cuGraphLaunch")
                self._end(index)
                self._split[index] = False
        except ExecutionError as exc:
            self._poison = exc
            raise
        self._free.popleft()
        self._next_fence += 1
        self._pending.append((fence, graph_index, index))
        return fence

    @property
    def _held_fence(self) -> int:
        return self._held[0] if self._held is not None else 0

    def release(self, fence: int, uploads: Sequence[Upload]) -> None:
        """Upload the held step's masks and enqueue its sampling (or, for a graph without
        parts, the whole step). The masks go up on the copy stream, so they overlap the
        forward part; the model stream waits for them."""
        self._bind()
        check_release(poison=self._poison, closed=self._closed, held_fence=self._held_fence, fence=fence,
                      uploads=uploads)
        cu = _driver()
        _, graph_index, index, plan, pos = self._held
        frame = self._frames[index]
        masks, _ = self._stage(frame, uploads, pos)
        parts = self._parts.get(graph_index)
        try:
            if parts is None:
                self._begin(index, plan + masks, pos - 8)
                check(cu.cuGraphLaunch(self._execs[graph_index], self.model_stream), "cuGraphLaunch")
            else:
                self._copy_in(frame, masks, self.copy_stream)
                check(cu.cuEventRecord(frame.masks, self.copy_stream), "cuEventRecord")
                check(cu.cuStreamWaitEvent(self.model_stream, frame.masks, 0), "cuStreamWaitEvent")
                check(cu.cuEventRecord(frame.resume, self.model_stream), "cuEventRecord")
                check(cu.cuGraphLaunch(parts[1], self.model_stream), "cuGraphLaunch")
            self._end(index)
        except ExecutionError as exc:
            self._poison = exc
            raise
        self._held = None
        self._split[index] = parts is not None

    def poll(self, timeout: float = 0.0) -> ExecutionCompletion | None:
        if not self._pending:
            return None
        self._bind()
        cu = _driver()
        fence, graph_index, index = self._pending[0]
        if fence == self._held_fence:
            return None  # a held step completes only after its release (its events are stale)
        frame = self._frames[index]
        deadline = time.monotonic() + timeout
        while True:
            status = cu.cuEventQuery(frame.copied)[0]
            if status == cu.CUresult.CUDA_SUCCESS:
                break
            if status != cu.CUresult.CUDA_ERROR_NOT_READY:
                error = ExecutionError(f"step at fence {fence} failed on the device: {status.name}")
                self._poison = error
                self._pending.popleft()
                self._free.append(index)
                return ExecutionCompletion(fence, graph_index, np.zeros(0), np.zeros(0), np.zeros(0), 0, error)
            if time.monotonic() >= deadline:
                return None
            # The completion a held step's release waits for, and a lone step's (a speculative
            # round: its drafts need its tokens), only yields the GIL instead of sleeping 200 us:
            # the device runs out of work when it completes.
            time.sleep(0 if self._held is not None or len(self._pending) == 1 else _POLL_SLEEP_S)
        if self._split[index]:  # device time of the two parts, not the host's mask work between
            ms = (check(cu.cuEventElapsedTime(frame.start, frame.mid), "cuEventElapsedTime")
                  + check(cu.cuEventElapsedTime(frame.resume, frame.end), "cuEventElapsedTime"))
        else:
            ms = check(cu.cuEventElapsedTime(frame.start, frame.end), "cuEventElapsedTime")
        out = frame.outputs
        completion = ExecutionCompletion(fence, graph_index, out["out.records"].numpy().copy(),
                                         out["out.logprobs"].numpy().copy(), out["out.top_ids"].numpy().copy(),
                                         int(ms * 1e6))
        self._pending.popleft()
        self._free.append(index)
        self._completed_fence = fence
        return completion

    def close(self) -> None:
        """Drain both streams, then release frames and the owner. Idempotent.

        If the drain cannot be confirmed, the frames and the owner are retained
        (leaked) rather than freed under a kernel that may still use them.
        """
        if self._closed and self.drained:
            return
        self._closed = True
        self._bind()
        cu = _driver()
        ok = True
        for stream in (self.model_stream, self.copy_stream):
            if cu.cuStreamSynchronize(stream)[0] != cu.CUresult.CUDA_SUCCESS:
                ok = False
        if not ok:
            raise ExecutionError("could not confirm that the CUDA streams drained; retaining device resources")
        self.drained = True
        self._pending.clear()
        for frame in self._frames:
            frame.destroy()
        self._frames = []
        cu.cuStreamDestroy(self.model_stream)
        cu.cuStreamDestroy(self.copy_stream)
        self._owner = None

    def __del__(self):
        try:
            if not self.drained:
                self.close()
        except Exception:  # noqa: BLE001 - a destructor must not raise; resources stay retained
            pass


def make_cuda_executor(loaded, progress: Progress | None = None) -> GraphExecutor:
    """Capture every graph of a loaded model, validate the execution manifest, and wrap
    them in a GraphExecutor."""
    from ..model.capture import capture_graphs
    from .manifest import ExecutionManifest

    owner = capture_graphs(loaded.programs, progress)
    ExecutionManifest.from_contract(loaded.contract, loaded.programs.buffers, owner.exec_handles).validate()
    return GraphExecutor(owner, loaded.contract, loaded.programs.buffers, owner.exec_handles, owner.part_handles,
                         owner.replay_ns)
