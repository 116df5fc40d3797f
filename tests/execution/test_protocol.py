"""The Executor protocol (flare/execution/base.py) names every parameter its implementations take.

CpuExecutor, GraphExecutor, FakeExecutor and TensorParallelExecutor are driven by the same runtime code, so each
protocol member must exist on each of them with the same parameters, defaults and kinds;
and the grammar-constrained rule (reserved for structured output) holds on the fake too.
"""

from __future__ import annotations

import inspect

import pytest

from flare.contract import GraphKind, PreparedContract
from flare.errors import ExecutionError
from flare.execution.base import Executor
from flare.execution.cpu import CpuExecutor
from flare.execution.cuda import GraphExecutor
from flare.execution.ranks import TensorParallelExecutor
from flare.testing.fake_executor import FakeExecutor

IMPLEMENTATIONS = (CpuExecutor, GraphExecutor, FakeExecutor, TensorParallelExecutor)
MEMBERS = ("next_fence", "outstanding", "completed_fence", "graph_estimates_ns", "can_submit", "submit", "poll",
           "release", "close")


def _parameters(member) -> list[tuple[str, object, object]]:
    if isinstance(member, property):
        member = member.fget
    return [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]


def test_the_protocol_lists_the_members_the_runtime_uses():
    declared = {name for name in vars(Executor) if not name.startswith("_")}
    assert declared == set(MEMBERS)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", MEMBERS)
def test_every_implementation_takes_the_protocols_parameters(impl, name):
    declared, actual = getattr(Executor, name), inspect.getattr_static(impl, name, None)
    if actual is None:  # FenceTimeline provides next_fence/completed_fence as properties
        actual = getattr(impl, name)
    assert isinstance(actual, property) == isinstance(declared, property), name
    assert _parameters(actual) == _parameters(declared), f"{impl.__name__}.{name}"


def test_the_fake_holds_a_grammar_constrained_step_until_its_release():
    contract = PreparedContract.build(max_active=2, context=256, prefill_chunk_size=64, num_pages=8,
                                      num_snapshot_rows=2, vocab_size=32, hidden_size=8)
    ex = FakeExecutor(contract, manual=True)
    decode = contract.graph(GraphKind.DECODE, 1).index
    first = ex.submit(decode, [])
    held = ex.submit(decode, [], grammar_constrained=True)  # one step may be in flight before it
    assert ex.outstanding == 2 and not ex.can_submit()
    with pytest.raises(ExecutionError, match="must be released first"):
        ex.submit(decode, [])
    with pytest.raises(ExecutionError, match="not a held"):
        ex.release(first, [])
    with pytest.raises(ExecutionError, match="may upload only slot.grammar_mask"):
        ex.release(held, [("step.slots", 0, b"\0" * 8)])
    ex.step(2)
    assert ex.poll().fence == first and ex.poll() is None  # the held step waits for its masks
    ex.release(held, [("slot.grammar_mask", 0, b"\xff" * 4)])
    ex.step()
    assert ex.poll().fence == held and ex.can_submit()
    ex.submit(decode, [])
