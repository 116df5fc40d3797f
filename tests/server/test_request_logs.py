"""Request logs (docs/serving.md, "Request logs"): one ``flare.requests`` line per finished
generation request, on the real demo engine in a ``flare-serve`` process: collected and
streamed in two families, refusals before and at submit, a client that left; never the
prompt's text; none with ``--no-log-requests``."""

from __future__ import annotations

import json
import re
import socket
import time

import pytest
from server_harness import ENGINE_KINDS, Served, launch, post_json, request

pytestmark = pytest.mark.skipif("demo" not in ENGINE_KINDS, reason="the demo engine is off (FLARE_E2E_DEMO=0)")

LINE = re.compile(r"INFO flare\.requests: request (?P<route>\S+) (?P<status>\S+) prompt=(?P<prompt>\S+) "
                  r"cached=(?P<cached>\S+) output=(?P<output>\S+) ttft=(?P<ttft>-|\d+ms) "
                  r"duration=(?P<duration>-|\d+\.\d{3}s) finish=(?P<finish>\S+)(?: error=(?P<error>\S+))?$")
SECRET = "marmalade-quasar-7731"  # in every prompt; must never reach the logs
MESSAGES = [{"role": "user", "content": f"Say hello to {SECRET}."}]


@pytest.fixture(scope="module")
def logged() -> Served:
    served = launch("demo", extra_flags=("--log-requests",))
    yield served
    served.stop()


def _logged_lines(served: Served) -> list[str]:
    return [line.rstrip("\n") for line in list(served.stderr_lines) if "flare.requests" in line]


def _next_line(served: Served, before: int, timeout: float = 20.0) -> dict:
    """The one request line logged after the first ``before`` (parsed), checked to be the only one."""
    deadline = time.monotonic() + timeout
    while len(_logged_lines(served)) <= before:
        assert time.monotonic() < deadline, "no request line was logged"
        time.sleep(0.01)
    time.sleep(0.2)  # a second line for the same request would be here by now
    lines = _logged_lines(served)[before:]
    assert len(lines) == 1, lines
    match = LINE.search(lines[0])
    assert match, lines[0]
    assert SECRET not in lines[0]
    return match.groupdict()


def _assert_finished(line: dict, route: str, *, prompt: int, cached: int, output: int, finish: str) -> None:
    assert line["route"] == route and line["status"] == "200", line
    assert (int(line["prompt"]), int(line["cached"]), int(line["output"])) == (prompt, cached, output), line
    assert line["finish"] == finish and line["error"] is None, line
    assert line["ttft"] != "-" and float(line["duration"][:-1]) >= int(line["ttft"][:-2]) / 1000 - 0.002, line


def test_openai_chat_collected_and_streamed(logged):
    before = len(_logged_lines(logged))
    status, reply = post_json(logged, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 3,
                                                               "temperature": 0}, timeout=120)
    assert status == 200, reply
    usage = reply["usage"]
    line = _next_line(logged, before)
    _assert_finished(line, "openai.chat", prompt=usage["prompt_tokens"],
                     cached=usage["prompt_tokens_details"]["cached_tokens"], output=usage["completion_tokens"],
                     finish=reply["choices"][0]["finish_reason"])
    content = reply["choices"][0]["message"]["content"]
    assert len(content) < 4 or not any(content in text for text in _logged_lines(logged))

    before = len(_logged_lines(logged))
    status, _, body = request(logged, "POST", "/v1/chat/completions",
                              {"messages": MESSAGES, "max_tokens": 3, "temperature": 0, "stream": True,
                               "stream_options": {"include_usage": True}}, timeout=120)
    assert status == 200
    chunks = [json.loads(part[6:]) for part in body.decode().split("\n\n") if part.startswith("data: {")]
    usage = chunks[-1]["usage"]
    reasons = [choice["finish_reason"] for chunk in chunks for choice in chunk["choices"] if choice["finish_reason"]]
    _assert_finished(_next_line(logged, before), "openai.chat", prompt=usage["prompt_tokens"],
                     cached=usage["prompt_tokens_details"]["cached_tokens"], output=usage["completion_tokens"],
                     finish=reasons[-1])


