"""The dashboard's two panes as rich renderables (pure: a state and a size in, a frame out).

:func:`frame` draws the header, the selected pane (the throughput overview or the
scheduler's graphs), the request rows and the status line with the latest log lines. The
snapshot tests render it from a recorded sample at fixed sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .state import GRAPH_WINDOW_S, HISTORY_S, DashboardState, GraphRow, Overview, RequestView

PANES = ("overview", "scheduler")
PANE_TITLES = {"overview": "Throughput", "scheduler": "Scheduler"}
WIDE = 100  # at least this many columns: the wider tables (request Prompt/Output/Out ms/Bursts, graph max/rows)
KEYS_HELP = "Tab/\u2190/\u2192 pane  \u2191/\u2193 scroll  Ctrl-C stop"
MARK_STYLES = {"P": "cyan", "D": "green", "S": "magenta", "V": "yellow", "~": "red", ".": "dim"}


@dataclass(frozen=True)
class View:
    """What the frame shows besides the state: where the user is and the terminal's size."""

    pane: str = "overview"
    scroll: int = 0  # first request row shown
    width: int = 80
    height: int = 24
    title: str = "Flare"  # model and address
    logs: Sequence[str] = ()  # the latest log lines, oldest first


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _ms(value: float | None) -> str:
    if value is None:
        return "\u2014"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _figures(o: Overview, width: int) -> Table:
    pairs = [
        ("prefill tok/s", _num(o.prefill_tps)), ("generation tok/s", _num(o.generation_tps)),
        ("active", str(o.active)), ("queued", str(o.queued)),
        ("completed", f"{o.completed:,}"), ("failed", f"{o.failed:,}"),
        ("reused tokens", f"{o.reused_tokens:,}"), ("KV pages cached/free", f"{o.pages_cached:,}/{o.pages_free:,}"),
    ]
    if o.speculative:
        pairs += [("drafter steps", f"{o.drafter_steps:,}"), ("verification steps", f"{o.verification_steps:,}"),
                  ("acceptance length", f"{o.acceptance_length:.2f}"), ("DEPTH", f"{o.depth:.2f}")]
    columns = 3 if width >= WIDE else 2
    grid = Table.grid(padding=(0, 2))
    for _ in range(columns):
        grid.add_column(style="dim")
        grid.add_column(justify="right")
    for i in range(0, len(pairs), columns):
        cells: list[str] = []
        for name, value in pairs[i:i + columns]:
            cells += [name, value]
        grid.add_row(*cells)
    return grid


def _graphs(rows: Sequence[GraphRow], width: int) -> Table:
    wide = width >= WIDE
    table = Table(box=None, padding=(0, 1), header_style="bold", expand=False)
    table.add_column("Graph", no_wrap=True)
    table.add_column("Calls", justify="right")
    table.add_column("Mean ms", justify="right")
    table.add_column("Share", justify="right")
    if wide:
        table.add_column("Max ms", justify="right")
        table.add_column("Req/call", justify="right")
    table.add_column("Untimed", justify="right")
    for r in rows:
        cells = [r.label, f"{r.calls:,}", _ms(r.mean_ms), f"{r.share:.0%}"]
        if wide:
            cells += [_ms(r.max_ms), f"{r.requests_per_call:.1f}"]
        cells.append(str(r.untimed) if r.untimed else "")
        table.add_row(*cells)
    if not rows:
        table.add_row(Text(f"no graph completed in the last {GRAPH_WINDOW_S:.0f} s", style="dim"),
                      *[""] * (len(table.columns) - 1))
    return table


def _history(text: Text, cells: str) -> None:
    """Append the marks, one span per run of equal marks."""
    start = 0
    for i in range(1, len(cells) + 1):
        if i == len(cells) or cells[i] != cells[start]:
            text.append(cells[start:i], style=MARK_STYLES.get(cells[start], "blue"))
            start = i


