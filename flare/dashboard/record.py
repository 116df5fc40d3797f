"""A dashboard state written as JSON and read back: the snapshot tests' recorded sample.

``tools/dashboard_record.py`` records one from the demo engine under traffic; the tests
render it at fixed widths and compare with golden files. The record holds everything the
panes read: graph labels, the statistics of the rate window, the retained completions, the
latest request sample, the dropped count, the last submitted graph and the time it was taken.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..engine.telemetry import EngineStats
from ..engine.trace import Completion, RequestSample, RequestState
from .state import MAX_COMPLETIONS, DashboardState


def to_json(state: DashboardState, now_ns: int) -> dict[str, Any]:
    def stats(s: EngineStats) -> dict[str, Any]:
        return {f.name: getattr(s, f.name) if f.name != "launches" else dict(s.launches)
                for f in dataclasses.fields(s)}

    return {
        "now_ns": now_ns,
        "graphs": [list(g) for g in state.graphs],
        "speculative": state.speculative,
        "stats": [[t, stats(s)] for t, s in state.stats],
        "completions": [[c.at_ns, c.graph_index, c.duration_ns, c.slots.tolist(), c.generations.tolist()]
                        for c in state.completions],
        "sample": None if state.sample is None else {
            "at_ns": state.sample.at_ns,
            "requests": [dataclasses.asdict(r) for r in state.sample.requests]},
        "dropped": state.dropped,
        "last_submitted": list(state.last_submitted) if state.last_submitted else None,
    }


def from_json(data: dict[str, Any], *, max_completions: int = MAX_COMPLETIONS) -> tuple[DashboardState, int]:
    """The recorded state and its time; a smaller ``max_completions`` replays the retention limit."""
    state = DashboardState([tuple(g) for g in data["graphs"]], speculative=data["speculative"],
                           max_completions=max_completions)
    for t, fields in data["stats"]:
        state.add_stats(t, EngineStats(**fields))
    state.add_completions(Completion(at, g, d, np.array(slots, np.int64), np.array(gens, np.int64))
                          for at, g, d, slots, gens in data["completions"])
    if data["sample"] is not None:
        sample = data["sample"]
        state.set_sample(RequestSample(sample["at_ns"], tuple(RequestState(**r) for r in sample["requests"])))
    state.dropped = data["dropped"]
    state.last_submitted = tuple(data["last_submitted"]) if data["last_submitted"] else None
    return state, data["now_ns"]
