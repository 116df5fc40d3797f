"""Process lifecycle (signals, exit codes), the embedding API and option loading."""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import sys
import threading
import time

import pytest
from server_harness import assert_error, get_json, launch, post_json, request

from flare.config import ServerConfig
from flare.errors import ExecutionError
from flare.server.options import ConfigError, add_server_arguments, load_server_config
from flare.server.session import Server, StartupProgress
from flare.testing.fake_engine import FakeEngine, FakeEngineConfig

CHAT = [{"role": "user", "content": "Stream for a while please"}]


def _stream(served, max_tokens: int, result: dict) -> None:
    """Read a whole streaming response into ``result`` (run on a thread)."""
    host, port = served.host_port
    conn = http.client.HTTPConnection(host, port, timeout=60)
    body = json.dumps({"model": served.model, "messages": CHAT, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True})
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    result["status"] = response.status
    result["started"] = True
    try:
        result["body"] = response.read()
        result["clean"] = True  # the chunked body ended with its terminating chunk
    except http.client.IncompleteRead as exc:
        result["body"] = exc.partial
        result["clean"] = False


def _start_stream(served, max_tokens: int) -> tuple[threading.Thread, dict]:
    result: dict = {}
    thread = threading.Thread(target=_stream, args=(served, max_tokens, result), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while "started" not in result and time.monotonic() < deadline:
        time.sleep(0.01)
    return thread, result


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_during_streaming_finishes_responses_and_exits_0(engine_kind, signum):
    served = launch(engine_kind, subprocess_mode=True, tokens_per_s=20)
    # About 2 s of output on either engine: it fits in the 5 s grace period.
    thread, result = _start_stream(served, 40 if engine_kind == "fake" else 8)
    served.process.send_signal(signum)
    assert served.process.wait(30) == 0
    thread.join(10)
    assert result["status"] == 200 and result["clean"]
    assert result["body"].endswith(b"data: [DONE]\n\n")
    assert any("drained" in line for line in served.stderr_lines)


def test_sigterm_ends_long_streams_cleanly_after_grace(engine_kind):
    served = launch(engine_kind, subprocess_mode=True, tokens_per_s=50, shutdown_grace_s=0.5)
    # A minute of output from the fake engine; the whole context from a real one (a
    # small model on a GPU would otherwise finish inside the grace period).
    max_tokens = 3000 if engine_kind == "fake" else get_json(served, "/v1/models")[1]["data"][0]["max_model_len"] - 64
    thread, result = _start_stream(served, max_tokens)  # cut at the grace period
    time.sleep(0.2)
    started = time.monotonic()
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(30) == 0
    assert time.monotonic() - started < 10
    thread.join(10)
    assert result["status"] == 200 and result["clean"]
    # The stream ends with the shutdown's error event, not a cut connection.
    last = result["body"].rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"event: error\ndata: ") and b'"code":"shutting_down"' in last, last


@pytest.mark.fake_only("fault injection: the FLARE_FAKE_CRASH marker fails the runtime")
def test_runtime_failure_exits_1(engine_kind, fake_only):
    served = launch(engine_kind, subprocess_mode=True)
    status, payload = post_json(served, "/v1/chat/completions",
                                {"messages": [{"role": "user", "content": "FLARE_FAKE_CRASH"}]})
    assert_error(status, payload, 500, "FLARE_FAKE_CRASH")
    assert served.process.wait(30) == 1
    assert any("runtime failure" in line for line in served.stderr_lines)


def test_startup_failure_exits_1():
    import subprocess
    proc = subprocess.run([sys.executable, "-m", "flare.testing.fake_engine", "--port", "0", "--model-slots", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "could not start" in proc.stderr


def test_bind_failure_exits_1():
    import socket
    import subprocess
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "flare.testing.fake_engine", "--port", str(port)],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "could not listen" in proc.stderr


# -- embedding -------------------------------------------------------------------------

def test_server_start_with_factory_reports_progress_and_snapshots():
    progress = StartupProgress()
    stages = []

    def factory(p: StartupProgress) -> FakeEngine:
        p.report("load", "fake weights", 0.5)
        stages.append(p.observed)
        return FakeEngine(FakeEngineConfig(tokens_per_s=0))

    with Server.start(factory, ServerConfig(port=0), progress=progress) as session:
        assert stages[0].stage == "load" and stages[0].fraction == 0.5
        assert progress.observed.stage == "ready" and session.base_url in progress.observed.detail
        first = session.snapshot()
        host, port = session.address
        conn = http.client.HTTPConnection(host, port, timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "abc", "max_tokens": 4}))
        assert conn.getresponse().status == 200
        second = session.snapshot()
        assert second.session_id == first.session_id and second.monotonic_time > first.monotonic_time
        assert second.requests_completed == first.requests_completed + 1
        assert second.http_capacity == 5 * 8 and second.frontend_workers == 2
        assert session.wait_for_requests(1.0)
    with pytest.raises(RuntimeError, match="closed"):
        session.resume_admission()


def test_server_start_raises_startup_errors():
    def factory(progress):
        raise ExecutionError("weights are missing")

    with pytest.raises(ExecutionError, match="weights are missing"):
        Server.start(factory, ServerConfig(port=0))


