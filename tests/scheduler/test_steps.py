"""The step-kind registry (flare/scheduler/steps/): one module per GraphKind.

Every graph kind has exactly one StepKind, the kinds' phases partition the runnable
phases, and the launch names the registry gives agree with what the runtime reports
and the metrics export.
"""

from __future__ import annotations

from flare.contract import GraphKind
from flare.engine.telemetry import GRAPH_KINDS
from flare.scheduler.plan import Phase
from flare.scheduler.steps import DECODE, LAUNCH_NAMES, ROW_STEPS, STEPS


def test_every_graph_kind_has_one_step_module():
    assert set(STEPS) == set(GraphKind)
    assert all(step.kind == kind for kind, step in STEPS.items())
    assert len({type(step).__module__ for step in STEPS.values()}) == len(STEPS)
    # SPECULATIVE's candidates come from scheduler/speculation.py (they need the proposer)
    speculative = STEPS[GraphKind.SPECULATIVE]
    assert set(ROW_STEPS) | {DECODE, speculative} == set(STEPS.values())
    assert DECODE not in ROW_STEPS and speculative not in ROW_STEPS


def test_the_step_phases_partition_the_runnable_phases():
    phases = [phase for step in STEPS.values() for phase in step.phases]
    assert len(phases) == len(set(phases))
    assert set(phases) == {p for p in Phase if Phase.INITIALIZING <= p <= Phase.FINISHING}
    # MIXED serves no phase of its own: it carries PREFILL's and DECODE's rows in one step
    assert STEPS[GraphKind.MIXED].phases == ()
    assert {ph for k in STEPS[GraphKind.MIXED].combines for ph in STEPS[k].phases} == {Phase.PREFILLING,
                                                                                       Phase.DECODING}


def test_launch_names_are_exported_metric_kinds():
    # The runtime reports launches under these names (engine/runtime.py reads LAUNCH_NAMES).
    assert set(LAUNCH_NAMES) == set(GraphKind)
    assert set(LAUNCH_NAMES.values()) <= set(GRAPH_KINDS)


def test_only_speculative_steps_report_more_than_one_new_token():
    from flare.contract import RECORD_TOKENS

    assert all(step.max_new_tokens == 1 for kind, step in STEPS.items() if kind != GraphKind.SPECULATIVE)
    # a verification emits its accepted drafts and the token after them, one record's tokens at most
    assert STEPS[GraphKind.SPECULATIVE].max_new_tokens == RECORD_TOKENS
