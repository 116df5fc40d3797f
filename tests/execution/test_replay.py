"""GraphReplayWorker queueing and teardown on the CPU, over a fake driver (tests/execution/fake_driver.py).

tests/gpu/test_replay.py runs the same semantics against the real driver with
PyTorch-captured graphs.
"""

from __future__ import annotations

import gc
import math
import subprocess
import sys
import threading
import time
import weakref

import pytest
from cuda.bindings import driver as real_driver

from flare.errors import ExecutionError
from flare.execution import replay
from flare.execution.replay import (
    CudaCallError,
    GraphReplayWorker,
    ReplayBackpressure,
    ReplayCompletion,
    current_context,
)
from tests.execution.fake_driver import FakeDriver

EXECS = [0xE000, 0xE100, 0xE200]
SPANS = [(0x10000, 256), (0x20000, 64)]
WAIT_S = 5.0  # upper bound for anything a test waits on; nothing should come close


class Owner:
    """Stands in for the object that keeps graphs and captured tensors alive."""


@pytest.fixture
def fake(monkeypatch) -> FakeDriver:
    driver = FakeDriver()
    monkeypatch.setattr(replay, "_driver", lambda: driver)
    yield driver
    driver.gate.set()  # never leave a worker thread blocked in a synchronization


def make(fake: FakeDriver, owner=None, **kwargs) -> GraphReplayWorker:
    return GraphReplayWorker(owner if owner is not None else Owner(), fake.context, fake.device,
                             kwargs.pop("execs", EXECS), kwargs.pop("buffers", SPANS), **kwargs)


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


def poll_all(worker: GraphReplayWorker, count: int) -> list[ReplayCompletion]:
    out = []
    for _ in range(count):
        completion = worker.poll(timeout_ms=WAIT_S * 1000)
        assert completion is not None, f"completion {len(out) + 1} of {count} did not arrive"
        out.append(completion)
    return out


# -- registration -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("execs, message", [
    ([], "at least one graph executable"),
    ([0xE000, 0xE100, 0xE000], "executable 2 (0xe000) duplicates executable 0"),
    ([0xE000, 0], "graph executable 1 must be a non-null"),
    ([-5], "non-null 64-bit handle"),
    ([1 << 64], "non-null 64-bit handle"),
    ([1.5], "non-null 64-bit handle"),
    ([True], "non-null 64-bit handle"),
    (["graph"], "graph executable 0 is not a handle"),
])
def test_registration_rejects_bad_executables(fake, execs, message):
    with pytest.raises(ExecutionError) as info:
        make(fake, execs=execs)
    assert message in str(info.value)


def test_executables_may_be_cuda_python_handles(fake):
    worker = make(fake, execs=[real_driver.CUgraphExec(h) for h in EXECS])
    worker.submit(2)
    assert poll_all(worker, 1)[0].ok
    assert fake.launches == [EXECS[2]]
    worker.close()


@pytest.mark.parametrize("buffers, message", [
    ([(0x1000, 0)], "buffer 0 [0x1000 + 0] needs a non-null address and a positive size"),
    ([(0x1000, 8), (0, 8)], "buffer 1 [0x0 + 8] needs a non-null address"),
    ([(0x1000, -8)], "positive size"),
    ([((1 << 64) - 8, 16)], "wraps past the 64-bit address space"),
    ([(0x1000, 8.0)], "must hold integers"),
    ([(0x1000,)], "must be an (address, nbytes) pair"),
    ([0x1000], "must be an (address, nbytes) pair"),
])
def test_registration_checks_span_arithmetic(fake, buffers, message):
    with pytest.raises(ExecutionError) as info:
        make(fake, buffers=buffers)
    assert message in str(info.value)


def test_aliased_spans_are_accepted(fake):
    # Graphs may share pooled scratch; the shared stream serializes them.
    worker = make(fake, buffers=[(0x1000, 256), (0x1080, 256), (0x1000, 256)])
    assert worker.buffers == ((0x1000, 256), (0x1080, 256), (0x1000, 256))
    worker.close()


@pytest.mark.parametrize("kwargs, message", [
    (dict(queue_capacity=0), "queue_capacity must be a positive integer"),
    (dict(queue_capacity=2.0), "queue_capacity"),
    (dict(device=-1), "device must be a device ordinal"),
    (dict(context=0), "non-null CUcontext"),
    (dict(context=None), "context must be a CUcontext handle"),
])
def test_registration_rejects_bad_arguments(fake, kwargs, message):
    args = dict(owner=Owner(), context=fake.context, device=fake.device, graph_execs=EXECS, buffers=SPANS)
    args.update(kwargs)
    with pytest.raises(ExecutionError, match=message.replace("(", r"\(")):
        GraphReplayWorker(**args)
    assert not fake.streams, "no stream may be created for rejected arguments"


