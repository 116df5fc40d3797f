"""Both panes rendered from a recorded telemetry sample at 80 and 120 columns (golden files).

tests/dashboard/recorded.json was recorded from the demo engine under traffic by
``python tools/dashboard_record.py --record tests/dashboard/recorded.json``. The "limits"
goldens replay the same completions through a small completion ring that the dashboard did
not drain in time (dropped updates) and a small retention limit (truncated history).
Regenerate the goldens after an intended change with ``FLARE_UPDATE_GOLDEN=1``.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from flare.dashboard.record import from_json
from flare.dashboard.render import PANES, View, frame
from flare.dashboard.state import DashboardState
from flare.engine.trace import CompletionTrace

HERE = Path(__file__).parent
RECORDED = json.loads((HERE / "recorded.json").read_text())
GOLDEN = HERE / "golden"


def render(state: DashboardState, now_ns: int, pane: str, width: int, height: int = 24) -> str:
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    console.print(frame(state, now_ns, View(pane=pane, width=width, height=height, title="Flare · demo")))
    return console.export_text()


def limited_state() -> tuple[DashboardState, int]:
    """The recording seen through a 16-completion ring drained only once, kept 12 deep."""
    state, now = from_json(RECORDED, max_completions=12)
    trace = CompletionTrace(capacity=16)
    for at, graph, duration, slots, gens in RECORDED["completions"]:
        trace.record(graph, duration, np.array(slots), np.array(gens))
    fresh = DashboardState(state.graphs, max_completions=12)
    fresh.stats, fresh.last_submitted = state.stats, state.last_submitted
    # the ring kept the first 16 with the recorder's own clock: put the recorded times back
    drained = trace.drain()
    fresh.add_completions(c._replace(at_ns=RECORDED["completions"][i][0]) for i, c in enumerate(drained))
    fresh.set_sample(state.sample)
    fresh.dropped = trace.dropped
    return fresh, RECORDED["now_ns"]


def check(name: str, text: str) -> None:
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("FLARE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with FLARE_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from {path}; FLARE_UPDATE_GOLDEN=1 rewrites it"


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("pane", PANES)
def test_panes_match_golden(pane, width):
    state, now = from_json(RECORDED)
    text = render(state, now, pane, width)
    check(f"{pane}-{width}", text)
    assert max(len(line) for line in text.splitlines()) <= width
    assert "dropped 0" in text and "history truncated" not in text
    if pane == "scheduler":
        assert "Calls" in text and "Mean ms" in text and "Share" in text and "last submitted:" in text
        assert ("Max ms" in text) == (width >= 100) and ("Req/call" in text) == (width >= 100)
    else:
        assert "prefill tok/s" in text and "generation tok/s" in text and "KV pages cached/free" in text
    assert ("Out ms" in text) == (width >= 100) and ("Bursts" in text) == (width >= 100)
    for request in RECORDED["sample"]["requests"]:
        assert f"{request['slot']}.{request['generation']}" in text


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("pane", PANES)
def test_limits_match_golden(pane, width):
    state, now = limited_state()
    assert state.dropped == len(RECORDED["completions"]) - 16 > 0
    text = render(state, now, pane, width)
    check(f"{pane}-limits-{width}", text)
    assert f"dropped {state.dropped}" in text and "history truncated" in text
    assert "~" in text  # the truncated cells


def test_scroll_moves_the_request_rows():
    state, now = from_json(RECORDED)
    rows = state.request_rows(now, 10)
    console = Console(width=80, file=io.StringIO(), record=True, color_system=None)
    console.print(frame(state, now, View(pane="overview", width=80, height=14, scroll=2)))
    text = console.export_text()
    assert "requests 3-" in text and f"of {len(rows)}" in text
    assert rows[0].label not in [line.split()[0] for line in text.splitlines() if line.strip()]


def test_up_moves_the_rows_at_once_after_scrolling_past_the_end():
    from flare.dashboard.app import Dashboard, parse_keys

    state, now = from_json(RECORDED)
    total = len(state.request_rows(now, 10))
    dashboard = Dashboard(object(), stream=io.StringIO())
    dashboard.state = state

    def shown() -> str:
        console = Console(width=80, file=io.StringIO(), record=True, color_system=None)
        console.print(dashboard.screen(now, 80, 14))
        return next(line for line in console.export_text().splitlines() if line.startswith("requests "))

    first = shown()
    assert first.startswith("requests 1-") and f"of {total}" in first
    per_page = int(first.split()[1].split("-")[1])
    assert per_page < total  # the last page starts past the first
    dashboard.press(parse_keys(b"\x1b[6~" * 3))  # PageDown far past the end
    last_page = total - per_page
    assert shown().startswith(f"requests {last_page + 1}-{total} of {total}")
    assert dashboard.scroll == last_page  # the position is the page shown, not the keys pressed
    dashboard.press(parse_keys(b"\x1b[A"))
    assert shown().startswith(f"requests {last_page}-{total - 1} of {total}")


def test_speculative_figures_show_once_speculation_exists():
    state, now = from_json(RECORDED)
    assert "DEPTH" not in render(state, now, "overview", 120)
    state.speculative = True  # served with --speculative copy|draft
    text = render(state, now, "overview", 120)
    for figure in ("drafter steps", "verification steps", "acceptance length", "DEPTH"):
        assert figure in text
