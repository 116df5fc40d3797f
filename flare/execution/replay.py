"""GraphReplayWorker: raw replay of captured CUDA graph executables.

This is the spec's raw replay qualification primitive, not the serving loop's
frame pipeline (flare.execution.cuda.GraphExecutor). It qualifies that
executables captured by PyTorch replay correctly through the driver API and
that their owner outlives every launch:

- Registration checks span arithmetic of ``buffers`` (``(address, nbytes)``
  pairs) and that executable handles are unique; it cannot prove that the
  addresses are live. The owner must strongly retain every graph, captured
  tensor, memory pool and the context, and preparation must have finished
  warmup and synchronized before registration.
- One worker thread makes the given context current, creates one non-blocking
  stream, and for each submission launches the selected executable
  ``repetitions`` times, synchronizes the stream and emits a completion. Every
  submission shares that stream, so graphs that alias pooled scratch run
  serialized.
- Pending commands and unconsumed completions share one capacity bound: a
  completion nobody polled still occupies a place (backpressure on submit).
- The first failure (a launch or a synchronization) stops all later launches;
  later completions and ``close`` report it.
- ``close`` rejects new submissions, runs the queued ones, synchronizes,
  joins the thread, then releases the owner. If the stream drain cannot be
  confirmed the owner is retained for the life of the process (leaked) rather
  than freeing storage a queued kernel may still touch. A worker dropped
  without ``close`` attempts the same drain in its destructor; callers must
  close explicitly before interpreter finalization.

No CUDA context is created or destroyed here. Driver calls go through
cuda-python's ``cuda.bindings.driver`` (imported on first use, so importing
this module needs no GPU); those bindings release the GIL inside every call
(cuda-bindings release notes, 12.9.1 and 13.0.0), so a synchronizing worker
does not stall Python threads.
"""

from __future__ import annotations

import collections
import math
import sys
import threading
import time
from dataclasses import dataclass
from typing import Sequence

from ..errors import ExecutionError

DEFAULT_QUEUE_CAPACITY = 8
_ADDRESS_LIMIT = 1 << 64

# NOTE: owners whose stream drain could not be confirmed. A kernel queued on the
# stream may still read or write their storage, so they stay referenced until
# the process exits instead of being freed.
_RETAINED: list = []


def _driver():
    from cuda.bindings import driver
    return driver


class CudaCallError(ExecutionError):
    """A driver call returned an error; keeps the operation and the CUDA status."""

    def __init__(self, operation: str, status, context: str = ""):
        self.operation = operation
        self.status_code = int(status)
        self.status_name = getattr(status, "name", str(status))
        message = f"{operation} failed: {self.status_name} ({self.status_code})"
        super().__init__(f"{context}: {message}" if context else message)


class ReplayBackpressure(ExecutionError):
    """The shared capacity is full: poll() completions before submitting again."""

    code = "replay_backpressure"


@dataclass(frozen=True)
class ReplayCompletion:
    """The outcome of one submission, emitted after its stream synchronization."""

    ticket: int  # the value submit() returned
    graph_index: int
    repetitions: int  # launches requested
    launched: int  # launches the driver accepted (== repetitions on success)
    elapsed_ns: int  # host time from the first launch until the stream synchronized
    error: ExecutionError | None = None  # this submission's failure, or the earlier one that stopped it

    @property
    def ok(self) -> bool:
        return self.error is None


def _call(result, operation: str, context: str = ""):
    """Unpack a cuda-python ``(CUresult, ...)`` tuple, raising CudaCallError on failure."""
    status = result[0]
    if status != _driver().CUresult.CUDA_SUCCESS:
        raise CudaCallError(operation, status, context)
    return result[1] if len(result) == 2 else None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def current_context() -> tuple[int, int]:
    """``(context_handle, device_ordinal)`` of the CUDA context current on the calling thread."""
    cu = _driver()
    try:
        _call(cu.cuInit(0), "cuInit")
        context = int(_call(cu.cuCtxGetCurrent(), "cuCtxGetCurrent"))
    except ExecutionError:
        raise
    except Exception as exc:  # noqa: BLE001 - no libcuda: report it as an execution failure
        raise ExecutionError(f"the CUDA driver is not available: {exc}") from exc
    if context == 0:
        raise ExecutionError("no CUDA context is current on this thread; create one first "
                             "(for example by allocating a CUDA tensor)")
    device = int(_call(cu.cuCtxGetDevice(), "cuCtxGetDevice"))
    return context, device


