"""DashboardState: the scheduler pane's sums, history cells, retention limits and sample gaps."""

from __future__ import annotations

import numpy as np

from flare.dashboard.state import BUCKET_NS, DashboardState
from flare.engine.telemetry import EngineStats
from flare.engine.trace import Completion, RequestSample, RequestState

S = 1_000_000_000
GRAPHS = [("decode", "decode b8 t1"), ("prefill", "prefill b4 t128"), ("snapshot", "snapshot b1 t1"),
          ("speculative", "speculative b4 w5 rows20")]
T0 = 1_000 * S  # on a bucket boundary


def done(at_ns, graph, duration_ms, *keys):
    slots = np.array([k[0] for k in keys], np.int64)
    gens = np.array([k[1] for k in keys], np.int64)
    return Completion(at_ns, graph, int(duration_ms * 1e6), slots, gens)


def state_of(*completions, **kwargs):
    state = DashboardState(GRAPHS, **kwargs)
    state.add_completions(completions)
    return state


def test_graph_rows_sum_two_seconds_and_leave_untimed_calls_out_of_durations():
    now = T0 + 10 * S
    state = state_of(done(now - 3 * S, 0, 9.0, (1, 1)),  # outside the window
                     done(now - S, 0, 2.0, (1, 1), (2, 1)), done(now - S // 2, 0, 4.0, (1, 1), (2, 1)),
                     done(now - S // 4, 1, 6.0, (3, 1)), done(now - S // 8, 1, 0, (3, 1)))
    rows = {r.label: r for r in state.graph_rows(now)}
    decode, prefill = rows["decode b8 t1"], rows["prefill b4 t128"]
    assert (decode.calls, decode.mean_ms, decode.max_ms, decode.requests_per_call, decode.untimed) == (
        2, 3.0, 4.0, 2.0, 0)
    assert (prefill.calls, prefill.mean_ms, prefill.untimed) == (2, 6.0, 1)
    assert abs(decode.share - 0.5) < 1e-9 and abs(prefill.share - 0.5) < 1e-9
    assert [r.label for r in state.graph_rows(now)][0] in rows  # sorted by share, then calls
    only_untimed = state_of(done(now - S, 2, 0, (1, 1)))
    (row,) = only_untimed.graph_rows(now)
    assert row.mean_ms is None and row.untimed == 1 and row.share == 0.0


def test_history_cells_prefer_the_four_kinds_and_show_the_latest():
    now = T0 + 10 * S - 1
    b = BUCKET_NS
    state = state_of(done(T0 + 19 * b, 1, 1, (1, 1)), done(T0 + 19 * b + 1, 2, 1, (1, 1)),  # prefill then snapshot
                     done(T0 + 18 * b, 2, 1, (1, 1)),  # a snapshot alone
                     done(T0 + 17 * b, 0, 1, (1, 1)), done(T0 + 17 * b + 5, 3, 1, (1, 1)))  # decode, speculative
    (view,) = state.request_rows(now, 20)
    assert view.cells[-3:] == "SsP"
    assert view.cells[:17] == "." * 17
    assert view.phase == "retired" and view.gap_ms is None  # never sampled, not live
    (narrow,) = state.request_rows(now, 10)  # two buckets per cell: the later preferred mark
    assert narrow.cells[-2:] == "SP"


def test_reused_slots_are_separate_rows_and_live_rows_come_first():
    now = T0 + 5 * S
    state = state_of(done(now - 2 * S, 0, 1, (3, 1)), done(now - S, 0, 1, (3, 2), (4, 7)))
    sample = RequestSample(now - S // 10, (
        RequestState(4, 7, "decoding", 10, 10, 5, now - 3 * S, now - S, now - S // 2, 5),
        RequestState(3, 2, "prefilling", 64, 128, 0, now - 2 * S, now - S // 5, 0, 0)))
    state.set_sample(sample)
    views = state.request_rows(now, 10)
    assert [v.label for v in views] == ["3.2", "4.7", "3.1"]
    by = {v.label: v for v in views}
    assert by["3.1"].phase == "retired"
    assert by["3.2"].prompt == "64/128" and by["3.2"].out_ms is None  # nothing published yet
    assert abs(by["3.2"].gap_ms - (S // 5 - S // 10) / 1e6) < 1e-6
    assert abs(by["4.7"].gap_ms - (S - S // 10) / 1e6) < 1e-6  # since the last commit, at the sample
    assert abs(by["4.7"].out_ms - (S // 2 - S // 10) / 1e6) < 1e-6 and by["4.7"].bursts == "5"
    overview = state.overview(now)
    assert abs(overview.sample_age_s - 0.1) < 1e-9


def test_row_limit_drops_retired_rows_first_and_counts_them():
    now = T0 + 5 * S
    state = DashboardState(GRAPHS, max_rows=4)
    state.set_sample(RequestSample(now, (RequestState(1, 1, "decoding", 1, 1, 1, now, now, now, 1),)))
    state.add_completions([done(now - S, 0, 1, (1, 1))] + [done(now - S + i, 0, 1, (i, 1)) for i in range(2, 8)])
    assert len(state.rows) == 4 and state.rows_dropped == 3
    assert (1, 1) in state.rows  # the live one stays
    assert [v.label for v in state.request_rows(now, 10)] == ["1.1", "7.1", "6.1", "5.1"]


def test_retention_limit_marks_history_truncated():
    now = T0 + 9 * S
    state = state_of(*[done(T0 + i * S, 0, 1, (1, 1)) for i in range(8)], max_completions=4)
    assert state.evicted == 4 and state.truncated_before_ns(now) == T0 + 4 * S
    assert state.overview(now).truncated
    (view,) = state.request_rows(now, 20)
    assert view.cells.startswith("~" * 8) and "D" in view.cells  # before the oldest kept: unknown
    later = T0 + 20 * S  # the oldest kept completion is out of the window: nothing is missing
    assert not state.overview(later).truncated


def test_rates_and_gauges_come_from_the_statistics_window():
    state = DashboardState(GRAPHS)
    state.add_stats(T0, EngineStats(prompt_tokens=100, generated_tokens=10))
    assert state.overview(T0).prefill_tps is None
    state.add_stats(T0 + S // 2, EngineStats(prompt_tokens=600, generated_tokens=60, slots_live=3,
                                             requests_pending=2, requests_completed=7, requests_failed=1,
                                             prefix_reused_tokens=40, pages_cached=5, pages_reusable=90))
    o = state.overview(T0 + S // 2)
    assert (o.prefill_tps, o.generation_tps) == (1000.0, 100.0)
    assert (o.active, o.queued, o.completed, o.failed, o.reused_tokens, o.pages_cached, o.pages_free) == (
        3, 2, 7, 1, 40, 5, 90)
    assert not o.speculative and o.last_graph is None
    state.last_submitted = (3, 0)
    o = state.overview(T0 + S // 2)
    assert o.last_graph == "speculative b4 w5 rows20" and o.last_estimate_ms is None  # shown as ?
    for i in range(2, 12):
        state.add_stats(T0 + i * S // 2, EngineStats(prompt_tokens=600 + i, generated_tokens=60))
    assert T0 + 11 * S // 2 - state.stats[0][0] <= 2.5 * S  # the window stays about two seconds
