"""GraphReplayWorker against the real driver, replaying PyTorch-captured CUDA graphs.

The spec's raw replay qualification cases: changed device inputs between
completed submissions, different graph capacities in one shared pool, device
repetition counts, the owner's lifetime through close() and the destructor,
the capacity bound, launch failure, and an unconfirmed drain (in a child
process, since a device fault poisons the whole context). They qualify
interoperability and resource handling, not model numerics. Every assertion
message says what was expected and what the device held.
"""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
import weakref
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("cuda.bindings")

from cuda.bindings import driver as cu  # noqa: E402

from flare.errors import ExecutionError  # noqa: E402
from flare.execution.replay import (  # noqa: E402
    CudaCallError,
    GraphReplayWorker,
    ReplayBackpressure,
    current_context,
)
from tests.gpu.graphs import capture  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
REPO = Path(__file__).resolve().parents[2]
WAIT_MS = 60_000  # no case comes close; a hang fails instead of blocking the run


class Owner:
    """Keeps graphs, captured tensors and the pool alive, as preparation's owner does."""

    def __init__(self, **parts):
        self.__dict__.update(parts)


def check(result, what: str):
    if result[0] != cu.CUresult.CUDA_SUCCESS:
        raise AssertionError(f"test setup: {what} failed: {result[0].name}")
    return result[1] if len(result) == 2 else None


def handle(graph: torch.cuda.CUDAGraph) -> int:
    return int(graph.raw_cuda_graph_exec())


def spans(*tensors: torch.Tensor) -> list[tuple[int, int]]:
    return [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors]


def worker_for(owner: Owner, graphs, tensors, **kwargs) -> GraphReplayWorker:
    context, device = current_context()
    return GraphReplayWorker(owner, context, device, [handle(g) for g in graphs], spans(*tensors), **kwargs)


def next_completion(worker: GraphReplayWorker, what: str):
    completion = worker.poll(timeout_ms=WAIT_MS)
    assert completion is not None, f"{what}: no completion within {WAIT_MS} ms"
    assert completion.ok, f"{what}: replay failed: {completion.error}"
    return completion


def counter_graph():
    counter = torch.zeros(1, dtype=torch.int64, device=DEV)
    graph, _ = capture(lambda: counter.add_(1))
    counter.zero_()
    torch.cuda.synchronize()
    return graph, counter


def slow_graph(target_ms: float):
    """A matmul-plus-counter graph, and the repetitions that keep the device busy ~target_ms."""
    a = torch.randn(4096, 4096, dtype=torch.bfloat16, device=DEV) / 64
    c = torch.empty_like(a)
    counter = torch.zeros(1, dtype=torch.int64, device=DEV)

    def body():
        torch.matmul(a, a, out=c)
        counter.add_(1)

    graph, _ = capture(body)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    per_launch_ms = start.elapsed_time(end) / 20
    counter.zero_()
    torch.cuda.synchronize()
    return graph, counter, (a, c), max(1, math.ceil(target_ms / per_launch_ms))


# -- context ---------------------------------------------------------------------------------------------

def test_current_context_is_torch_context():
    torch.zeros(1, device=DEV)
    context, device = current_context()
    assert context != 0
    assert device == torch.cuda.current_device(), f"driver reports device {device}, torch uses " \
                                                   f"{torch.cuda.current_device()}"


# -- replay ----------------------------------------------------------------------------------------------

def test_device_repetition_counts():
    graph, counter = counter_graph()
    owner = Owner(graph=graph, counter=counter)
    worker = worker_for(owner, [graph], [counter])
    total = 0
    for repetitions in (1, 7, 250, 1):
        worker.submit(0, repetitions)
        completion = next_completion(worker, f"{repetitions} repetitions")
        total += repetitions
        assert completion.launched == repetitions
        assert counter.item() == total, f"after {repetitions} more launches the device counter is " \
                                        f"{counter.item()}, expected {total}"
    worker.close()


def test_changed_device_inputs_between_completed_submissions():
    x = torch.zeros(4096, dtype=torch.float32, device=DEV)
    y = torch.zeros_like(x)

    def body():
        torch.mul(x, 2.0, out=y)
        y.add_(1.0)

    graph, _ = capture(body)
    owner = Owner(graph=graph, x=x, y=y)
    worker = worker_for(owner, [graph], [x, y])
    gen = torch.Generator(device=DEV).manual_seed(7)
    for step in range(4):
        values = torch.randn(x.shape, generator=gen, device=DEV)
        x.copy_(values)
        torch.cuda.synchronize()  # the worker's stream does not wait on torch's stream
        worker.submit(0)
        next_completion(worker, f"input step {step}")
        expected = values * 2.0 + 1.0
        assert torch.equal(y, expected), f"step {step}: output differs from 2x+1 of the new input by " \
                                         f"{(y - expected).abs().max().item()}"
    worker.close()