def test_ollama_chat_collected_and_streamed(logged):
    status, counted = post_json(logged, "/tokenize", {"messages": MESSAGES})
    assert status == 200, counted
    for stream in (False, True):
        before = len(_logged_lines(logged))
        status, _, body = request(logged, "POST", "/api/chat",
                                  {"model": logged.model, "messages": MESSAGES, "stream": stream,
                                   "options": {"num_predict": 3, "temperature": 0}}, timeout=120)
        assert status == 200
        final = json.loads(body.decode().strip().splitlines()[-1])
        assert final["done"] is True, final
        line = _next_line(logged, before)
        # prompt_eval_count counts the prompt tokens the prefix cache did not serve
        _assert_finished(line, "ollama.chat", prompt=counted["count"],
                         cached=counted["count"] - final["prompt_eval_count"], output=final["eval_count"],
                         finish=final["done_reason"])


def test_refusals_have_their_status(logged):
    # at submit: the prompt is known, the output does not fit
    before = len(_logged_lines(logged))
    status, reply = post_json(logged, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 10 ** 7},
                              timeout=120)
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded", reply
    line = _next_line(logged, before)
    prompt_len = int(re.search(r"prompt of (\d+) tokens", reply["error"]["message"]).group(1))
    assert line == {"route": "openai.chat", "status": "400", "prompt": str(prompt_len), "cached": "-",
                    "output": "-", "ttft": "-", "duration": line["duration"], "finish": "error",
                    "error": "context_length_exceeded"}, line

    # before generate(): an invalid body
    before = len(_logged_lines(logged))
    status, reply = post_json(logged, "/api/chat", {"model": logged.model, "messages": f"{SECRET} is not a list"})
    assert status == 400, reply
    line = _next_line(logged, before)
    assert (line["route"], line["status"], line["prompt"], line["output"], line["finish"]) == \
        ("ollama.chat", "400", "-", "-", "error"), line
    assert line["error"], line


def test_a_client_that_left_is_disconnected(logged):
    before = len(_logged_lines(logged))
    body = json.dumps({"model": logged.model, "prompt": f"Once upon a time {SECRET}", "max_tokens": 400,
                       "temperature": 0, "stream": True}).encode()
    sock = socket.create_connection(logged.host_port, timeout=120)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    received = b""
    while b"data: " not in received:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    sock.close()
    line = _next_line(logged, before)
    assert (line["route"], line["status"], line["output"], line["finish"], line["error"]) == \
        ("openai.completions", "disconnected", "-", "-", None), line
    assert line["ttft"] != "-", line


def test_prompt_text_never_logged(logged):
    before = len(_logged_lines(logged))
    status, reply = post_json(logged, "/v1/completions", {"prompt": f"Repeat: {SECRET} {SECRET}", "max_tokens": 8,
                                                          "temperature": 0}, timeout=120)
    assert status == 200, reply
    assert _next_line(logged, before)["route"] == "openai.completions"
    lines = _logged_lines(logged)
    assert all(LINE.search(line) for line in lines), lines  # every line of the module's requests, one format
    assert not any(SECRET in line for line in logged.stderr_lines)


def test_no_request_lines_when_switched_off():
    served = launch("demo", extra_flags=("--no-log-requests",))
    try:
        status, reply = post_json(served, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2},
                                  timeout=120)
        assert status == 200, reply
        status, reply = post_json(served, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 10 ** 7})
        assert status == 400, reply
    finally:
        assert served.stop() == 0
    deadline = time.monotonic() + 10
    while not any("drained" in line for line in served.stderr_lines):  # every line the server wrote is read
        assert time.monotonic() < deadline, served.stderr_lines
        time.sleep(0.01)
    assert not [line for line in served.stderr_lines if "flare.requests" in line]
