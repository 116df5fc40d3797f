"""Progress of long work (flare/progress.py): plain lines, rich's bars on a terminal, the
server's startup stages, and `flare export` under a pseudo-terminal and redirected."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import time

import pytest
from rich.console import Console

from flare.progress import LineProgress, Reporter, TerminalProgress, reporter, stage_reporter, usable_terminal
from flare.server.session import StartupProgress

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
MiB = 1 << 20


def _screen(raw: str) -> list[str]:
    """What a terminal shows of ``raw``, roughly: escapes dropped, each line's last redraw."""
    lines = [ANSI.sub("", line).rstrip("\r").split("\r")[-1] for line in raw.split("\n")]
    return [line for line in lines if line.strip()]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_give_a_task_its_start_and_end_not_one_line_per_item():
    lines: list[str] = []
    clock = Clock()
    progress = LineProgress(lines.append, clock=clock)
    progress("before")
    with progress.task("verifying 3 assets", total=4 * MiB) as advance:
        for _ in range(4096):
            advance(1024)
            clock.now += 1 / 1024
    assert lines == ["before", "verifying 3 assets (4.0 MiB)", "verifying 3 assets: done, 4.0 MiB in 4.0 s (1.0 MiB/s)"]


def test_lines_between_are_few_and_spaced():
    """A long task: at most three lines between its start and end, at its quarters."""
    lines: list[str] = []
    clock = Clock()
    progress = LineProgress(lines.append, clock=clock)
    with progress.task("capturing CUDA graphs", total=400, unit="graphs") as advance:
        for _ in range(400):
            clock.now += 1.0
            advance()
    assert lines == ["capturing CUDA graphs (400 graphs)",
                     "capturing CUDA graphs: 100/400 graphs (25%)",
                     "capturing CUDA graphs: 200/400 graphs (50%)",
                     "capturing CUDA graphs: 300/400 graphs (75%)",
                     "capturing CUDA graphs: done, 400 graphs in 400.0 s"]


def test_lines_of_unknown_size_end_with_the_size_and_stop_on_error():
    lines: list[str] = []
    clock = Clock()
    progress = LineProgress(lines.append, clock=clock)
    with progress.task("downloading pkg==1 from the package index") as advance:
        advance.update(completed=3 * MiB)
        clock.now += 2.0
        advance.update(completed=8 * MiB, total=8 * MiB)
    assert lines == ["downloading pkg==1 from the package index",
                     "downloading pkg==1 from the package index: done, 8.0 MiB in 2.0 s (4.0 MiB/s)"]
    lines.clear()
    with pytest.raises(ValueError), progress.task("extracting x.whl", total=10) as advance:
        advance(5)
        raise ValueError("bad member")
    assert lines == ["extracting x.whl (10 bytes)"]  # no end line for work that failed


def test_any_message_callable_is_a_progress():
    lines: list[str] = []
    wrapped = reporter(lines.append)
    assert isinstance(wrapped, Reporter)
    with wrapped.task("reading", total=10) as advance:
        advance(10)
    assert lines[0] == "reading (10 bytes)" and lines[1].startswith("reading: done, 10 bytes in ")
    assert reporter(wrapped) is wrapped
    with reporter(None).task("silent", total=1) as advance:  # None: nothing reported, nothing fails
        advance(1)


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=100, color_system="standard"), out


def test_bars_show_the_description_sizes_rate_and_time_remaining():
    console, out = _console()
    progress = TerminalProgress(console)
    with progress.task("writing float32 weights", total=100 * MiB) as advance:
        for _ in range(4):
            advance(10 * MiB)
            time.sleep(0.02)
        progress("wrote weights-00001.safetensors (40 MiB)")
    screen = _screen(out.getvalue())
    assert "[flare] wrote weights-00001.safetensors (40 MiB)" in screen  # printed above the bar
    bar = screen[-1]
    assert "writing float32 weights" in bar and "40%" in bar and "40.0/100.0 MiB" in bar, screen
    assert re.search(r"MiB/s eta (\d+:\d\d:\d\d|-:--:--)$", bar), bar


def test_bars_of_counted_work_and_of_unknown_size():
    console, out = _console()
    progress = TerminalProgress(console)
    with progress.task("capturing CUDA graphs", total=8, unit="graphs") as advance:
        for _ in range(8):
            advance()
    with progress.task("downloading pkg==1 from the package index") as advance:
        advance(3 * MiB)
        time.sleep(0.02)
        advance(12 * MiB)
    screen = _screen(out.getvalue())
    graphs = next(line for line in reversed(screen) if "capturing CUDA graphs" in line)
    assert "100%" in graphs and "8/8 graphs" in graphs and "graphs/s" in graphs, screen
    download = screen[-1]  # its size, learnt at the end, is the total
    assert "downloading pkg==1" in download and "100%" in download and "15.0/15.0 MiB" in download, screen
    assert re.search(r"\d:\d\d:\d\d$", download), download