def capacity_graphs():
    """Graphs of batch capacity 16, 4 and 1 in one pool, each with a pooled intermediate."""
    capacities = (16, 4, 1)  # captured largest first, as flare.model.capture does
    inp = torch.arange(16, dtype=torch.float32, device=DEV) + 1
    out = torch.zeros(16, dtype=torch.float32, device=DEV)
    pool = torch.cuda.graph_pool_handle()

    def body(b: int):
        def run():
            tmp = inp[:b] * 3.0  # from the shared pool; never escapes the graph
            out[:b].copy_(tmp + float(b))
        return run

    graphs = [capture(body(b), pool=pool)[0] for b in capacities]
    return capacities, graphs, inp, out, pool


def test_graphs_of_different_capacities():
    capacities, graphs, inp, out, pool = capacity_graphs()
    owner = Owner(graphs=graphs, inp=inp, out=out, pool=pool)
    worker = worker_for(owner, graphs, [inp, out])
    for index in (1, 0, 2, 1):
        b = capacities[index]
        out.fill_(-1.0)
        torch.cuda.synchronize()
        worker.submit(index)
        next_completion(worker, f"capacity {b}")
        expected = torch.full_like(out, -1.0)
        expected[:b] = inp[:b] * 3.0 + b
        assert torch.equal(out, expected), f"capacity {b}: rows {b}.. must stay untouched and rows ..{b} " \
                                           f"hold 3x+{b}; got {out.tolist()}"
    worker.close()


def test_submissions_share_one_stream_in_order():
    capacities, graphs, inp, out, pool = capacity_graphs()
    acc = torch.zeros(1, dtype=torch.float32, device=DEV)
    add_one, _ = capture(lambda: acc.add_(1.0), pool=pool)
    double, _ = capture(lambda: acc.copy_(acc * 2.0), pool=pool)  # pooled intermediate, aliased with the others
    acc.zero_()
    out.zero_()
    torch.cuda.synchronize()
    owner = Owner(graphs=graphs, add_one=add_one, double=double, tensors=(inp, out, acc), pool=pool)
    worker = worker_for(owner, [*graphs, add_one, double], [inp, out, acc], queue_capacity=16)
    # No polling in between: only one stream's ordering makes these results hold.
    order = [3, 0, 4, 1, 3, 2, 4, 3]  # acc: +1, x2, +1, x2, +1 -> 7; out: capacity 16, then 4, then 1
    tickets = [worker.submit(i) for i in order]
    done = [next_completion(worker, f"ordered submission {n}") for n in range(len(order))]
    assert [c.ticket for c in done] == tickets
    assert acc.item() == 7.0, f"+1, x2, +1, x2, +1 replayed out of order: acc is {acc.item()}, expected 7"
    expected = inp * 3.0 + 16.0
    expected[:4] = inp[:4] * 3.0 + 4.0
    expected[:1] = inp[:1] * 3.0 + 1.0
    assert torch.equal(out, expected), f"capacities 16, 4, 1 replayed out of order: {out.tolist()}"
    worker.close()


# -- capacity and the GIL --------------------------------------------------------------------------------

def test_capacity_bound_and_backpressure():
    slow, slow_counter, slow_tensors, repetitions = slow_graph(target_ms=50)
    graph, counter = counter_graph()
    owner = Owner(graphs=(slow, graph), tensors=(slow_counter, counter, *slow_tensors))
    worker = worker_for(owner, [slow, graph], [slow_counter, counter, *slow_tensors], queue_capacity=2)
    worker.submit(0, repetitions)
    worker.submit(1)
    assert not worker.can_submit()
    with pytest.raises(ReplayBackpressure):
        worker.submit(1)
    deadline = time.monotonic() + WAIT_MS / 1000
    while worker.ready < 2:
        assert time.monotonic() < deadline, "the two submissions never completed"
        time.sleep(0.001)
    with pytest.raises(ReplayBackpressure, match="unconsumed completions count"):
        worker.submit(1)  # both completed, neither consumed: capacity is still full
    assert worker.outstanding == 2
    assert next_completion(worker, "slow submission").launched == repetitions
    worker.submit(1)
    next_completion(worker, "counter")
    next_completion(worker, "counter again")
    assert counter.item() == 2 and slow_counter.item() == repetitions
    worker.close()