def _check_graph_execs(graph_execs) -> tuple[int, ...]:
    handles = []
    for index, handle in enumerate(graph_execs):
        try:
            value = int(handle)
        except (TypeError, ValueError):
            raise ExecutionError(f"graph executable {index} is not a handle: {handle!r}") from None
        if isinstance(handle, (bool, float)) or not 0 < value < _ADDRESS_LIMIT:
            raise ExecutionError(f"graph executable {index} must be a non-null 64-bit handle, got {handle!r}")
        handles.append(value)
    if not handles:
        raise ExecutionError("at least one graph executable is required")
    first: dict[int, int] = {}
    for index, value in enumerate(handles):
        if value in first:
            raise ExecutionError(f"graph executable {index} ({value:#x}) duplicates executable {first[value]}; "
                                 f"executables must be unique")
        first[value] = index
    return tuple(handles)


def _check_spans(buffers) -> tuple[tuple[int, int], ...]:
    spans = []
    for index, span in enumerate(buffers):
        try:
            address, nbytes = span
        except (TypeError, ValueError):
            raise ExecutionError(f"buffer {index} must be an (address, nbytes) pair, got {span!r}") from None
        if not _is_int(address) or not _is_int(nbytes):
            raise ExecutionError(f"buffer {index} must hold integers, got ({address!r}, {nbytes!r})")
        if address <= 0 or nbytes <= 0:
            raise ExecutionError(f"buffer {index} [{address:#x} + {nbytes}] needs a non-null address "
                                 f"and a positive size")
        if address + nbytes > _ADDRESS_LIMIT:
            raise ExecutionError(f"buffer {index} [{address:#x} + {nbytes}] wraps past the 64-bit address space")
        spans.append((address, nbytes))
    return tuple(spans)


class _ReplayState:
    """What the caller and the worker thread share; never the worker handle itself,
    so a handle nobody references can be finalized and drain."""

    def __init__(self, owner, capacity: int):
        self.cond = threading.Condition(threading.RLock())
        self.owner = owner
        self.capacity = capacity
        self.commands: collections.deque = collections.deque()  # (ticket, graph_index, repetitions)
        self.completions: collections.deque[ReplayCompletion] = collections.deque()
        self.next_ticket = 1
        self.accepted = 0
        self.consumed = 0
        self.closing = False  # submissions are rejected
        self.started = False  # the thread has its context and stream, or failed to
        self.start_error: ExecutionError | None = None
        self.finished = False  # the thread left its loop and attempted the drain
        self.drained = False  # the final synchronization succeeded (or no stream existed)
        self.drain_error: ExecutionError | None = None
        self.failure: ExecutionError | None = None  # the first launch or synchronization failure
        self.release_on_exit = False  # close() ran on the worker thread itself (a finalizer)
        self.retained = False

    @property
    def outstanding(self) -> int:
        return self.accepted - self.consumed

    def on_started(self, error: ExecutionError | None) -> None:
        with self.cond:
            self.started = True
            self.start_error = error
            self.cond.notify_all()

    def take(self):
        """The next command, or None once closing with nothing queued."""
        with self.cond:
            while not self.commands and not self.closing:
                self.cond.wait()
            return self.commands.popleft() if self.commands else None

    def put(self, completion: ReplayCompletion) -> None:
        with self.cond:
            if completion.error is not None and self.failure is None:
                self.failure = completion.error
            self.completions.append(completion)
            self.cond.notify_all()

    def retain_owner(self) -> None:
        with self.cond:
            if self.owner is not None:
                _RETAINED.append(self.owner)
                self.owner = None
                self.retained = True


def _replay(cu, stream, execs, command, failure: ExecutionError | None) -> ReplayCompletion:
    ticket, index, repetitions = command
    if failure is not None:
        error = ExecutionError(f"ticket {ticket} (graph {index}) was not launched: the worker failed earlier: "
                               f"{failure}")
        error.__cause__ = failure
        return ReplayCompletion(ticket, index, repetitions, 0, 0, error)
    where = f"ticket {ticket} (graph {index})"
    launched = 0
    error = None
    start = time.perf_counter_ns()
    try:
        for _ in range(repetitions):
            status = cu.cuGraphLaunch(execs[index], stream)[0]
            if status != cu.CUresult.CUDA_SUCCESS:
                error = CudaCallError("cuGraphLaunch", status, f"{where} launch {launched + 1} of {repetitions}")
                break
            launched += 1
        # NOTE: synchronize after a failed launch too, so a completion only ever
        # reports work that is no longer running.
        status = cu.cuStreamSynchronize(stream)[0]
        if status != cu.CUresult.CUDA_SUCCESS and error is None:
            error = CudaCallError("cuStreamSynchronize", status, f"{where} after {launched} launches")
    except Exception as exc:  # noqa: BLE001 - a raising binding is a failure like any other
        error = error or ExecutionError(f"{where}: driver call raised {exc!r}")
    return ReplayCompletion(ticket, index, repetitions, launched, time.perf_counter_ns() - start, error)


