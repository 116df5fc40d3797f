"""Progress of long work: plain lines, or progress bars when stderr is a terminal.

A reporter (:class:`Reporter`) is called with a message, one line of news, and measures
work with :meth:`Reporter.task`::

    with progress.task("writing weights", total=nbytes) as advance:  # unit="bytes"
        for block in blocks:
            advance(len(block))

:class:`LineProgress` writes lines, for logs, pipes and files: a task's start (with its
size, when known), its end (the size and the time it took), and between them at most
:data:`MAX_BETWEEN` lines, :data:`INTERVAL_S` apart at least, never one per item. A task
left by an exception writes no end line. :class:`TerminalProgress` draws rich's bars:
the description, the percentage, completed/total (bytes as KiB, MiB or GiB), the rate,
the time elapsed and the time remaining; a task of unknown size pulses until it ends and
then shows its size. Messages print above the bars, and so do log records while bars are
drawn. :func:`stderr_progress` picks one for stderr: bars only on a usable terminal.

Producers accept a :data:`Progress` (a reporter, or any callable taking a message: the
older interface) and call :func:`reporter` on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ContextManager, Iterator, Protocol, TextIO, Union, runtime_checkable

if TYPE_CHECKING:
    from rich.console import Console

BYTES = "bytes"  # a task's unit that is shown as a size; any other unit is a noun ("tensors")
INTERVAL_S = 10.0  # LineProgress: the least time between two lines of one task
MAX_BETWEEN = 3  # LineProgress: lines between a task's start and end, at most
PREFIX = "[flare] "

Emit = Callable[[str], None]
Watch = Callable[[str, Union[float, None]], None]  # (description, fraction done or None)


class Advance(Protocol):
    """What a task yields: called with the amount of work just done."""

    def __call__(self, amount: float = 1) -> None: ...

    def update(self, *, completed: float | None = None, total: float | None = None) -> None:
        """Set the work done, or the total once it is known."""


@runtime_checkable
class Reporter(Protocol):
    def __call__(self, message: str) -> None: ...

    def task(self, description: str, total: float | None = None, unit: str = BYTES) -> ContextManager[Advance]:
        """Measure one piece of work of ``total`` units (None: unknown until it ends)."""


Progress = Union[Reporter, Callable[[str], None]]


def usable_terminal(stream: TextIO | None) -> bool:
    """A terminal bars can be drawn on: a tty whose TERM is set and not 'dumb'."""
    try:
        is_tty = stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False
    return is_tty and os.environ.get("TERM", "") not in ("", "dumb")


def stderr_line(message: str) -> None:
    """'[flare] message' on stderr."""
    print(PREFIX + message, file=sys.stderr, flush=True)


def stderr_progress() -> Reporter:
    """The command line's reporter: bars on a usable terminal, '[flare] ...' lines otherwise."""
    return TerminalProgress() if usable_terminal(sys.stderr) else LineProgress(stderr_line)


def reporter(progress: Progress | None) -> Reporter:
    """``progress`` as a reporter: itself, lines to a plain callable, or silence for None."""
    if progress is None:
        return LineProgress()
    if isinstance(progress, Reporter):
        return progress
    return LineProgress(progress)


class Stages(Protocol):
    """A startup progress (flare.server.session.StartupProgress): the latest stage, reported."""

    bars: bool  # draw measurable work as bars (stderr is a usable terminal)

    def report(self, stage: str, detail: str = "", fraction: float | None = None) -> None: ...

    def observe(self, stage: str, detail: str = "", fraction: float | None = None) -> None:
        """Update the latest stage without announcing it (a task's fraction)."""


def stage_reporter(stages: Stages, stage: str) -> Reporter:
    """A reporter for one startup stage: each message is a report; a task's fraction is observed
    as it changes, and the task is drawn as a bar (``stages.bars``) or reported at its start
    and end (and at most MAX_BETWEEN times between)."""
    def report(message: str) -> None:
        stages.report(stage, message)

    def watch(description: str, fraction: float | None) -> None:
        stages.observe(stage, description, fraction)

    return TerminalProgress(emit=report, watch=watch) if stages.bars else LineProgress(report, watch=watch)


def format_amount(amount: float, unit: str = BYTES) -> str:
    """``amount`` of ``unit`` for a line: '540.2 MiB', '183 bytes', '204 graphs'."""
    if unit != BYTES:
        return f"{amount:,.0f} {unit}"
    for suffix, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if amount >= scale:
            return f"{amount / scale:.1f} {suffix}"
    return f"{amount:.0f} bytes"


