"""Servers under test and a raw HTTP client (shared by tests/server).

``fake``: flare.testing.fake_engine.FakeEngine, in process (Server.start) or as a
subprocess (``python -m flare.testing.fake_engine``) for signal tests.
``demo``: a real ``flare-serve`` subprocess on the embedded demo core; on by
default, skipped with FLARE_E2E_DEMO=0.
``core``: a real ``flare-serve CORE`` subprocess on the core directory named by
FLARE_E2E_CORE (off unless set; tools/gpu_check.sh sets it to a core on the GPU).
The same tests run against every kind; tests that need fault injection or exact
fake output ask for the ``fake_only`` fixture.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flare.config import EngineConfig, ServerConfig
from flare.server.session import Server
from flare.testing.fake_engine import FakeEngine, FakeEngineConfig

REPO = Path(__file__).resolve().parents[2]
# The demo kind runs by default (the real flare-serve on the SmolLM2 core); FLARE_E2E_DEMO=0 skips it.
ENGINE_KINDS = ["fake"] + ([] if os.environ.get("FLARE_E2E_DEMO", "1") == "0" else ["demo"]) + (
    ["core"] if os.environ.get("FLARE_E2E_CORE") else [])
LISTEN_LINE = re.compile(r"Flare listening on (http://\S+)")
# The installed console script, or the same entry point from this checkout.
FLARE_SERVE = [shutil.which("flare-serve")] if shutil.which("flare-serve") else [
    sys.executable, "-c", "import sys; from flare.cli import serve_main; sys.exit(serve_main())"]


@dataclass
class Served:
    """A running server: where it listens and how to stop it."""

    kind: str
    base_url: str
    api_key: str | None = None
    model: str = ""
    process: subprocess.Popen | None = None
    session: Any = None
    stderr_lines: list[str] = field(default_factory=list)

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.base_url.removeprefix("http://").rsplit(":", 1)
        return host, int(port)

    def stop(self) -> int | None:
        if self.session is not None:
            self.session.close()
            return 0
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                return self.process.wait()
        return self.process.returncode if self.process else None


def start_subprocess(argv: list[str], *, kind: str, api_key: str | None = None, env: dict | None = None,
                     timeout: float = 600.0) -> Served:
    """Run a server command with --port 0 and wait for its listening line."""
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"server exited with {proc.wait()}:\n" + "".join(lines))
        lines.append(line)
        match = LISTEN_LINE.search(line)
        if match:
            served = Served(kind, match.group(1), api_key, process=proc, stderr_lines=lines)
            _drain_stderr(proc, lines)
            served.model = get_json(served, "/v1/models")[1]["data"][0]["id"]
            return served
    proc.kill()
    raise RuntimeError("server did not start:\n" + "".join(lines))


def _drain_stderr(proc: subprocess.Popen, lines: list[str]) -> None:
    import threading

    def pump() -> None:
        for line in proc.stderr:
            lines.append(line)

    threading.Thread(target=pump, daemon=True).start()


def launch(kind: str, *, api_key: str | None = None, queue_capacity: int = 0, max_active: int = 0,
           served_names: tuple[str, ...] = (), tokens_per_s: float = 400.0, model_queue: int = 64,
           subprocess_mode: bool = False, context_hint: str = "", capacity_hint: str = "",
           max_body_bytes: int = 0, shutdown_grace_s: float | None = None, context_len: int = 4096,
           request_timeout_s: float | None = None, allowed_origins: tuple[str, ...] = (),
           extra_flags: tuple[str, ...] = ()) -> Served:
    """Start a server of ``kind`` with these settings (``extra_flags``: more flare-serve flags, real kinds only)."""
    if extra_flags and kind == "fake":
        raise ValueError("extra_flags are flare-serve flags; the fake kind takes settings")
    flags: list[str] = ["--host", "127.0.0.1", "--port", "0", *extra_flags]
    if api_key:
        flags += ["--api-key", api_key]
    if queue_capacity:
        flags += ["--queue-capacity", str(queue_capacity)]
    if max_active:
        flags += ["--max-active", str(max_active)]
    for name in served_names:
        flags += ["--served-name", name]
    if context_hint:
        flags += ["--context-hint", context_hint]
    if capacity_hint:
        flags += ["--capacity-hint", capacity_hint]
    if max_body_bytes:
        flags += ["--max-body-bytes", str(max_body_bytes)]
    if shutdown_grace_s is not None:
        flags += ["--shutdown-grace", str(shutdown_grace_s)]
    if request_timeout_s is not None:
        flags += ["--request-timeout", str(request_timeout_s)]
    for origin in allowed_origins:
        flags += ["--allowed-origin", origin]
    if kind == "demo":
        return start_subprocess([*FLARE_SERVE, *flags], kind=kind, api_key=api_key)
    if kind == "core":
        return start_subprocess([*FLARE_SERVE, os.environ["FLARE_E2E_CORE"], *flags], kind=kind, api_key=api_key)
    fake_flags = ["--tokens-per-s", str(tokens_per_s), "--model-queue", str(model_queue),
                  "--context-len", str(context_len)]
    if max_active:
        fake_flags += ["--model-slots", str(max_active)]
    if subprocess_mode:
        return start_subprocess([sys.executable, "-m", "flare.testing.fake_engine", *flags, *fake_flags],
                                kind=kind, api_key=api_key)
    config = ServerConfig(host="127.0.0.1", port=0, api_key=api_key, queue_capacity=queue_capacity,
                          served_names=served_names, context_hint=context_hint, capacity_hint=capacity_hint,
                          max_body_bytes=max_body_bytes, allowed_origins=allowed_origins,
                          request_timeout_s=request_timeout_s or ServerConfig.request_timeout_s,
                          shutdown_grace_s=ServerConfig.shutdown_grace_s if shutdown_grace_s is None
                          else shutdown_grace_s,
                          engine=EngineConfig(max_active=max_active))
    fake = FakeEngineConfig(served_names=served_names, tokens_per_s=tokens_per_s, context_len=context_len,
                            max_active=max_active or FakeEngineConfig.max_active, max_pending=model_queue,
                            capacity_hint=capacity_hint)
    session = Server.start(FakeEngine(fake), config)
    served = Served(kind, session.base_url, api_key, session=session)
    served.model = session.engine.card.id if not served_names else served_names[0]
    return served


# -- a small HTTP client for raw requests ---------------------------------------

def request(served: Served, method: str, path: str, body: Any = None, *, headers: dict | None = None,
            auth: bool = True, raw_body: bytes | None = None, timeout: float = 60.0) -> tuple[int, dict, bytes]:
    host, port = served.host_port
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    all_headers = dict(headers or {})
    if auth and served.api_key and "Authorization" not in all_headers:
        all_headers["Authorization"] = f"Bearer {served.api_key}"
    data = raw_body if raw_body is not None else (json.dumps(body).encode() if body is not None else None)
    if data is not None:
        all_headers.setdefault("Content-Type", "application/json")
    conn.request(method, path, body=data, headers=all_headers)
    response = conn.getresponse()
    payload = response.read()
    result = (response.status, {k.lower(): v for k, v in response.getheaders()}, payload)
    conn.close()
    return result


def get_json(served: Served, path: str, **kwargs: Any) -> tuple[int, Any]:
    status, _, body = request(served, "GET", path, **kwargs)
    return status, json.loads(body)


def post_json(served: Served, path: str, body: Any, **kwargs: Any) -> tuple[int, Any]:
    status, _, payload = request(served, "POST", path, body, **kwargs)
    return status, json.loads(payload)


def metric(served: Served, name: str) -> float:
    """One sample value from /metrics (first match, labels included in ``name``)."""
    _, _, body = request(served, "GET", "/metrics", auth=False)
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{") and name.endswith("}"):
            return float(line.rsplit(" ", 1)[1])
        if "{" in name and line.startswith(name):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


IDLE_GAUGES = ("flare_slots_live", "flare_slots_retiring", "flare_requests_pending", "flare_http_admitted",
               "flare_frontend_busy", "flare_frontend_waiting", "flare_http_body_bytes")


def metrics(served: Served) -> dict[str, float]:
    """Every unlabelled sample of /metrics."""
    _, _, body = request(served, "GET", "/metrics", auth=False)
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_idle(served: Served, timeout: float = 20.0) -> dict[str, float]:
    """Wait until no slot, permit, page or frontend worker is held; the last scrape.

    A response ends before its request retires (a terminal snapshot may still run),
    so idleness is awaited, then asserted: every slot free again, every page that is
    not owned by a cached checkpoint reusable.
    """
    deadline = time.monotonic() + timeout
    while True:
        sample = metrics(served)
        busy = {name: sample.get(name, 0.0) for name in IDLE_GAUGES if sample.get(name, 0.0)}
        if not busy:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"the server did not return to idle: {busy}")
        time.sleep(0.05)
    assert sample.get("flare_slots_free", 1) > 0, sample
    return sample


def assert_error(status: int, payload: Any, expected: int, *needles: str) -> dict:
    assert status == expected, payload
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    for needle in needles:
        assert needle in error["message"], error["message"]
    return error
