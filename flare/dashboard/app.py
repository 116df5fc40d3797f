"""The running dashboard: a display thread, a key reader, and the log lines it shows.

``flare run`` / ``flare-serve`` start a :class:`Dashboard` after loading when stderr is a
usable terminal (:func:`flare.progress.usable_terminal`, the progress bars' test too) and
``--no-dashboard`` is not given. It draws with rich's ``Live`` on the alternate screen of
stderr, twice a second and after each key.

- Telemetry exists only while it runs: :meth:`start` asks the engine for its completion
  trace (flare/engine/trace.py), :meth:`stop` gives it back.
- Request state is asked for every :data:`SAMPLE_INTERVAL_S`; the frame shows the sample's age.
- Keys: Tab, Left/Right (and Shift-Tab) switch panes; Up/Down, PageUp/PageDown scroll the
  request rows. The terminal goes to cbreak mode, which keeps ISIG: Ctrl-C still raises
  SIGINT, so the server's normal shutdown runs (five seconds for active responses, exit 0).
- Log records that would go to stderr are kept (the last :data:`LOG_LINES`) and shown under
  the panes; when the dashboard stops, the warnings and errors among them are written out.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import threading
import time
from collections import deque
from typing import Any, TextIO

from rich.console import Console
from rich.live import Live

from .render import PANES, View, draw
from .state import DashboardState

log = logging.getLogger("flare.dashboard")

REFRESH_S = 0.5
SAMPLE_INTERVAL_S = 0.5
LOG_LINES = 200

# key bytes -> (pane step, scroll step)
_KEYS = {
    b"\t": (1, 0), b"\x1b[C": (1, 0), b"\x1bOC": (1, 0), b"\x1b[D": (-1, 0), b"\x1bOD": (-1, 0),
    b"\x1b[Z": (-1, 0), b"\x1b[A": (0, -1), b"\x1bOA": (0, -1), b"\x1b[B": (0, 1), b"\x1bOB": (0, 1),
    b"\x1b[5~": (0, -10), b"\x1b[6~": (0, 10),
}


def parse_keys(data: bytes) -> list[tuple[int, int]]:
    """The (pane step, scroll step) of each key in ``data``; unknown bytes are skipped."""
    out = []
    i = 0
    while i < len(data):
        for length in (4, 3, 1):
            action = _KEYS.get(data[i:i + length])
            if action is not None:
                out.append(action)
                i += length
                break
        else:
            i += 1
    return out


class _Capture(logging.Handler):
    """Keeps formatted log lines for the dashboard instead of writing them to stderr."""

    def __init__(self, formatter: logging.Formatter | None):
        super().__init__()
        self.lines: deque[tuple[int, str]] = deque(maxlen=LOG_LINES)
        if formatter is not None:
            self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append((record.levelno, self.format(record)))
        except Exception:  # noqa: BLE001 - a log line must never stop the dashboard
            self.handleError(record)


class Dashboard:
    def __init__(self, engine: Any, *, title: str = "Flare", stream: TextIO | None = None,
                 stdin: TextIO | None = None, speculative: bool = False):
        self.engine = engine
        self.title = title
        self.stream = stream or sys.stderr
        self.stdin = stdin if stdin is not None else sys.stdin
        labels = getattr(engine, "graph_labels", ())
        self.state = DashboardState(labels, speculative=speculative)
        self.pane = 0
        self.scroll = 0  # the first request row asked for; the key reader and the display share it
        self._scroll_lock = threading.Lock()
        self.trace = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._keys: threading.Thread | None = None
        self._termios: tuple[int, list] | None = None
        self._capture: _Capture | None = None
        self._moved: list[logging.Handler] = []

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> "Dashboard":
        start_trace = getattr(self.engine, "start_trace", None)
        self.trace = start_trace() if start_trace is not None else None
        self._capture_logs()
        self._enter_cbreak()
        self._thread = threading.Thread(target=self._run, name="flare-dashboard", daemon=True)
        self._thread.start()
        if self._termios is not None:
            self._keys = threading.Thread(target=self._read_keys, name="flare-dashboard-keys", daemon=True)
            self._keys.start()
        return self

    def stop(self) -> None:
        """Close the display, restore the terminal and logging, end the telemetry."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._keys is not None:
            self._keys.join(1.0)
        self._leave_cbreak()
        stop_trace = getattr(self.engine, "stop_trace", None)
        if stop_trace is not None:
            stop_trace()
        self._restore_logs()

    # -- terminal ---------------------------------------------------------------

    def _enter_cbreak(self) -> None:
        try:
            import termios
            import tty

            fd = self.stdin.fileno()
            if not os.isatty(fd):
                return
            saved = termios.tcgetattr(fd)
            tty.setcbreak(fd)  # no line buffering or echo; ISIG stays: Ctrl-C is SIGINT
            self._termios = (fd, saved)
        except (ImportError, OSError, ValueError, AttributeError):
            self._termios = None

    def _leave_cbreak(self) -> None:
        if self._termios is None:
            return
        import termios

        fd, saved = self._termios
        try:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        except OSError:
            pass
        self._termios = None

    def _read_keys(self) -> None:
        fd = self._termios[0]
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([fd], [], [], 0.1)
                if not ready:
                    continue
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:
                return
            self.press(parse_keys(data))
            self._wake.set()

    def press(self, keys: list[tuple[int, int]]) -> None:
        """Apply (pane step, scroll step) keys."""
        with self._scroll_lock:
            for pane_step, scroll_step in keys:
                self.pane = (self.pane + pane_step) % len(PANES)
                self.scroll = max(0, self.scroll + scroll_step)

    # -- logging ----------------------------------------------------------------

    def _capture_logs(self) -> None:
        root = logging.getLogger()
        formatter = None
        for handler in list(root.handlers):
            if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (
                    sys.stderr, self.stream):
                formatter = formatter or handler.formatter
                root.removeHandler(handler)
                self._moved.append(handler)
        self._capture = _Capture(formatter)
        root.addHandler(self._capture)

    def _restore_logs(self) -> None:
        root = logging.getLogger()
        if self._capture is not None:
            root.removeHandler(self._capture)
        for handler in self._moved:
            root.addHandler(handler)
        self._moved = []
        if self._capture is not None:
            for level, line in self._capture.lines:
                if level >= logging.WARNING:  # what the operator must not miss
                    print(line, file=self.stream)
            self._capture = None

    # -- display ----------------------------------------------------------------

    def tick(self, now_ns: int) -> None:
        """Take what the engine published since the last tick."""
        state = self.state
        state.add_stats(now_ns, self.engine.stats())
        trace = self.trace
        if trace is None:
            return
        state.dropped = trace.dropped
        state.last_submitted = trace.last_submitted
        state.add_completions(trace.drain())
        sample = trace.sample
        if sample is not None and sample is not state.sample:
            state.set_sample(sample)
        if state.sample is None or now_ns - state.sample.at_ns >= SAMPLE_INTERVAL_S * 1e9:
            trace.request_sample()

    def view(self, width: int, height: int) -> View:
        logs = [line for _, line in self._capture.lines] if self._capture is not None else []
        return View(pane=PANES[self.pane], scroll=self.scroll, width=width, height=height, title=self.title,
                    logs=logs[-3:])

    def screen(self, now_ns: int, width: int, height: int):
        """The screen at this size. A scroll past the last full page is brought back to it, so
        that Up moves the rows at the first press (a key that arrived meanwhile is kept)."""
        view = self.view(width, height)
        screen, first_row = draw(self.state, now_ns, view)
        with self._scroll_lock:
            if self.scroll == view.scroll:
                self.scroll = first_row
        return screen

    def _run(self) -> None:
        console = Console(file=self.stream, force_terminal=True)
        try:
            with Live(console=console, screen=True, auto_refresh=False, redirect_stdout=False,
                      redirect_stderr=False) as live:
                while not self._stop.is_set():
                    now = time.monotonic_ns()
                    self.tick(now)
                    width, height = console.size
                    live.update(self.screen(now, width, height), refresh=True)
                    self._wake.wait(REFRESH_S)
                    self._wake.clear()
        except Exception:  # noqa: BLE001 - the server goes on without its display
            log.exception("the dashboard stopped")