def test_poll_and_the_waiting_worker_release_the_gil():
    slow, counter, tensors, repetitions = slow_graph(target_ms=300)
    owner = Owner(graph=slow, tensors=(counter, *tensors))
    worker = worker_for(owner, [slow], [counter, *tensors])
    gaps = []
    stop = threading.Event()

    def spin():
        # Sleeps between iterations (so it does not slow the worker's launch loop down by
        # contending for the GIL) and records the longest time it could not run.
        last = time.perf_counter()
        worst = 0.0
        while not stop.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            worst = max(worst, now - last)
            last = now
        gaps.append(worst)

    spinner = threading.Thread(target=spin)
    spinner.start()
    worker.submit(0, repetitions)
    assert worker.poll() is None, "a 300 ms submission cannot have completed already"
    completion = next_completion(worker, "slow submission")
    stop.set()
    spinner.join()
    assert completion.elapsed_ns > 150e6, f"the device work took only {completion.elapsed_ns / 1e6:.0f} ms; " \
                                          f"the case needs a long synchronization to mean anything"
    assert gaps[0] < 0.05, f"a Python thread stalled {gaps[0] * 1e3:.0f} ms while poll() and the worker's " \
                           f"stream synchronization waited: the GIL was held"
    worker.close()


# -- owner lifetime --------------------------------------------------------------------------------------

def record_release(owner: Owner, counter: torch.Tensor) -> dict:
    seen: dict = {}

    def released(counter=counter):
        seen["counter"] = counter.item()  # device state when the owner goes

    weakref.finalize(owner, released)
    return seen


def busy_watched_worker(what: str):
    """A worker that alone holds its owner, whose release is watched, with two submissions
    of about 100 ms each still running. -> (worker, seen, released, repetitions)"""
    slow, counter, tensors, repetitions = slow_graph(target_ms=100)
    owner = Owner(graph=slow, tensors=tensors)
    seen = record_release(owner, counter)
    released = weakref.ref(owner)
    worker = worker_for(owner, [slow], [counter, *tensors])
    del owner
    worker.submit(0, repetitions)
    worker.submit(0, repetitions)
    assert worker.ready < 2, f"the work must still be running when {what}"
    return worker, seen, released, repetitions


def assert_released_after_the_drain(seen, released, repetitions: int, by: str) -> None:
    assert released() is None, f"{by} must release the owner after draining"
    assert seen["counter"] == 2 * repetitions, (
        f"the owner was released with the device counter at {seen['counter']}, "
        f"before the queued {2 * repetitions} launches drained")


def test_close_drains_before_releasing_the_owner():
    worker, seen, released, repetitions = busy_watched_worker("close() starts")
    worker.close()
    assert_released_after_the_drain(seen, released, repetitions, "close()")
    assert worker.drained
    assert [c.launched for c in (next_completion(worker, "first"), next_completion(worker, "second"))] == \
        [repetitions, repetitions]
    with pytest.raises(ExecutionError, match="closed"):
        worker.submit(0)
    worker.close()  # idempotent


def test_destructor_drains_before_releasing_the_owner():
    worker, seen, released, repetitions = busy_watched_worker("the worker is dropped")
    del worker
    gc.collect()
    assert_released_after_the_drain(seen, released, repetitions, "the destructor")


# -- failures --------------------------------------------------------------------------------------------