def _serve(state: _ReplayState, cu, context: int, device: int, execs: tuple) -> None:
    """The worker thread: bind the context, replay commands in order, drain at the end."""
    stream = None
    try:
        try:
            _call(cu.cuCtxSetCurrent(cu.CUcontext(context)), "cuCtxSetCurrent", "replay worker start")
            actual = int(_call(cu.cuCtxGetDevice(), "cuCtxGetDevice", "replay worker start"))
            if actual != device:
                raise ExecutionError(f"context {context:#x} belongs to device {actual}, not device {device}")
            stream = _call(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate",
                           "replay worker start")
        except Exception as exc:  # noqa: BLE001 - reported to the constructor
            state.on_started(exc if isinstance(exc, ExecutionError)
                             else ExecutionError(f"replay worker start failed: {exc!r}"))
            return
        state.on_started(None)
        while (command := state.take()) is not None:
            state.put(_replay(cu, stream, execs, command, state.failure))
    except BaseException as exc:  # noqa: BLE001 - never leave pollers waiting on a dead thread
        with state.cond:
            if state.failure is None:
                state.failure = ExecutionError(f"replay worker thread stopped: {exc!r}")
    finally:
        _finish(state, cu, stream)


def _finish(state: _ReplayState, cu, stream) -> None:
    drained, drain_error = True, None
    if stream is not None:
        try:
            status = cu.cuStreamSynchronize(stream)[0]
            if status == cu.CUresult.CUDA_SUCCESS:
                cu.cuStreamDestroy(stream)
            else:
                drained = False
                drain_error = CudaCallError("cuStreamSynchronize", status,
                                            "could not confirm that the replay stream drained; the owner is retained")
        except Exception as exc:  # noqa: BLE001
            drained = False
            drain_error = ExecutionError(f"could not confirm that the replay stream drained ({exc!r}); "
                                         f"the owner is retained")
    owner = None
    with state.cond:
        state.closing = True
        # Only after an unexpected stop are commands left; complete them so counts stay whole.
        while state.commands:
            ticket, index, repetitions = state.commands.popleft()
            state.completions.append(ReplayCompletion(
                ticket, index, repetitions, 0, 0,
                ExecutionError(f"ticket {ticket} (graph {index}) was not launched: {state.failure}")))
        state.finished = True
        state.drained = drained
        state.drain_error = drain_error
        if state.release_on_exit:
            if drained:
                owner, state.owner = state.owner, None
            else:
                state.retain_owner()
        state.cond.notify_all()
    del owner  # NOTE: outside the lock, so an owner finalizer may re-enter close()