def test_start_failure_on_a_foreign_context_is_raised_and_releases_the_owner(fake):
    owner = Owner()
    released = weakref.ref(owner)
    with pytest.raises(CudaCallError) as info:
        GraphReplayWorker(owner, fake.context + 1, 0, EXECS, SPANS)
    assert info.value.operation == "cuCtxSetCurrent"
    assert info.value.status_name == "CUDA_ERROR_INVALID_CONTEXT"
    del owner, info
    gc.collect()
    assert released() is None, "nothing was launched, so the owner must not be retained"
    assert not fake.streams


def test_start_failure_on_a_device_mismatch(fake):
    with pytest.raises(ExecutionError, match=f"context {fake.context:#x} belongs to device 0, not device 1"):
        GraphReplayWorker(Owner(), fake.context, 1, EXECS, SPANS)


# -- replay ---------------------------------------------------------------------------------------------

def test_submissions_replay_in_order_with_their_repetitions(fake):
    worker = make(fake)
    tickets = [worker.submit(0), worker.submit(1, repetitions=3), worker.submit(2, repetitions=2)]
    assert tickets == [1, 2, 3]
    done = poll_all(worker, 3)
    assert [(c.ticket, c.graph_index, c.repetitions, c.launched, c.ok) for c in done] == [
        (1, 0, 1, 1, True), (2, 1, 3, 3, True), (3, 2, 2, 2, True)]
    assert all(c.elapsed_ns >= 0 for c in done)
    assert fake.launches == [EXECS[0]] + [EXECS[1]] * 3 + [EXECS[2]] * 2
    assert fake.syncs == 3, "each submission synchronizes the stream once"
    assert worker.outstanding == 0
    worker.close()


def test_one_worker_thread_with_the_context_current_and_one_non_blocking_stream(fake):
    worker = make(fake)
    for index in (0, 1, 2, 1):
        worker.submit(index)
    poll_all(worker, 4)
    assert threading.get_ident() not in fake.launch_threads
    assert len(fake.launch_threads) == 1, "every launch comes from the one worker thread"
    assert fake.launch_contexts == {fake.context}, "the worker thread made the given context current"
    assert fake.streams == [(0x5000, int(real_driver.CUstream_flags.CU_STREAM_NON_BLOCKING))]
    worker.close()
    assert fake.destroyed == [0x5000], "a drained stream is destroyed"


def test_submit_rejects_bad_arguments(fake):
    worker = make(fake)
    for index in (-1, 3, 1.0, None):
        with pytest.raises(ExecutionError, match="outside the 3 registered executables"):
            worker.submit(index)
    for repetitions in (0, -2, 1.5, True):
        with pytest.raises(ExecutionError, match="repetitions must be a positive integer"):
            worker.submit(0, repetitions)
    assert worker.outstanding == 0
    worker.close()


# -- poll ------------------------------------------------------------------------------------------------

def test_poll_without_outstanding_work_returns_at_once(fake):
    worker = make(fake)
    start = time.monotonic()
    assert worker.poll(timeout_ms=10_000) is None
    assert worker.poll(timeout_ms=math.inf) is None
    assert time.monotonic() - start < 1.0
    worker.close()


def test_poll_times_out_while_work_is_on_the_device(fake):
    worker = make(fake)
    fake.gate.clear()
    worker.submit(0)
    assert worker.poll() is None
    start = time.monotonic()
    assert worker.poll(timeout_ms=30) is None
    assert time.monotonic() - start >= 0.025
    fake.gate.set()
    assert worker.poll(timeout_ms=math.inf).ticket == 1
    worker.close()


@pytest.mark.parametrize("timeout", [-1, math.nan, "5", True, None])
def test_poll_rejects_bad_timeouts(fake, timeout):
    worker = make(fake)
    with pytest.raises(ExecutionError, match="timeout_ms must be a non-negative number"):
        worker.poll(timeout_ms=timeout)
    worker.close()


def test_poll_releases_the_gil_while_waiting(fake):
    worker = make(fake)
    fake.gate.clear()
    worker.submit(0)
    spins = 0
    stop = threading.Event()

    def spin():
        nonlocal spins
        while not stop.is_set():
            spins += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    threading.Timer(0.1, fake.gate.set).start()
    completion = worker.poll(timeout_ms=WAIT_S * 1000)
    stop.set()
    spinner.join()
    assert completion is not None and completion.ok
    assert spins > 10_000, f"another Python thread ran only {spins} iterations while poll() waited 100 ms"
    worker.close()


