"""Server lifecycle: listening, ticking, graceful shutdown, embedding, ``serve``.

:class:`HttpServer` runs on one event loop: it binds the listener, drives the
connections' deadlines and the token-rate sampler from a one-second ticker,
watches the runtime for an unexpected failure, and shuts down in the spec's
order: stop admission (new generation requests get 503, the listener closes),
give active responses ``shutdown_grace_s`` to finish, cancel what is left,
then ``engine.close()``.

Two ways to run it:

- :func:`serve` (the CLI): owns the main thread's uvloop loop, installs
  SIGINT/SIGTERM handlers, returns the process exit code (0 after a signal,
  1 after a runtime failure or a failed startup).
- :meth:`Server.start` (embedding): runs the loop on a thread of its own and
  returns a :class:`ServingSession` with ``snapshot``, ``pause_admission``,
  ``wait_for_requests``, ``resume_admission`` and ``close``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Union

import uvloop

from ..config import ServerConfig
from ..engine.base import Engine
from ..engine.telemetry import EngineStats
from ..errors import Error
from .api import anthropic, ollama, openai, responses
from .app import Application, Router, ServerState
from .metrics import TOKEN_SAMPLE_INTERVAL_S
from .protocol import HttpConnection
from .response import refresh_date

log = logging.getLogger("flare.server")

TICK_S = 1.0  # deadline granularity for request and keep-alive timeouts
# The route families served, each a package with ``install(router, state)`` (server/api/).
FAMILIES = (
    openai,
    ollama,
    responses,
    anthropic,
)


@dataclass(frozen=True)
class StartupStage:
    """One startup step: ``stage`` is a short name ("load", "warmup", "listen", "ready")."""

    stage: str
    detail: str = ""
    fraction: float | None = None  # progress within the stage, when known
    monotonic_time: float = 0.0


class StartupProgress:
    """The latest startup stage, readable from any thread (bounded: one value).

    The engine factory reports through :meth:`report`; embedders poll
    :attr:`observed`; ``on_stage`` (optional) sees each report, e.g. to log it.
    A measurable step's fraction updates :attr:`observed` through :meth:`observe`,
    which ``on_stage`` does not see; with ``bars`` the engine draws such steps as
    progress bars (flare/progress.py's ``stage_reporter``) instead of reporting
    their start and end.
    """

    def __init__(self, on_stage: Callable[[StartupStage], None] | None = None, *, bars: bool = False):
        self._lock = threading.Lock()
        self._observed: StartupStage | None = None
        self._on_stage = on_stage
        self.bars = bars

    def report(self, stage: str, detail: str = "", fraction: float | None = None) -> None:
        value = StartupStage(stage, detail, fraction, time.monotonic())
        with self._lock:
            self._observed = value
        if self._on_stage is not None:
            self._on_stage(value)

    def observe(self, stage: str, detail: str = "", fraction: float | None = None) -> None:
        """Update :attr:`observed` without calling ``on_stage``."""
        value = StartupStage(stage, detail, fraction, time.monotonic())
        with self._lock:
            self._observed = value

    @property
    def observed(self) -> StartupStage | None:
        with self._lock:
            return self._observed


EngineFactory = Callable[[StartupProgress], Engine]


@dataclass(frozen=True)
class SessionSnapshot:
    """Typed gauges of a serving session; values are read independently (not transactional)."""

    session_id: str
    monotonic_time: float
    seconds_since_listen: float
    http_capacity: int
    http_admitted: int
    http_rejected: int
    is_admission_paused: bool
    is_draining: bool
    frontend_workers: int
    frontend_busy: int
    frontend_waiting: int
    tokens_last_minute: float
    slots_live: int
    slots_free: int
    requests_pending: int
    requests_admitted: int
    requests_completed: int
    requests_cancelled: int
    requests_failed: int
    engine_stats: EngineStats  # everything Engine.stats() returned


class HttpServer:
    """The listener and its connections on one loop (see the module docstring)."""

    def __init__(self, engine: Engine, config: ServerConfig):
        self.config = config
        self.state = ServerState(engine, config)
        router = Router()
        self.app = Application(self.state, router)
        self.app.install_core_routes()
        for family in FAMILIES:
            family.install(router, self.state)
        self.connections: set[HttpConnection] = set()
        self.address: tuple[str, int] | None = None
        self.failure: BaseException | None = None  # the runtime failure that stopped us
        self.stopped = asyncio.Event()  # set when shutdown has to start (signal, failure, close)
        self._server: asyncio.base_events.Server | None = None
        self._ticker: asyncio.Task | None = None
        self._is_closed = False
        self._hurry = asyncio.Event()

    def hurry(self) -> None:
        """End the shutdown grace period now (a second signal)."""
        self._hurry.set()

    async def listen(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        state = self.state

        def make_connection() -> HttpConnection:
            conn = HttpConnection(self.app, state.limits, loop=loop, on_close=self.connections.discard)
            self.connections.add(conn)
            return conn

        self._server = await loop.create_server(make_connection, self.config.host, self.config.port,
                                                backlog=4096, reuse_address=True)
        sock = self._server.sockets[0]
        self.address = sock.getsockname()[:2]
        state.listen_started = time.monotonic()
        state.metrics.sample_tokens()
        self._ticker = loop.create_task(self._tick())
        return self.address

    async def _tick(self) -> None:
        next_sample = time.monotonic() + TOKEN_SAMPLE_INTERVAL_S
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            refresh_date()
            for conn in list(self.connections):
                conn.on_tick(now)
            if now >= next_sample:
                next_sample += TOKEN_SAMPLE_INTERVAL_S
                self.state.metrics.sample_tokens(now)
            failure = getattr(self.state.engine, "failure", None)
            if failure is not None and self.failure is None:
                log.error("model runtime failed: %s", failure)
                self.failure = failure
                self.stopped.set()

    async def shutdown(self, grace_s: float | None = None) -> None:
        """Stop admission, let active responses finish for ``grace_s``, drain, close the engine."""
        if self._is_closed:
            return
        self._is_closed = True
        state = self.state
        grace_s = self.config.shutdown_grace_s if grace_s is None else grace_s
        state.is_draining = True
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.shutdown()
        # Requests still waiting for a model slot are answered now (503, with the
        # capacity hint); requests waiting for a frontend worker get the same once
        # prepared. Active responses get the grace period.
        state.engine.shed_queued(Error("the server is shutting down; the request was still queued",
                                       status=503, code="shutting_down"))
        idle = asyncio.ensure_future(state.admission.wait_idle(grace_s))
        hurry = asyncio.ensure_future(self._hurry.wait())
        await asyncio.wait({idle, hurry}, return_when=asyncio.FIRST_COMPLETED)
        hurry.cancel()
        if not idle.done() or not idle.result():
            idle.cancel()
            log.warning("%d responses still active after the shutdown grace period; ending them",
                        state.admission.num_in_use)
        # Every response still running ends with its family's terminal error event
        # (or a 503 if nothing was sent yet) before its connection closes.
        cut = Error("the server is shutting down; the response was ended before it was complete", status=503,
                    code="shutting_down")
        for active in list(state.generations):
            active.end(cut)
        await state.admission.wait_idle(2.0)
        for conn in list(self.connections):
            if conn.is_idle:
                conn.shutdown()
            else:
                conn.abort()
        if self._ticker is not None:
            self._ticker.cancel()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._close_engine)
        state.frontend.close()
        self.stopped.set()

    def _close_engine(self) -> None:
        try:
            self.state.engine.close(timeout=30.0)
        except Exception as exc:
            log.exception("engine.close() failed")
            if self.failure is None:
                self.failure = exc

    def snapshot(self) -> SessionSnapshot:
        state = self.state
        stats = state.read_engine_stats()
        admission, pool = state.admission, state.frontend
        return SessionSnapshot(
            session_id=state.session_id, monotonic_time=time.monotonic(),
            seconds_since_listen=state.seconds_since_listen(), http_capacity=admission.capacity,
            http_admitted=admission.num_in_use, http_rejected=admission.num_rejected,
            is_admission_paused=admission.is_paused, is_draining=state.is_draining,
            frontend_workers=pool.num_workers, frontend_busy=pool.num_busy, frontend_waiting=pool.num_waiting,
            tokens_last_minute=state.metrics.token_rate.value, slots_live=stats.slots_live,
            slots_free=stats.slots_free, requests_pending=stats.requests_pending,
            requests_admitted=stats.requests_admitted, requests_completed=stats.requests_completed,
            requests_cancelled=stats.requests_cancelled, requests_failed=stats.requests_failed,
            engine_stats=stats)


def freeze_startup_heap() -> None:
    """Take what loading created out of the cyclic collector's view (``gc.freeze``).

    A loaded engine leaves a few hundred thousand long-lived objects (185k for the
    demo on the CPU, more with CUDA, Triton and captured graphs); every full collection
    walked them all with the GIL held, 40 ms on the demo, so under allocation-heavy
    traffic the event loop (and /health) stalled that long at random. Frozen objects
    are never collected, which they would not be anyway: they live as long as the server.
    ``serve`` calls it, since it owns the process; an embedding application owns its
    heap and decides for itself (``Server.start`` does not freeze it).
    """
    gc.collect()
    gc.freeze()


def _make_engine(engine: Union[Engine, EngineFactory], progress: StartupProgress) -> Engine:
    if callable(engine) and not hasattr(engine, "submit"):
        return engine(progress)
    return engine


class ServingSession:
    """A server running on its own loop thread (see :meth:`Server.start`)."""

    def __init__(self, server: HttpServer, loop: asyncio.AbstractEventLoop, thread: threading.Thread):
        self._server = server
        self._loop = loop
        self._thread = thread
        self._closed = False

    @property
    def address(self) -> tuple[str, int]:
        return self._server.address

    @property
    def base_url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    @property
    def session_id(self) -> str:
        return self._server.state.session_id

    @property
    def engine(self) -> Engine:
        return self._server.state.engine

    def snapshot(self) -> SessionSnapshot:
        """Runtime and HTTP/frontend gauges with the session id and a monotonic time."""
        return self._server.snapshot()

    def pause_admission(self) -> None:
        """New generation requests get 503; admitted responses finish."""
        self._call(lambda: setattr(self._server.state.admission, "is_paused", True))

    def resume_admission(self) -> None:
        """Reopen admission (e.g. after a cancelled model switch); refused once closing."""
        def resume() -> None:
            if self._server.state.is_draining:
                raise RuntimeError("the session is closing; admission cannot resume")
            self._server.state.admission.is_paused = False
        self._call(resume)

    def wait_for_requests(self, timeout: float | None) -> bool:
        """Wait until no admitted request remains; False when ``timeout`` passed first."""
        if self._closed or self._loop.is_closed():
            return True
        future = asyncio.run_coroutine_threadsafe(self._server.state.admission.wait_idle(timeout), self._loop)
        return future.result()

    def close(self, grace_s: float | None = None) -> None:
        """Stop admission, give active responses the grace period, drain, stop the thread."""
        if self._closed:
            return
        self._closed = True
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._server.shutdown(grace_s), self._loop).result()
        self._thread.join()

    def _call(self, fn: Callable[[], None]) -> None:
        if self._closed or self._loop.is_closed():
            raise RuntimeError("the serving session is closed")

        async def run() -> None:
            fn()
        asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def __enter__(self) -> "ServingSession":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()


class Server:
    """Embedding entry point."""

    @staticmethod
    def start(engine: Union[Engine, EngineFactory], config: ServerConfig = ServerConfig(), *,
              progress: StartupProgress | None = None) -> ServingSession:
        """Load (if given a factory), listen, and return once requests are served.

        ``engine`` is an Engine or a factory called with a StartupProgress. The
        loop runs on a daemon thread; startup failures are raised here.
        """
        progress = progress or StartupProgress()
        ready: dict[str, Any] = {}
        started = threading.Event()

        def run() -> None:
            loop = uvloop.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                server = HttpServer(_make_engine(engine, progress), config)
                progress.report("listen", f"{config.host}:{config.port}")
                loop.run_until_complete(server.listen())
            except BaseException as exc:
                ready["error"] = exc
                started.set()
                loop.close()
                return
            ready["server"] = server
            ready["loop"] = loop
            progress.report("ready", "http://%s:%d" % server.address)
            started.set()
            try:
                loop.run_until_complete(server.stopped.wait())
                loop.run_until_complete(server.shutdown())
            finally:
                loop.close()

        thread = threading.Thread(target=run, name="flare-http", daemon=True)
        thread.start()
        started.wait()
        if "error" in ready:
            thread.join()
            raise ready["error"]
        return ServingSession(ready["server"], ready["loop"], thread)


def _notify_systemd(message: bytes) -> None:
    """sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET (Type=notify units)."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return
    if path.startswith("@"):
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(path)
            sock.sendall(message)
    except OSError as exc:
        log.warning("could not notify systemd: %s", exc)


def start_dashboard(engine: Engine, config: ServerConfig, url: str):
    """The terminal dashboard, when asked for (the default) and stderr is a usable terminal."""
    if not config.dashboard:
        return None
    from .. import __version__
    from ..dashboard.app import Dashboard
    from ..progress import usable_terminal

    if not usable_terminal(sys.stderr):
        return None
    title = f"Flare {__version__} \u00b7 {engine.card.identifier} \u00b7 {url}"
    return Dashboard(engine, title=title, speculative=config.engine.speculative != "none").start()


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def serve(engine_factory: EngineFactory, config: ServerConfig, *, progress: StartupProgress | None = None) -> int:
    """Run the server in this process until SIGINT/SIGTERM; return the exit code.

    0 after a signal and a clean drain; 1 when the runtime failed, the engine
    could not be loaded, or the address could not be bound. A second signal
    skips the rest of the grace period.
    """
    from ..progress import usable_terminal

    configure_logging(config.log_level)
    # each startup step logged once: the loading steps as they are, the others with their stage;
    # the long ones drawn as progress bars when stderr is a terminal
    progress = progress or StartupProgress(
        lambda s: log.info("%s", s.detail) if s.stage == "loading" else log.info("%s: %s", s.stage, s.detail),
        bars=usable_terminal(sys.stderr))
    return uvloop.run(_serve(engine_factory, config, progress))


async def _serve(engine_factory: EngineFactory, config: ServerConfig, progress: StartupProgress) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = {"count": 0}

    def on_signal(signum: int) -> None:
        signals["count"] += 1
        log.info("received %s; shutting down", signal.Signals(signum).name)
        stop.set()
        if signals["count"] > 1 and server is not None:
            server.hurry()

    server: HttpServer | None = None
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        try:
            engine = await loop.run_in_executor(None, engine_factory, progress)
        except Exception as exc:
            log.error("could not start the model runtime: %s", exc)
            return 1
        if stop.is_set():
            await loop.run_in_executor(None, engine.close)
            return 0
        try:
            server = HttpServer(engine, config)
            host, port = await server.listen()
        except OSError as exc:
            log.error("could not listen on %s:%d: %s", config.host, config.port, exc)
            await loop.run_in_executor(None, engine.close)
            return 1
        freeze_startup_heap()
        progress.report("ready", f"http://{host}:{port}")
        # NOTE: tests and scripts parse this line to find an ephemeral port.
        print(f"Flare listening on http://{host}:{port}", file=sys.stderr, flush=True)
        _notify_systemd(b"READY=1\nSTATUS=serving")
        dashboard = start_dashboard(engine, config, f"http://{host}:{port}")
        stop_waiter = loop.create_task(stop.wait())
        failure_waiter = loop.create_task(server.stopped.wait())
        try:
            await asyncio.wait({stop_waiter, failure_waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if dashboard is not None:
                dashboard.stop()  # the shutdown's lines go to the terminal as plain logs
        stop_waiter.cancel()
        failure_waiter.cancel()
        _notify_systemd(b"STOPPING=1")
        await server.shutdown()
        if server.failure is not None:
            log.error("exiting after a runtime failure: %s", server.failure)
            return 1
        log.info("drained; exiting")
        return 0
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