def test_log_records_print_above_the_bars(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    handler = logging.StreamHandler(err)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        progress = TerminalProgress(Console(stderr=True, force_terminal=True, width=100))
        with progress.task("loading 1 weight file onto cpu", total=10 * MiB) as advance:
            assert handler.stream is not err  # through the bars' console while they are drawn
            logging.getLogger("flare.test").warning("a record while loading")
            advance(10 * MiB)
        assert handler.stream is err and sys.stderr is err
    finally:
        root.removeHandler(handler)
    screen = _screen(err.getvalue())
    assert "a record while loading" in screen and "100%" in screen[-1], screen


def test_startup_stages_see_a_task_start_and_end_and_its_fraction_between():
    seen = []
    stages = StartupProgress(seen.append)
    say = stage_reporter(stages, "loading")
    say("KV cache: 12 pages")
    with say.task("loading 1 weight file onto cpu", total=4 * MiB) as advance:
        for _ in range(3):
            advance(MiB)
        assert stages.observed.fraction == pytest.approx(0.75)
        assert stages.observed.detail == "loading 1 weight file onto cpu"
        advance(MiB)
    details = [s.detail for s in seen]
    assert details[:2] == ["KV cache: 12 pages", "loading 1 weight file onto cpu (4.0 MiB)"]
    assert len(details) == 3 and details[2].startswith("loading 1 weight file onto cpu: done, 4.0 MiB in ")
    assert all(s.stage == "loading" for s in seen) and stages.observed.fraction == 1.0
    assert stages.observed.detail == "loading 1 weight file onto cpu"


def test_a_usable_terminal_is_a_tty_whose_term_is_not_dumb(monkeypatch):
    leader, follower = os.openpty()
    with os.fdopen(follower, "w") as tty:
        monkeypatch.setenv("TERM", "xterm")
        assert usable_terminal(tty)
        monkeypatch.setenv("TERM", "dumb")
        assert not usable_terminal(tty)
        monkeypatch.delenv("TERM")
        assert not usable_terminal(tty)
    os.close(leader)
    assert not usable_terminal(io.StringIO()) and not usable_terminal(None)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tests.model.harness import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("ckpt"))


def _export_argv(checkpoint, out) -> list[str]:
    return [sys.executable, "-m", "flare.cli", "export", str(checkpoint), "-o", str(out),
            "--context", "256", "--prefill-chunk-size", "128"]


def test_cli_export_draws_bars_on_a_terminal_and_writes_lines_otherwise(checkpoint, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    env = {**os.environ, "TERM": "xterm"}
    argv = _export_argv(checkpoint, tmp_path / "tty-core")
    child = pexpect.spawn(argv[0], argv[1:], env=env, dimensions=(24, 100), timeout=120, encoding="utf-8")
    raw = child.read()
    child.close()
    assert child.exitstatus == 0, raw
    assert "\x1b[" in raw  # drawn, not written as lines
    bar = next((line for line in reversed(_screen(raw)) if "writing float32 weights" in line), "")
    assert re.search(r"100% +\d+\.\d/\d+\.\d KiB [\d.]+ [KMG]iB/s \d:\d\d:\d\d", bar), _screen(raw)
    assert "[flare] core written to" in raw

    # stderr redirected to a file (stdout still the terminal): plain lines, as before
    err = tmp_path / "stderr.txt"
    shell = " ".join(f"'{a}'" for a in _export_argv(checkpoint, tmp_path / "file-core")) + f" 2>'{err}'"
    child = pexpect.spawn("/bin/sh", ["-c", shell], env=env, dimensions=(24, 100), timeout=120, encoding="utf-8")
    child.read()
    child.close()
    assert child.exitstatus == 0
    text = err.read_text()
    assert "\x1b" not in text and "\r" not in text and "━" not in text, text
    lines = text.splitlines()
    assert all(line.startswith("[flare] ") for line in lines), lines
    assert any(re.fullmatch(r"\[flare\] writing float32 weights \(\d+\.\d KiB\)", line) for line in lines), lines
    assert any(re.match(r"\[flare\] writing float32 weights: done, \d+\.\d KiB in \d+\.\d s", line)
               for line in lines), lines
    assert lines[-1] == f"[flare] core written to {tmp_path / 'file-core'}"


def test_cli_export_into_a_pipe_is_plain(checkpoint, tmp_path):
    run = subprocess.run(_export_argv(checkpoint, tmp_path / "core"), capture_output=True, text=True,
                         env={**os.environ, "TERM": "xterm"})
    assert run.returncode == 0, run.stderr
    assert "\x1b" not in run.stderr and all(line.startswith("[flare] ") for line in run.stderr.splitlines())