# -- capacity --------------------------------------------------------------------------------------------

def test_capacity_bounds_pending_commands(fake):
    worker = make(fake, queue_capacity=2)
    fake.gate.clear()
    worker.submit(0)
    worker.submit(1)
    assert not worker.can_submit()
    with pytest.raises(ReplayBackpressure, match="2 submissions occupy the replay capacity of 2") as info:
        worker.submit(2)
    assert isinstance(info.value, ExecutionError)
    assert worker.outstanding == 2
    fake.gate.set()
    assert poll_all(worker, 1)[0].ticket == 1
    assert worker.submit(2) == 3, "a consumed completion frees its place"
    assert [c.ticket for c in poll_all(worker, 2)] == [2, 3]
    worker.close()


def test_unconsumed_completions_occupy_capacity(fake):
    worker = make(fake, queue_capacity=2)
    worker.submit(0)
    worker.submit(1)
    wait_for(lambda: worker.ready == 2, "both completions")
    assert worker.outstanding == 2
    with pytest.raises(ReplayBackpressure):
        worker.submit(2)
    assert worker.poll().ticket == 1
    assert worker.outstanding == 1
    worker.submit(2)
    assert [c.ticket for c in poll_all(worker, 2)] == [2, 3]
    worker.close()


# -- close and the owner's lifetime ----------------------------------------------------------------------

def watch_release(fake: FakeDriver, owner: Owner, worker_thread: list) -> dict:
    """Record what was true when the owner was released."""
    seen: dict = {}

    def released():
        seen["launches"] = len(fake.launches)
        seen["syncs"] = fake.syncs
        seen["destroyed"] = list(fake.destroyed)
        seen["thread_alive"] = worker_thread[0].is_alive()
        seen["at"] = time.monotonic()

    weakref.finalize(owner, released)
    return seen


def watched_worker(fake: FakeDriver):
    """A worker that alone holds its owner, whose release is watched; the device is held
    (the gate closed) so submitted work stays queued. -> (worker, seen, released)"""
    owner = Owner()
    worker = make(fake, owner)
    seen = watch_release(fake, owner, [worker._thread])
    fake.gate.clear()
    return worker, seen, weakref.ref(owner)


def test_close_runs_queued_work_drains_joins_then_releases_the_owner(fake):
    worker, seen, released = watched_worker(fake)
    worker.submit(0, repetitions=2)
    worker.submit(1)
    worker.submit(2, repetitions=4)
    closer = threading.Thread(target=worker.close)
    closer.start()
    wait_for(lambda: worker.closed, "close() to start")
    with pytest.raises(ExecutionError, match="closed; submissions are rejected"):
        worker.submit(0)
    time.sleep(0.02)
    assert closer.is_alive(), "close() returned while work was still on the device"
    assert released() is not None
    fake.gate.set()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    assert released() is None
    assert seen["launches"] == 7, "the owner was released before the queued launches ran"
    assert seen["syncs"] == 4, "three submissions and the final drain synchronize before release"
    assert seen["destroyed"] == [0x5000]
    assert seen["thread_alive"] is False, "the owner was released before the thread was joined"
    assert worker.drained and not worker.owner_retained
    # Completions of the queued work stay pollable after close.
    assert [(c.ticket, c.launched) for c in poll_all(worker, 3)] == [(1, 2), (2, 1), (3, 4)]
    worker.close()  # idempotent
    worker.close()
    assert fake.syncs == 4


def test_destructor_of_an_unclosed_worker_drains_before_releasing_the_owner(fake):
    worker, seen, released = watched_worker(fake)
    worker.submit(1, repetitions=5)
    gate_opened = []
    threading.Timer(0.05, lambda: (gate_opened.append(time.monotonic()), fake.gate.set())).start()
    del worker
    gc.collect()
    assert released() is None
    assert seen["launches"] == 5
    assert seen["thread_alive"] is False
    assert seen["at"] >= gate_opened[0], "the owner was released while work was still on the device"


def test_owner_finalizer_may_reenter_close(fake):
    owner = Owner()
    worker = make(fake, owner)
    calls = []

    def on_release():
        calls.append("finalizer")
        worker.close()  # re-enters close() while the outer close() releases the owner

    weakref.finalize(owner, on_release)
    del owner
    worker.submit(0)
    worker.close()
    assert calls == ["finalizer"]
    assert worker.drained


