"""A stand-in for the slice of ``cuda.bindings.driver`` that GraphReplayWorker calls.

It plays one device so the worker's queueing and teardown run on the CPU
(the spec qualifies the same behaviour with explicit native test functions;
tests/gpu/test_replay.py runs the real driver). Types and status codes are the
real cuda-python ones, which import without a GPU.

- Launches are recorded in order, with the thread and the context bound on it.
- ``gate`` plays the GPU: a stream synchronization blocks until it is set, so a
  test can hold submitted work "on the device" and observe the host side.
- ``fail_launch[handle] = (successes, status)`` makes launches of one executable
  fail after that many successes; ``sync_status`` fails synchronizations.
- ``on_launch`` runs inside cuGraphLaunch (on the worker thread).
"""

from __future__ import annotations

import threading
from typing import Callable

from cuda.bindings import driver as _real

SUCCESS = _real.CUresult.CUDA_SUCCESS


class FakeDriver:
    CUresult = _real.CUresult
    CUcontext = _real.CUcontext
    CUgraphExec = _real.CUgraphExec
    CUstream_flags = _real.CUstream_flags

    def __init__(self, *, context: int = 0xC0DE00, device: int = 0):
        self.context = context
        self.device = device
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()
        self.launches: list[int] = []  # executable handle of every accepted launch, in order
        self.launch_threads: set[int] = set()
        self.launch_contexts: set[int] = set()
        self.fail_launch: dict[int, tuple[int, object]] = {}
        self.sync_status = SUCCESS
        self.syncs = 0
        self.streams: list[tuple[int, int]] = []  # (stream, flags) created
        self.destroyed: list[int] = []
        self.on_launch: Callable[[], None] | None = None
        self._bound = threading.local()
        self._counts: dict[int, int] = {}

    # -- context ---------------------------------------------------------------------------

    def bind(self, context: int | None = None) -> None:
        """Make a context current on the calling thread, as a CUDA runtime would."""
        self._bound.context = self.context if context is None else context

    def _current(self) -> int:
        return getattr(self._bound, "context", 0)

    def cuInit(self, flags):
        return (SUCCESS,)

    def cuCtxGetCurrent(self):
        return (SUCCESS, _real.CUcontext(self._current()))

    def cuCtxSetCurrent(self, context):
        if int(context) != self.context:
            return (_real.CUresult.CUDA_ERROR_INVALID_CONTEXT,)
        self._bound.context = int(context)
        return (SUCCESS,)

    def cuCtxGetDevice(self):
        if self._current() != self.context:
            return (_real.CUresult.CUDA_ERROR_INVALID_CONTEXT, None)
        return (SUCCESS, _real.CUdevice(self.device))

    # -- streams and graphs ----------------------------------------------------------------

    def cuStreamCreate(self, flags):
        with self.lock:
            stream = 0x5000 + len(self.streams)
            self.streams.append((stream, int(flags)))
        return (SUCCESS, _real.CUstream(stream))

    def cuStreamDestroy(self, stream):
        with self.lock:
            self.destroyed.append(int(stream))
        return (SUCCESS,)

    def cuGraphLaunch(self, graph_exec, stream):
        if self.on_launch is not None:
            self.on_launch()
        handle = int(graph_exec)
        with self.lock:
            done = self._counts.get(handle, 0)
            rule = self.fail_launch.get(handle)
            if rule is not None and done >= rule[0]:
                return (rule[1],)
            self._counts[handle] = done + 1
            self.launches.append(handle)
            self.launch_threads.add(threading.get_ident())
            self.launch_contexts.add(self._current())
        return (SUCCESS,)

    def cuStreamSynchronize(self, stream):
        self.gate.wait()
        with self.lock:
            self.syncs += 1
        return (self.sync_status,)
