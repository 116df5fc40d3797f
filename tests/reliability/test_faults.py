"""Faults from clients and model repositories: disconnects at every phase, slow and
stalled clients, hostile chat templates in a served core. Each case asserts the
status the client gets (when it is still there), a log without tracebacks, and
the server back at idle."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from hostile import HealthProbe
from server_harness import FLARE_SERVE, get_json, launch, metrics, post_json, start_subprocess, wait_idle

LONG = {"messages": [{"role": "user", "content": "Talk for a long while."}], "max_tokens": 400,
        "ignore_eos": True}


def _request_bytes(served, body: dict) -> bytes:
    data = json.dumps({"model": served.model, **body}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(data)) + data


def _until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


def _log_clean(served) -> None:
    log = "".join(served.stderr_lines)
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


@pytest.mark.parametrize("phase", ["in_head", "in_body", "before_first_token", "mid_stream", "awaiting_json"])
def test_disconnect_at_every_phase_frees_everything(served, phase):
    before = metrics(served)
    wire = _request_bytes(served, {**LONG, "stream": phase != "awaiting_json"})
    head_end = wire.index(b"\r\n\r\n") + 4
    sock = socket.create_connection(served.host_port)
    if phase == "in_head":
        sock.sendall(wire[:head_end // 2])
    elif phase == "in_body":
        sock.sendall(wire[:head_end + 5])
    else:
        sock.sendall(wire)
        if phase == "mid_stream":
            _until(lambda: b"data: " in sock.recv(65536))
        elif phase == "awaiting_json":
            _until(lambda: metrics(served).get("flare_generated_tokens_total", 0)
                   > before.get("flare_generated_tokens_total", 0))
    time.sleep(0.1)
    sock.close()
    sample = wait_idle(served)
    if phase in ("mid_stream", "awaiting_json"):
        _until(lambda: metrics(served)["flare_requests_cancelled_total"] > before["flare_requests_cancelled_total"])
        assert metrics(served)["flare_http_disconnects_total"] > before["flare_http_disconnects_total"]
    assert sample["flare_http_admitted"] == 0
    assert get_json(served, "/health") == (200, {"status": "ok"})
    _log_clean(served)


def test_slow_and_stalled_clients_time_out_without_holding_anything(engine_kind):
    served = launch(engine_kind, subprocess_mode=True, request_timeout_s=1.0)
    try:
        wire = _request_bytes(served, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        replies: list[bytes] = []

        def slowloris(data: bytes) -> None:
            with socket.create_connection(served.host_port, timeout=10) as sock:
                try:
                    for i in range(0, len(data), 4):  # four bytes every 0.2 s: never done in 1 s
                        sock.sendall(data[i:i + 4])
                        time.sleep(0.2)
                except OSError:
                    pass
                try:
                    replies.append(sock.recv(4096))
                except OSError:
                    replies.append(b"")

        stalled = [socket.create_connection(served.host_port) for _ in range(10)]  # connect, send nothing
        for sock in stalled[:5]:
            sock.sendall(wire[:40])  # part of a head, then silence
        threads = [threading.Thread(target=slowloris, args=(wire,)) for _ in range(10)]
        for thread in threads:
            thread.start()
        start = time.monotonic()
        for _ in range(10):  # the server keeps answering others meanwhile
            t0 = time.monotonic()
            assert get_json(served, "/health") == (200, {"status": "ok"})
            assert time.monotonic() - t0 < 0.1
            time.sleep(0.1)
        for thread in threads:
            thread.join(15)
        assert time.monotonic() - start < 15
        assert all(r.startswith(b"HTTP/1.1 408") for r in replies), replies
        for sock in stalled[:5]:
            sock.settimeout(5)
            assert sock.recv(4096).startswith(b"HTTP/1.1 408")
        for sock in stalled:
            sock.close()
        wait_idle(served)
        _log_clean(served)
    finally:
        served.stop()


# -- hostile chat templates, served ---------------------------------------------------

HOSTILE_TEMPLATES = {
    "chained_pow": "{{ 99 ** 99 ** 99 ** 99 }}",  # left-associative, as in jinja2: (99 ** 99) ** 99 ...
    "nested_pow": "{% set x = 2 ** 4000 %}{{ (x ** 100000) }}",
    "string_doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}{{ ns.s | length }}",
    "big_repeat": "{{ 'x' * 10 ** 12 }}",
    "list_of_large_strings": "{% set big = 'y' * 1000000 %}{% set ns = namespace(l=[]) %}"
                             "{% for i in range(4000) %}{% set ns.l = ns.l + [big] %}{% endfor %}{{ ns.l | length }}",
    "near_fuel_loop": "{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}x",
    "raises": "{{ raise_exception('this template refuses every conversation') }}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
}


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    from tests.model.harness import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("ckpt"), max_positions=512)


def _serve_with_template(checkpoint: Path, out: Path, template: str, *flags: str):
    from flare.core.export import ExportOptions, export_core

    ckpt = Path(shutil.copytree(checkpoint, out / "ckpt"))
    (ckpt / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": "t2"}))
    core = export_core(ckpt, out / "core", ExportOptions(context=512, prefill_chunk_size=128, max_active=4,
                                                          served_names=("tiny",)))
    return start_subprocess([*FLARE_SERVE, str(core), "--port", "0", *flags], kind="core")


def test_hostile_templates_are_400s_that_never_stall_the_server(tiny_checkpoint, tmp_path):
    # One server per template would be slow; a core whose template dispatches on the
    # user's message runs every hostile body in one process.
    branches = "".join(f"{{% {'if' if i == 0 else 'elif'} messages[-1]['content'] == '{name}' %}}{body}"
                       for i, (name, body) in enumerate(HOSTILE_TEMPLATES.items()))
    template = branches + "{% else %}{% for m in messages %}{{ m['content'] }}{% endfor %}{% endif %}"
    served = _serve_with_template(tiny_checkpoint, tmp_path, template)
    try:
        host, port = served.host_port
        probe = HealthProbe(served.host_port)
        for name in HOSTILE_TEMPLATES:
            body = {"messages": [{"role": "user", "content": name}], "max_tokens": 2}
            t0 = time.monotonic()
            conn = http.client.HTTPConnection(host, port, timeout=60)
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = json.loads(response.read())
            elapsed = time.monotonic() - t0
            assert response.status == 400, (name, payload)
            assert payload["error"]["message"], name
            assert elapsed < 3.0, (name, elapsed)  # the 2 s render budget, and a little
        assert get_json(served, "/v1/models")[0] == 200
        worst, _ = probe.stop()
        # A render on the event loop would hold /health for as long as the render runs (the
        # slow bodies here burn up to the 2 s budget); on the 2-core CI machine the OS alone
        # delays a probe by 100-200 ms at times (136 and 184 ms in two runs on 2026-12-04).
        assert worst < 0.5, f"/health took {worst * 1e3:.1f} ms while hostile templates rendered"
        plain = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
        conn = http.client.HTTPConnection(host, port, timeout=60)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(plain),
                     headers={"Content-Type": "application/json"})
        assert conn.getresponse().status == 200
        wait_idle(served)
        _log_clean(served)
    finally:
        served.stop()


def test_health_stays_fast_while_a_template_burns_its_budget(tiny_checkpoint, tmp_path):
    served = _serve_with_template(tiny_checkpoint, tmp_path, HOSTILE_TEMPLATES["near_fuel_loop"],
                                  "--template-time-limit", "0.5")
    try:
        host, port = served.host_port
        probe = HealthProbe(served.host_port)

        times = []

        def burn() -> None:
            t0 = time.monotonic()
            conn = http.client.HTTPConnection(host, port, timeout=60)
            conn.request("POST", "/v1/chat/completions", body=json.dumps(
                {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}),
                headers={"Content-Type": "application/json"})
            assert conn.getresponse().status == 400
            times.append(time.monotonic() - t0)

        threads = [threading.Thread(target=burn) for _ in range(4)]  # more than the two frontend workers
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        # --template-time-limit 0.5: each request's renders stop at 0.5 s (two workers, four requests).
        assert len(times) == 4 and min(times) < 1.0 and max(times) < 2.5, times
        worst, _ = probe.stop()
        assert worst < 0.1, f"/health took {worst * 1e3:.1f} ms while templates rendered"
        wait_idle(served)
        _log_clean(served)
    finally:
        served.stop()


def test_megabyte_prompts_do_not_stall_the_event_loop(served):
    """Tokenizing a prompt of a megabyte takes a third of a second: it must not hold the
    event loop (and so /health and every stream) for that long."""
    host, port = served.host_port
    probe = HealthProbe(served.host_port)
    text = "hello world, " * 80_000  # 1.04 MB, far beyond the context: 400 after tokenizing
    for body, route in (({"prompt": text, "max_tokens": 1}, "/v1/completions"),
                        ({"messages": [{"role": "user", "content": text}], "max_tokens": 1},
                         "/v1/chat/completions")) * 2:
        conn = http.client.HTTPConnection(host, port, timeout=60)
        conn.request("POST", route, body=json.dumps({"model": served.model, **body}),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        payload = json.loads(response.read())
        assert response.status in (400, 413), payload
        conn.close()
    worst, _ = probe.stop()
    assert worst < 0.1, f"/health took {worst * 1e3:.1f} ms while a long prompt was tokenized"
    wait_idle(served)
    _log_clean(served)


def test_a_tokenizer_the_grammar_engine_cannot_read_serves_without_structured_output(tiny_checkpoint, tmp_path):
    # The tiny checkpoint's tokenizer.json has no decoder, which llguidance refuses: the server
    # still starts, says why once, serves plain requests and answers constrained ones with a 400.
    served = _serve_with_template(tiny_checkpoint, tmp_path, "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    try:
        hi = [{"role": "user", "content": "hello"}]
        status, body = post_json(served, "/v1/chat/completions", {"messages": hi, "max_tokens": 2,
                                                                 "response_format": {"type": "json_object"}})
        assert status == 400 and "structured output is not available" in body["error"]["message"], body
        assert post_json(served, "/v1/chat/completions", {"messages": hi, "max_tokens": 2})[0] == 200
        assert "structured output is unavailable" in "".join(served.stderr_lines)
        wait_idle(served)
    finally:
        served.stop()