class AllocGraph:
    """A driver graph holding one unfreed allocation node: its second launch fails with
    CUDA_ERROR_INVALID_VALUE (cuGraphLaunch's documented rule), a non-sticky launch failure."""

    def __init__(self):
        self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        check(cu.cuStreamBeginCapture(self.stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              "cuStreamBeginCapture")
        self.ptr = check(cu.cuMemAllocAsync(1 << 20, self.stream), "cuMemAllocAsync")
        self.graph = check(cu.cuStreamEndCapture(self.stream), "cuStreamEndCapture")
        self.exec = check(cu.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")

    def destroy(self) -> None:
        # The allocation exists only if a launch succeeded; freeing it is housekeeping.
        cu.cuMemFreeAsync(self.ptr, self.stream)
        check(cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        check(cu.cuGraphExecDestroy(self.exec), "cuGraphExecDestroy")
        check(cu.cuGraphDestroy(self.graph), "cuGraphDestroy")
        check(cu.cuStreamDestroy(self.stream), "cuStreamDestroy")


def test_launch_failure_stops_later_launches_and_is_reported():
    graph, counter = counter_graph()
    alloc = AllocGraph()
    owner = Owner(graph=graph, counter=counter)
    alive = weakref.ref(owner)
    context, device = current_context()
    worker = GraphReplayWorker(owner, context, device, [handle(graph), int(alloc.exec)], spans(counter))
    del owner
    try:
        worker.submit(0)
        worker.submit(1, repetitions=2)
        worker.submit(0, repetitions=5)
        first, failed, skipped = (worker.poll(timeout_ms=WAIT_MS) for _ in range(3))
        assert first.ok and first.launched == 1
        assert isinstance(failed.error, CudaCallError), f"expected a launch failure, got {failed}"
        assert failed.error.operation == "cuGraphLaunch", str(failed.error)
        assert failed.error.status_name == "CUDA_ERROR_INVALID_VALUE", str(failed.error)
        assert failed.launched == 1, "the first launch of the allocation graph succeeds, the second fails"
        assert skipped.launched == 0 and "failed earlier" in str(skipped.error), str(skipped.error)
        assert counter.item() == 1, f"launches after the failure ran: the counter is {counter.item()}, expected 1"
        with pytest.raises(ExecutionError, match="CUDA_ERROR_INVALID_VALUE"):
            worker.close()
        gc.collect()
        assert worker.drained, "a launch failure is not a device fault: the drain must be confirmed"
        assert alive() is None, "a confirmed drain releases the owner even after a failure"
    finally:
        if not worker.closed:
            try:
                worker.close()
            except ExecutionError:
                pass  # the failure under test; the assertions above report what went wrong
        alloc.destroy()
    assert torch.zeros(1, device=DEV).add_(1).item() == 1.0, "the context must stay usable"


FAULT_SCRIPT = textwrap.dedent("""
    import gc, json, os, weakref
    import torch
    from flare.execution import replay
    from flare.execution.replay import GraphReplayWorker, current_context

    src = torch.arange(16, dtype=torch.float32, device="cuda")
    idx = torch.zeros(4, dtype=torch.int64, device="cuda")
    out = torch.empty(4, dtype=torch.float32, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.index_select(src, 0, idx, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        torch.index_select(src, 0, idx, out=out)
    idx.fill_(1 << 30)  # out of range: the captured kernel's device-side assert fires on replay
    torch.cuda.synchronize()

    class Owner:
        pass

    owner = Owner()
    owner.graph, owner.tensors = graph, (src, idx, out)
    alive = weakref.ref(owner)
    context, device = current_context()
    worker = GraphReplayWorker(owner, context, device, [int(graph.raw_cuda_graph_exec())],
                               [(t.data_ptr(), t.numel() * t.element_size()) for t in (src, idx, out)])
    del owner
    worker.submit(0)
    completion = worker.poll(timeout_ms=60000)
    result = {"completion": None if completion is None else
              {"launched": completion.launched, "error": str(completion.error),
               "operation": getattr(completion.error, "operation", None)}}
    try:
        worker.close()
        result["close"] = None
    except Exception as exc:
        result["close"] = str(exc)
    gc.collect()
    result["drained"] = worker.drained
    result["owner_retained"] = worker.owner_retained
    result["in_retained_list"] = any(o is alive() for o in replay._RETAINED)
    del worker
    gc.collect()
    result["alive_after_del"] = alive() is not None
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)  # the context is poisoned; skip teardown that would report it again
""")


def test_unconfirmed_drain_after_a_device_fault_retains_the_owner():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", FAULT_SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (f"child exited {proc.returncode} without a result\n"
                   f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    completion = result["completion"]
    assert completion is not None, f"no completion after the fault: {result}"
    assert completion["launched"] == 1, result
    assert completion["operation"] == "cuStreamSynchronize", f"the fault surfaces at synchronization: {result}"
    assert result["close"] and "could not confirm that the replay stream drained" in result["close"], result
    assert result["drained"] is False and result["owner_retained"] is True, result
    assert result["in_retained_list"] is True, result
    assert result["alive_after_del"] is True, f"the owner must be leaked, not freed, after a failed drain: {result}"