def sha256_file(path: Path, advance: Advance, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of the file at ``path`` (flare.digest's), reporting each block read to ``advance``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
            advance(len(block))
    return digest.hexdigest()


class _Count:
    """A task's completed and total amounts, updated from any thread."""

    def __init__(self, total: float | None):
        self.lock = threading.Lock()
        self.completed = 0.0
        self.total = total

    def fraction(self) -> float | None:
        return min(1.0, self.completed / self.total) if self.total else None


class _LineTask(_Count):
    def __init__(self, owner: "LineProgress", description: str, total: float | None, unit: str):
        super().__init__(total)
        self._owner, self.description, self.unit = owner, description, unit
        self.started = self._last = owner.clock()
        self._between = 0
        self._quarter = 0

    def __call__(self, amount: float = 1) -> None:
        self._change(amount, None, None)

    def update(self, *, completed: float | None = None, total: float | None = None) -> None:
        self._change(0, completed, total)

    def _change(self, amount: float, completed: float | None, total: float | None) -> None:
        with self.lock:
            if total is not None:
                self.total = total
            self.completed = (self.completed if completed is None else completed) + amount
            line, fraction = self._due(), self.fraction()
        if line is not None:
            self._owner(line)
        if self._owner.watch is not None:
            self._owner.watch(self.description, fraction)

    def _due(self) -> str | None:
        """The line between start and end that is due now, if any (called under the lock)."""
        now = self._owner.clock()
        # of unknown size: each gap twice the one before (10, 30, 70 s), so long work still reports late
        gap = self._owner.interval_s * (1 if self.total else 1 << self._between)
        if self._between >= MAX_BETWEEN or now - self._last < gap:
            return None
        done = format_amount(self.completed, self.unit)
        if not self.total:
            line = f"{self.description}: {done} so far"
        else:
            quarter = int(4 * self.completed / self.total)
            if not self._quarter < quarter < 4:
                return None
            self._quarter = quarter
            amounts = f"{done} of {format_amount(self.total)}" if self.unit == BYTES else \
                f"{self.completed:,.0f}/{self.total:,.0f} {self.unit}"
            line = f"{self.description}: {amounts} ({100 * self.completed / self.total:.0f}%)"
        self._between += 1
        self._last = now
        return line

    def start_line(self) -> str:
        return self.description if self.total is None else \
            f"{self.description} ({format_amount(self.total, self.unit)})"

    def end_line(self) -> str:
        elapsed = self._owner.clock() - self.started
        line = f"{self.description}: done, {format_amount(self.completed, self.unit)} in {elapsed:.1f} s"
        if self.unit == BYTES and elapsed > 0 and self.completed:
            line += f" ({format_amount(self.completed / elapsed)}/s)"
        return line


class LineProgress:
    """Progress as lines (see the module docstring); ``emit`` gets each line (None: dropped),
    ``watch`` each task's fraction as it changes."""

    def __init__(self, emit: Emit | None = None, *, watch: Watch | None = None,
                 interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self._emit = emit
        self.watch = watch
        self.interval_s = interval_s
        self.clock = clock

    def __call__(self, message: str) -> None:
        if self._emit is not None:
            self._emit(message)

    @contextlib.contextmanager
    def task(self, description: str, total: float | None = None, unit: str = BYTES) -> Iterator[Advance]:
        state = _LineTask(self, description, total, unit)
        self(state.start_line())
        if self.watch is not None:
            self.watch(description, 0.0 if total else None)
        yield state
        self(state.end_line())
        if self.watch is not None:
            self.watch(description, 1.0)


class _BarTask(_Count):
    def __init__(self, bars, task_id, description: str, total: float | None, watch: Watch | None):
        super().__init__(total)
        self._bars, self._id, self.description, self._watch = bars, task_id, description, watch

    def __call__(self, amount: float = 1) -> None:
        with self.lock:
            self.completed += amount
            fraction = self.fraction()
        self._bars.advance(self._id, amount)
        if self._watch is not None:
            self._watch(self.description, fraction)

    def update(self, *, completed: float | None = None, total: float | None = None) -> None:
        with self.lock:
            if total is not None:
                self.total = total
            if completed is not None:
                self.completed = completed
            fraction = self.fraction()
        self._bars.update(self._id, completed=completed, total=total)
        if self._watch is not None:
            self._watch(self.description, fraction)


def _columns() -> tuple:
    """The bars' columns: spinner, description (shortened first when the line is too long),
    bar, percentage, completed/total, rate, and the time remaining (rich's TimeRemainingColumn;
    the time elapsed while the size is unknown and once the task is done)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        ProgressColumn,
        SpinnerColumn,
        TaskProgressColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.table import Column
    from rich.text import Text

    def fixed() -> Column:
        return Column(no_wrap=True)

    class Description(ProgressColumn):
        def render(self, task) -> Text:
            return Text(task.description, no_wrap=True, overflow="ellipsis")

    class Amount(ProgressColumn):
        """completed/total: bytes as KiB/MiB/GiB (rich's DownloadColumn), other units counted."""

        def __init__(self):
            super().__init__(fixed())
            self._bytes = DownloadColumn(binary_units=True)

        def render(self, task) -> Text:
            unit = task.fields.get("unit", BYTES)
            if unit == BYTES:
                return self._bytes.render(task)
            total = "?" if task.total is None else f"{task.total:,.0f}"
            return Text(f"{task.completed:,.0f}/{total} {unit}", style="progress.download")

    class Rate(ProgressColumn):
        def render(self, task) -> Text:
            speed = task.finished_speed or task.speed
            if speed is None and task.finished_time:  # a total set at the end clears rich's samples
                speed = task.completed / task.finished_time
            if speed is None:
                return Text("?", style="progress.data.speed")
            unit = task.fields.get("unit", BYTES)
            rate = format_amount(speed) if unit == BYTES else f"{speed:,.1f} {unit}"
            return Text(f"{rate}/s", style="progress.data.speed")

    class Time(ProgressColumn):
        def __init__(self):
            super().__init__(fixed())
            self._remaining = TimeRemainingColumn(elapsed_when_finished=True)
            self._elapsed = TimeElapsedColumn()

        def render(self, task) -> Text:
            if task.total is None:
                return self._elapsed.render(task)
            time_text = self._remaining.render(task)
            return time_text if task.finished else Text.assemble("eta ", time_text)

    return (SpinnerColumn(table_column=fixed()), Description(), BarColumn(bar_width=16, table_column=fixed()),
            TaskProgressColumn(table_column=fixed()), Amount(), Rate(fixed()), Time())


class TerminalProgress:
    """Progress as rich's bars on ``console`` (default: stderr's), see the module docstring.

    Messages go to ``emit`` when given (the server logs them), else print above the bars as
    '[flare] message'. Tasks that overlap share one display; it stops when the last ends,
    leaving the bars' final state on the terminal (``transient``: erased instead).
    """

    def __init__(self, console: "Console | None" = None, *, emit: Emit | None = None, watch: Watch | None = None,
                 transient: bool = False):
        from rich.console import Console

        self.console = console or Console(stderr=True)
        self._emit = emit
        self._watch = watch
        self._transient = transient
        self._lock = threading.Lock()
        self._bars = None
        self._open = 0
        self._handlers: list[logging.StreamHandler] = []
        self._original: TextIO | None = None

    def __call__(self, message: str) -> None:
        if self._emit is not None:
            self._emit(message)
        else:
            from rich.text import Text

            self.console.print(Text(PREFIX + message), soft_wrap=True, highlight=False)

    @contextlib.contextmanager
    def task(self, description: str, total: float | None = None, unit: str = BYTES) -> Iterator[Advance]:
        bars = self._start()
        state = _BarTask(bars, bars.add_task(description, total=total, unit=unit), description, total, self._watch)
        try:
            if self._watch is not None:
                self._watch(description, 0.0 if total else None)
            yield state
            if state.total is None:  # its size is known now: the bar ends full, showing it
                state.update(total=state.completed)
            if self._watch is not None:
                self._watch(description, 1.0)
        finally:
            self._stop()

    def _start(self):
        from rich.progress import Progress

        with self._lock:
            if self._bars is None:
                # stderr's console takes sys.stderr's writes while it draws (stdout is left alone:
                # `flare info demo | head` must not see the bars' console)
                redirect = self.console.file is sys.stderr
                self._bars = Progress(
                    *_columns(), console=self.console, transient=self._transient, redirect_stdout=False,
                    redirect_stderr=redirect)
                self._bars.start()
                self._redirect_logging()
            self._open += 1
            return self._bars

    def _stop(self) -> None:
        with self._lock:
            self._open -= 1
            if self._open == 0 and self._bars is not None:
                self._bars.stop()
                self._bars = None
                self._restore_logging()

    def _redirect_logging(self) -> None:
        """Log records written to stderr go through the bars' console (above them) while they
        are drawn, instead of breaking into them: the root logger's handlers that write to
        the stream sys.stderr now proxies write to that proxy until the bars stop."""
        original = getattr(sys.stderr, "rich_proxied_file", None)
        if original is None:
            return
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is original:
                handler.setStream(sys.stderr)
                self._handlers.append(handler)
        self._original = original

    def _restore_logging(self) -> None:
        for handler in self._handlers:
            handler.setStream(self._original)
        self._handlers.clear()