class GraphReplayWorker:
    """Replays registered graph executables on one worker thread and stream (see module docs)."""

    def __init__(self, owner, context, device: int, graph_execs: Sequence[int], buffers: Sequence[tuple[int, int]],
                 queue_capacity: int = DEFAULT_QUEUE_CAPACITY):
        try:
            context_value = int(context)
        except (TypeError, ValueError):
            raise ExecutionError(f"context must be a CUcontext handle, got {context!r}") from None
        if isinstance(context, bool) or not 0 < context_value < _ADDRESS_LIMIT:
            raise ExecutionError(f"context must be a non-null CUcontext handle, got {context!r}")
        if not _is_int(device) or device < 0:
            raise ExecutionError(f"device must be a device ordinal, got {device!r}")
        if not _is_int(queue_capacity) or queue_capacity < 1:
            raise ExecutionError(f"queue_capacity must be a positive integer, got {queue_capacity!r}")
        handles = _check_graph_execs(graph_execs)
        self.buffers = _check_spans(buffers)
        self.context = context_value
        self.device = device
        cu = _driver()
        execs = tuple(cu.CUgraphExec(h) for h in handles)
        self._num_graphs = len(handles)
        state = _ReplayState(owner, queue_capacity)
        thread = threading.Thread(target=_serve, args=(state, cu, context_value, device, execs),
                                  name="flare-graph-replay", daemon=True)
        self._state = state
        self._thread = thread
        thread.start()
        with state.cond:
            while not state.started:
                state.cond.wait()
            error = state.start_error
        if error is not None:
            thread.join()
            with state.cond:
                state.owner = None  # nothing was launched, so nothing can still use it
            raise error

    # -- submission and completion ----------------------------------------------------------

    def submit(self, graph_index: int, repetitions: int = 1) -> int:
        """Queue ``repetitions`` launches of one executable; returns the completion's ticket.

        Raises ReplayBackpressure when pending commands plus unconsumed
        completions fill ``queue_capacity``, ExecutionError once closed.
        """
        if not _is_int(graph_index) or not 0 <= graph_index < self._num_graphs:
            raise ExecutionError(f"graph index {graph_index!r} is outside the {self._num_graphs} "
                                 f"registered executables")
        if not _is_int(repetitions) or repetitions < 1:
            raise ExecutionError(f"repetitions must be a positive integer, got {repetitions!r}")
        state = self._state
        with state.cond:
            if state.closing:
                stopped = f" (worker failure: {state.failure})" if state.failure else ""
                raise ExecutionError(f"the replay worker is closed; submissions are rejected{stopped}")
            if state.outstanding >= state.capacity:
                raise ReplayBackpressure(f"{state.outstanding} submissions occupy the replay capacity of "
                                         f"{state.capacity} (unconsumed completions count); poll() before "
                                         f"submitting again")
            ticket = state.next_ticket
            state.next_ticket += 1
            state.accepted += 1
            state.commands.append((ticket, graph_index, repetitions))
            state.cond.notify_all()
        return ticket

    def poll(self, timeout_ms: float = 0) -> ReplayCompletion | None:
        """The next completion in ticket order, waiting up to ``timeout_ms`` (``math.inf``: no limit).

        Returns None at once when nothing is outstanding. The wait is a
        condition wait, which releases the GIL.
        """
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not timeout_ms >= 0:
            raise ExecutionError(f"timeout_ms must be a non-negative number, got {timeout_ms!r}")
        deadline = None if math.isinf(timeout_ms) else time.monotonic() + timeout_ms / 1000.0
        state = self._state
        with state.cond:
            while not state.completions:
                if state.outstanding == 0 or state.finished:
                    return None
                if deadline is None:
                    state.cond.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                state.cond.wait(remaining)
            completion = state.completions.popleft()
            state.consumed += 1
            state.cond.notify_all()
            return completion

    # -- state --------------------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Accepted submissions whose completion has not been consumed by poll()."""
        return self._state.outstanding

    @property
    def ready(self) -> int:
        """Completions emitted and waiting for poll() (they still occupy capacity)."""
        return len(self._state.completions)

    @property
    def queue_capacity(self) -> int:
        return self._state.capacity

    @property
    def num_graphs(self) -> int:
        return self._num_graphs

    def can_submit(self) -> bool:
        state = self._state
        with state.cond:
            return not state.closing and state.outstanding < state.capacity

    @property
    def closed(self) -> bool:
        return self._state.closing

    @property
    def drained(self) -> bool:
        """True once the worker thread confirmed that its stream drained."""
        state = self._state
        return state.finished and state.drained

    @property
    def failure(self) -> ExecutionError | None:
        """The first launch or synchronization failure, if any."""
        return self._state.failure

    @property
    def owner_retained(self) -> bool:
        """True when a failed drain left the owner referenced for the life of the process."""
        return self._state.retained

    # -- teardown -----------------------------------------------------------------------------

    def close(self) -> None:
        """Reject new submissions, run the queued ones, drain, join, then release the owner.

        Idempotent. Raises ExecutionError, every time it is called, when a
        launch or synchronization failed or when the drain could not be
        confirmed; in the latter case the owner stays retained.
        """
        state = self._state
        with state.cond:
            state.closing = True
            state.cond.notify_all()
            if threading.current_thread() is self._thread:
                # A finalizer running on the worker thread cannot join it: the thread
                # drains once this returns and releases (or retains) the owner itself.
                state.release_on_exit = True
                return
        self._thread.join()
        owner = None
        with state.cond:
            if state.drained:
                owner, state.owner = state.owner, None
            else:
                state.retain_owner()
            failure, drain_error = state.failure, state.drain_error
        del owner  # NOTE: released outside the lock: an owner finalizer may re-enter close()
        if drain_error is not None:
            detail = f" after an earlier failure: {failure}" if failure is not None else ""
            raise ExecutionError(f"replay worker close: {drain_error}{detail}") from drain_error
        if failure is not None:
            raise ExecutionError(f"replay worker close: the worker failed: {failure}") from failure

    def __del__(self):
        state = getattr(self, "_state", None)
        if state is None or getattr(self, "_thread", None) is None:
            return
        if state.finished and state.owner is None:
            return
        # NOTE: a destructor must not raise; a failure stays recorded on the state and
        # a failed drain has already retained the owner.
        try:
            if sys.is_finalizing():
                # Daemon threads cannot be joined during interpreter teardown: keep the
                # owner, as a failed drain would.
                state.retain_owner()
                return
            self.close()
        except Exception:  # noqa: BLE001
            pass