# Request columns: (header, width, right-aligned). Drawn as preformatted lines, not a rich Table:
# a table's layout costs about 0.5 ms a row, and the display thread shares the GIL with the
# model thread.
_NARROW = (("Request", 9, False), ("Phase", 13, False), ("Gap ms", 7, True))
_WIDE = _NARROW + (("Prompt", 11, True), ("Output", 7, True), ("Out ms", 7, True), ("Bursts", 7, True))


def _requests(rows: Sequence[RequestView], view: View, limit: int, cells: int) -> tuple[Text, str, int]:
    columns = _WIDE if view.width >= WIDE else _NARROW

    def line(values: Sequence[str]) -> str:
        return " ".join(v.rjust(w) if right else v.ljust(w) for v, (_, w, right) in zip(values, columns))

    text = Text()
    text.append(line([c[0] for c in columns]) + f" History {HISTORY_S:.0f} s", style="bold")
    start = max(0, min(view.scroll, len(rows) - limit)) if rows else 0
    shown = rows[start:start + limit]
    wide = columns is _WIDE
    for r in shown:
        values = [r.label, r.phase, _ms(r.gap_ms)]
        if wide:
            values += [r.prompt, r.output, _ms(r.out_ms), r.bursts]
        text.append("\n" + line(values) + " ")
        _history(text, r.cells)
    if not rows:
        text.append("\nno requests", style="dim")
    text.no_wrap = True
    text.overflow = "crop"
    where = f"requests {start + 1}-{start + len(shown)} of {len(rows)}" if rows else "requests 0"
    return text, where, start


def history_cells(width: int) -> int:
    """History cells per request row: 20 (half-second cells) when wide, else 10."""
    return 20 if width >= WIDE else 10


def frame(state: DashboardState, now_ns: int, view: View) -> RenderableType:
    """The whole screen for ``view``."""
    return draw(state, now_ns, view)[0]


def draw(state: DashboardState, now_ns: int, view: View) -> tuple[RenderableType, int]:
    """The whole screen for ``view`` and the first request row it shows (``view.scroll``
    clamped so that the last page is full)."""
    o = state.overview(now_ns)
    pane = view.pane
    tabs = Text()
    for name in PANES:
        tabs.append(f" {PANE_TITLES[name]} ", style="reverse bold" if name == pane else "dim")
        tabs.append(" ")
    tabs.append(f"  {KEYS_HELP}", style="dim")
    parts: list[RenderableType] = [Text(view.title, style="bold", no_wrap=True, overflow="ellipsis"), tabs]
    if pane == "overview":
        parts.append(_figures(o, view.width))
        used = 2 + 4 + (2 if o.speculative else 0)
    else:
        rows = state.graph_rows(now_ns)
        parts.append(_graphs(rows, view.width))
        last = Text("last submitted: ", style="dim")
        last.append(o.last_graph or "none")
        if o.last_graph:
            last.append(f", estimate {_ms(o.last_estimate_ms) + ' ms' if o.last_estimate_ms is not None else '?'}")
        parts.append(last)
        used = 2 + 1 + max(1, len(rows)) + 1
    cells = history_cells(view.width)
    requests = state.request_rows(now_ns, cells)
    logs = list(view.logs)[-3:]
    limit = max(1, view.height - used - 4 - len(logs))
    table, where, first_row = _requests(requests, view, limit, cells)
    parts.append(Text(""))
    parts.append(table)
    status = Text(style="dim")
    age = "no sample yet" if o.sample_age_s is None else f"sample {o.sample_age_s:.1f} s ago"
    status.append(f"{where} \u00b7 {age} \u00b7 dropped {o.dropped:,}")
    if o.truncated:
        status.append(" \u00b7 ")
        status.append("history truncated", style="bold red")
    if state.rows_dropped:
        status.append(f" \u00b7 {state.rows_dropped:,} rows over {state.max_rows}")
    parts.append(status)
    for line in logs:
        parts.append(Text(line, style="dim", no_wrap=True, overflow="ellipsis"))
    return Group(*parts), first_row