def test_close_gives_active_responses_the_grace_period():
    session = Server.start(FakeEngine(FakeEngineConfig(tokens_per_s=100)), ServerConfig(port=0))
    served = type("S", (), {"host_port": session.address, "model": "flare-test/fake-model"})()
    thread, result = _start_stream(served, 40)
    session.close()
    thread.join(10)
    assert result["clean"] and result["body"].endswith(b"data: [DONE]\n\n")
    with pytest.raises(ConnectionRefusedError):
        request(type("S", (), {"host_port": session.address, "api_key": None})(), "GET", "/health")


# -- options ---------------------------------------------------------------------------------

def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return parser.parse_args(argv)


def test_option_precedence_cli_env_file_defaults(tmp_path):
    path = tmp_path / "flare.toml"
    path.write_text('port = 9001\nhost = "0.0.0.0"\nqueue_capacity = 7\nserved_names = ["a/b"]\n'
                    'log_level = "debug"\n[engine]\nmax_active = 4\n')
    env = {"FLARE_PORT": "9002", "FLARE_QUEUE_CAPACITY": "8", "FLARE_SERVED_NAMES": "x,y"}
    config = load_server_config(_parse(["--port", "9003", "--config", str(path)]), env)
    assert config.port == 9003  # CLI
    assert config.queue_capacity == 8 and config.served_names == ("x", "y")  # environment
    assert config.host == "0.0.0.0" and config.engine.max_active == 4 and config.log_level == "debug"  # file
    assert config.frontend_workers == ServerConfig.frontend_workers  # default
    config = load_server_config(_parse(["--served-name", "one", "--served-name", "org/two", "--max-active", "2"]),
                                {"FLARE_CONFIG": str(path)})
    assert config.served_names == ("one", "org/two") and config.engine.max_active == 2 and config.port == 9001


def test_flag_defaults_come_from_server_config():
    config = load_server_config(_parse([]), {})
    assert config == ServerConfig()
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    assert f"default: {ServerConfig.port!r}" in parser.format_help()


@pytest.mark.parametrize("env,content,needle", [
    ({"FLARE_PORT": "eighty"}, None, "FLARE_PORT"),
    ({"FLARE_PORT": "70000"}, None, "port"),
    ({}, "bogus = 1\n", "unknown setting 'bogus'"),
    ({}, "port = [\n", "not valid TOML"),
    ({}, 'frontend_workers = "two"\n', "frontend_workers"),
    ({"FLARE_LOG_LEVEL": "loud"}, None, "log_level"),
    ({"FLARE_MAX_ACTIVE": "257"}, None, "max_active"),
])
def test_bad_options_raise_config_errors(tmp_path, env, content, needle):
    args = _parse([])
    if content is not None:
        path = tmp_path / "bad.toml"
        path.write_text(content)
        env = {**env, "FLARE_CONFIG": str(path)}
    with pytest.raises(ConfigError, match=needle):
        load_server_config(args, env)


# -- systemd ------------------------------------------------------------------------------------

def test_systemd_notify_ready_and_stopping(tmp_path, engine_kind):
    import socket
    path = str(tmp_path / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(30)
        served = launch_with_env(engine_kind, {"NOTIFY_SOCKET": path})
        assert sock.recv(4096).startswith(b"READY=1")
        served.process.send_signal(signal.SIGTERM)
        assert sock.recv(4096) == b"STOPPING=1"
        assert served.process.wait(30) == 0


def launch_with_env(kind, env):
    from server_harness import FLARE_SERVE, start_subprocess
    argv = [*FLARE_SERVE] if kind == "demo" else [sys.executable, "-m", "flare.testing.fake_engine"]
    return start_subprocess([*argv, "--port", "0"], kind=kind, env=env)


def test_unit_file_runs_flare_serve_as_notify_service_with_hardening():
    import configparser
    from pathlib import Path
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str
    unit.read(Path(__file__).resolve().parents[2] / "deploy" / "flare-serve.service")
    service = unit["Service"]
    assert service["Type"] == "notify" and service["Restart"] == "on-failure"
    assert service["ExecStart"].split()[0].endswith("/flare-serve") and service["KillSignal"] == "SIGTERM"
    for option in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "RestrictAddressFamilies"):
        assert service[option], option
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_non_streaming_response_cut_by_shutdown_is_503():
    session = Server.start(FakeEngine(FakeEngineConfig(tokens_per_s=50)), ServerConfig(port=0, shutdown_grace_s=0.3))
    served = type("S", (), {"host_port": session.address, "api_key": None})()
    result = {}

    def call():
        result["response"] = post_json(served, "/v1/completions", {"prompt": "x", "max_tokens": 1000,
                                                                    "ignore_eos": True})

    thread = threading.Thread(target=call)
    thread.start()
    while session.snapshot().slots_live == 0:
        time.sleep(0.01)
    session.close()
    thread.join(10)
    status, payload = result["response"]
    assert assert_error(status, payload, 503, "shutting down")["code"] == "shutting_down"
    assert session.snapshot().requests_cancelled == 1