def test_close_from_the_worker_thread_lets_the_thread_drain_and_release(fake):
    owner = Owner()
    worker = make(fake, owner)
    released = weakref.ref(owner)
    del owner
    fake.gate.clear()
    worker.submit(0)
    wait_for(lambda: fake.launches == [EXECS[0]], "the first launch")
    worker.submit(1)

    def finalizer_on_worker_thread():
        fake.on_launch = None
        worker.close()  # e.g. a garbage-collected handle finalized on the worker thread

    fake.on_launch = finalizer_on_worker_thread
    worker.submit(2)
    fake.gate.set()
    wait_for(lambda: worker.drained, "the worker thread to drain")
    wait_for(lambda: released() is None, "the worker thread to release the owner")
    assert fake.launches == EXECS, "queued submissions still run after close() on the worker thread"
    worker.close()


# -- failures --------------------------------------------------------------------------------------------

def test_launch_failure_stops_later_launches_and_is_reported_on_later_tickets_and_close(fake):
    fake.fail_launch[EXECS[1]] = (1, real_driver.CUresult.CUDA_ERROR_INVALID_VALUE)
    owner = Owner()
    released = weakref.ref(owner)
    worker = make(fake, owner)
    del owner
    worker.submit(0)
    worker.submit(1, repetitions=3)
    worker.submit(2)
    ok, failed, skipped = poll_all(worker, 3)
    assert ok.ok and ok.launched == 1
    assert isinstance(failed.error, CudaCallError)
    assert failed.error.operation == "cuGraphLaunch"
    assert failed.error.status_code == 1 and failed.error.status_name == "CUDA_ERROR_INVALID_VALUE"
    assert failed.launched == 1 and failed.repetitions == 3
    assert "ticket 2 (graph 1) launch 2 of 3" in str(failed.error)
    assert skipped.launched == 0
    assert "ticket 3 (graph 2) was not launched: the worker failed earlier" in str(skipped.error)
    assert "CUDA_ERROR_INVALID_VALUE" in str(skipped.error)
    assert fake.launches == [EXECS[0], EXECS[1]], "no launch may follow the failure"
    assert worker.failure is failed.error
    worker.submit(0)  # accepted, and reported rather than launched
    assert not poll_all(worker, 1)[0].ok
    assert fake.launches == [EXECS[0], EXECS[1]]
    for _ in range(2):  # reported by every close
        with pytest.raises(ExecutionError, match="the worker failed: ticket 2 .* CUDA_ERROR_INVALID_VALUE"):
            worker.close()
    gc.collect()
    assert worker.drained and released() is None, "the drain succeeded, so the owner is released"


def test_unconfirmed_drain_retains_the_owner(fake):
    owner = Owner()
    released = weakref.ref(owner)
    worker = make(fake, owner)
    del owner
    fake.sync_status = real_driver.CUresult.CUDA_ERROR_ILLEGAL_ADDRESS
    worker.submit(0, repetitions=2)
    completion = poll_all(worker, 1)[0]
    assert completion.launched == 2
    assert completion.error.operation == "cuStreamSynchronize"
    assert "CUDA_ERROR_ILLEGAL_ADDRESS (700)" in str(completion.error)
    try:
        with pytest.raises(ExecutionError, match="could not confirm that the replay stream drained; "
                                                 "the owner is retained"):
            worker.close()
        with pytest.raises(ExecutionError, match="could not confirm"):
            worker.close()
        del worker
        gc.collect()
        assert released() is not None, "an undrained owner must be leaked, not freed"
        assert any(o is released() for o in replay._RETAINED)
        assert fake.destroyed == [], "an undrained stream is not destroyed"
    finally:
        replay._RETAINED[:] = [o for o in replay._RETAINED if o is not released()]


def test_destructor_with_unconfirmed_drain_retains_the_owner(fake):
    owner = Owner()
    released = weakref.ref(owner)
    worker = make(fake, owner)
    del owner
    fake.sync_status = real_driver.CUresult.CUDA_ERROR_LAUNCH_FAILED
    worker.submit(1)
    try:
        del worker
        gc.collect()
        assert released() is not None
    finally:
        replay._RETAINED[:] = [o for o in replay._RETAINED if o is not released()]


# -- current_context ---------------------------------------------------------------------------------------

def test_current_context_reports_the_bound_context_and_device(fake):
    fake.device = 3
    fake.bind()
    assert current_context() == (fake.context, 3)


def test_current_context_without_a_context_is_an_error(fake):
    with pytest.raises(ExecutionError, match="no CUDA context is current"):
        current_context()


def test_current_context_without_a_driver_is_an_execution_error():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA driver is present")
    with pytest.raises(ExecutionError, match="CUDA driver is not available"):
        current_context()


def test_importing_the_module_needs_no_cuda():
    code = ("import sys, flare.execution.replay, flare.execution.manifest; "
            "assert 'cuda.bindings.driver' not in sys.modules; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
