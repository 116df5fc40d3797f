"""GraphExecutor on real captured graphs: the spec's two-frame executor cases."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from flare.contract import FRAMES, REC_CONSUMED, REC_SLOT, REC_TOKEN0, GraphKind
from flare.errors import ExecutionError
from flare.request import SamplingParams
from tests.model.harness import Harness, check_held_decode, save_tiny
from tests.model.test_parity_tiny import _make, _prompt


@pytest.fixture(scope="module")
def h(tmp_path_factory):
    ckpt = save_tiny(_make("llama"), tmp_path_factory.mktemp("ckpt"))
    harness = Harness.export(ckpt, tmp_path_factory.mktemp("core") / "core", context=1024, chunk=128,
                             device="cuda", max_active=8)
    yield harness
    harness.executor.close()


def _ready(h, slots):
    for s in slots:
        h.admit(s, generation=100 + s)
        h.prefill(s, _prompt(s, 20 + s), 0, [20 + s])


def test_physical_slot_scatter(h):
    """Rows of a batch scatter their records to their physical slots, whatever the row order."""
    _ready(h, [3, 7])
    out = h.decode([3, 7])
    assert set(out) == {3, 7}
    h.inputs.set_rows([7, 3], 2)
    graph = h.contract.graph(GraphKind.DECODE, 2)
    h.executor.submit(graph.index, h.inputs.take())
    done = h.executor.poll(timeout=30)
    assert done.records[3, REC_SLOT] == 3 and done.records[7, REC_SLOT] == 7
    assert done.records[3, REC_CONSUMED] == h.position(3) and done.records[7, REC_CONSUMED] == h.position(7)
    assert done.records[5, REC_SLOT] in (0, 5)  # a slot outside the cohort is untouched


def test_graph_capacities_agree(h):
    """The same two requests decoded in b=2, b=4 and b=8 graphs produce the same tokens."""
    results = []
    for cap in (2, 4, 8):
        _ready(h, [1, 2])
        tokens = []
        for _ in range(4):
            h.inputs.set_rows([1, 2], cap)
            h.executor.submit(h.contract.graph(GraphKind.DECODE, cap).index, h.inputs.take())
            done = h.executor.poll(timeout=30)
            tokens.append((int(done.records[1, REC_TOKEN0]), int(done.records[2, REC_TOKEN0])))
        results.append(tokens)
    assert results[0] == results[1] == results[2]


def test_partial_uploads_change_only_their_range(h):
    table = h.programs.buffers["slot.page_table"]
    before = table.clone()
    h.inputs.set_pages(5, 3, [40, 41])
    graph = h.contract.graph(GraphKind.DECODE, 1)
    h.inputs.set_rows([0], 1)  # a padding-only step: uploads still apply
    h.executor.submit(graph.index, h.inputs.take())
    assert h.executor.poll(timeout=30).error is None
    after = table.clone()
    changed = (after != before).nonzero().tolist()
    assert changed == [[5, 3], [5, 4]] and after[5, 3] == 41 and after[5, 4] == 42


def test_frames_then_backpressure_and_order(h):
    _ready(h, [1])
    graph = h.contract.graph(GraphKind.DECODE, 1)
    h.inputs.set_rows([1], 1)
    fences = [h.executor.submit(graph.index, h.inputs.take()) for _ in range(FRAMES)]
    assert h.executor.outstanding == FRAMES and not h.executor.can_submit()
    with pytest.raises(ExecutionError, match="frames"):
        h.executor.submit(graph.index, [])
    done = [h.executor.poll(timeout=30) for _ in fences]
    assert [d.fence for d in done] == fences
    consumed = [int(d.records[1, REC_CONSUMED]) for d in done]
    assert consumed == list(range(consumed[0], consumed[0] + FRAMES))  # resident state advanced, each frame its own
    assert all(d.duration_ns > 0 for d in done)


def test_a_grammar_submission_is_held_until_its_release(h):
    """The spec's grammar serialization case, as Flare departs from it: a grammar-constrained
    step may follow one in flight, nothing follows it until its release, and it completes after."""
    graph = h.contract.graph(GraphKind.DECODE, 1)
    h.inputs.set_rows([0], 1)
    first = h.executor.submit(graph.index, h.inputs.take())
    held = h.executor.submit(graph.index, [], grammar_constrained=True)
    assert not h.executor.can_submit()
    with pytest.raises(ExecutionError, match="released first"):
        h.executor.submit(graph.index, [])
    assert h.executor.poll(timeout=30).fence == first
    assert h.executor.poll(timeout=0.2) is None  # its sampling waits for the masks
    with pytest.raises(ExecutionError, match="may upload only"):
        h.executor.release(held, [("step.slots", 0, bytes(8))])
    h.executor.release(held, [])
    done = h.executor.poll(timeout=30)
    assert done.fence == held and done.error is None and done.duration_ns > 0
    assert h.executor.can_submit()


@pytest.mark.parametrize("greedy_graph", [False, True], ids=["general", "greedy"])
def test_a_held_decode_step_samples_with_the_masks_of_its_release(h, greedy_graph):
    """Captured forward and sampling parts: the same tokens as the whole graph, and the
    masks uploaded on the copy stream while the forward part ran are the ones applied."""
    check_held_decode(h, _prompt(33, 40), greedy_graph=greedy_graph)

def test_changed_resident_inputs_take_effect(h):
    """Uploading a new sampling row between steps changes what the next step samples."""
    _ready(h, [2])
    graph = h.contract.graph(GraphKind.DECODE, 1)
    h.inputs.set_rows([2], 1)
    greedy = []
    for _ in range(3):
        h.executor.submit(graph.index, h.inputs.take())
        greedy.append(int(h.executor.poll(timeout=30).records[2, REC_TOKEN0]))
    _ready(h, [2])
    h.inputs.admit_slot(2, generation=102, position=h.position(2), seed=7,
                        params=SamplingParams(temperature=50.0, top_k=0))
    sampled = []
    for _ in range(3):
        h.executor.submit(graph.index, h.inputs.take())
        sampled.append(int(h.executor.poll(timeout=30).records[2, REC_TOKEN0]))
    assert sampled != greedy


def test_rejected_uploads_leave_the_executor_usable(h):
    graph = h.contract.graph(GraphKind.DECODE, 1)
    with pytest.raises(ExecutionError, match="unknown"):
        h.executor.submit(graph.index, [("no.such.buffer", 0, b"\0" * 8)])
    with pytest.raises(ExecutionError, match="exceeds"):
        h.executor.submit(graph.index, [("step.slots", 10 ** 6, b"\0" * 8)])
    with pytest.raises(ExecutionError):
        h.executor.submit(graph.index, [("out.records", 0, b"\0" * 8)])
    assert h.executor.can_submit() and h.executor.outstanding == 0
    h.inputs.set_rows([0], 1)
    h.executor.submit(graph.index, h.inputs.take())
    assert h.executor.poll(timeout=30).error is None


def test_the_capture_times_every_graph(h):
    """Each captured graph is replayed once more at load and timed (model/capture.py): the
    scheduler's first estimates. The module's other tests run on graphs replayed that way."""
    estimates = h.executor.graph_estimates_ns
    assert len(estimates) == len(h.contract.graphs)
    assert all(0 < ns < 5_000_000_000 for ns in estimates), estimates


def test_a_loaded_model_starts_from_the_captured_timings(tmp_path):
    from flare.config import EngineConfig
    from flare.core.export import ExportOptions, export_core
    from flare.engine.model import NativeModel
    from tests.runtime.speculative_support import run

    ckpt = save_tiny(_make("llama"), tmp_path / "ckpt")
    export_core(ckpt, tmp_path / "core", ExportOptions(context=512, prefill_chunk_size=64, max_active=4,
                                                       dtype="bfloat16", mixed_prefill=True))
    model = NativeModel.load(tmp_path / "core", EngineConfig(device="cuda", kv_memory_bytes=64 << 20))
    try:
        timing, seeds = model.runtime.scheduler.timing, model.executor.graph_estimates_ns
        assert len(seeds) == len(model.loaded.contract.graphs)
        assert [timing.estimate_ns(i) for i in range(len(seeds))] == list(seeds)
        tokens = run(model, list(range(3, 40)), temperature=0.0, max_tokens=8, ignore_eos=True)[0]
        assert len(tokens) == 8
        used = {i for i in range(len(seeds)) if timing.estimate_ns(i) != seeds[i]}
        assert used, "the steps served replace the seeds of their graphs"
    finally:
        model.close()


def _fresh_executor(tmp_path):
    from flare.execution.cuda import GraphExecutor
    from flare.model.capture import capture_graphs

    ckpt = save_tiny(_make("qwen3"), tmp_path / "ckpt")
    harness = Harness.export(ckpt, tmp_path / "core", context=256, chunk=64, device="cuda", max_active=2)
    harness.executor.close()
    owner = capture_graphs(harness.programs)
    return harness, GraphExecutor(owner, harness.contract, harness.programs.buffers, owner.exec_handles), owner


def test_owner_retained_until_close_drains(tmp_path):
    harness, ex, owner = _fresh_executor(tmp_path)
    ref = weakref.ref(owner)
    del owner
    graph = harness.contract.graph(GraphKind.DECODE, 1)
    for _ in range(2):
        ex.submit(graph.index, [])
    gc.collect()
    assert ref() is not None  # queued work still references captured memory
    ex.close()
    assert ex.drained and ex.outstanding == 0
    harness.programs = harness.model = None
    gc.collect()
    assert ref() is None
    ex.close()  # idempotent


def test_destructor_drains(tmp_path):
    harness, ex, owner = _fresh_executor(tmp_path)
    ref = weakref.ref(owner)
    del owner
    graph = harness.contract.graph(GraphKind.DECODE, 1)
    ex.submit(graph.index, [])
    del ex
    gc.collect()
    torch.cuda.synchronize()
    harness.programs = harness.model = None
    gc.collect()
    assert ref() is None
