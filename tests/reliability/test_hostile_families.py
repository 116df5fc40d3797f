"""The hostile-field sweep of test_hostile_requests.py over every other route that reads a body:
Anthropic's /v1/messages and count_tokens, /v1/responses, Ollama's /api/chat and /api/generate,
/tokenize and /detokenize. Each answer is a 4xx in the route family's error shape or a clean
answer, never a 500; afterwards the server's log is clean and it is idle.
"""

from __future__ import annotations

import http.client
import json

from hostile import FRAGMENTS, dump, place
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_harness import get_json, wait_idle
from test_hostile_requests import assert_log_clean

HI = [{"role": "user", "content": "Hi"}]


def _routes(model: str) -> dict[str, tuple[str, dict, tuple[tuple, ...]]]:
    """name -> (route, a valid body, the paths a hostile value goes to)."""
    anthropic_paths = ((), ("model",), ("max_tokens",), ("messages",), ("messages", 0), ("messages", 0, "role"),
                       ("messages", 0, "content"), ("messages", 0, "*"), ("system",), ("stop_sequences",),
                       ("metadata",), ("stream",), ("tools",), ("tool_choice",), ("thinking",), ("output_config",),
                       ("temperature",), ("top_p",), ("top_k",), ("*",))
    ollama_options = (("options",), ("options", "num_predict"), ("options", "temperature"), ("options", "num_ctx"),
                      ("options", "stop"), ("options", "seed"), ("options", "top_k"), ("options", "*"))
    return {
        "messages": ("/v1/messages", {"model": model, "max_tokens": 1, "messages": HI, "temperature": 0},
                     anthropic_paths),
        "count_tokens": ("/v1/messages/count_tokens", {"model": model, "messages": HI},
                         tuple(p for p in anthropic_paths if p not in (("max_tokens",), ("stream",)))),
        "responses": ("/v1/responses", {"model": model, "input": "Hi", "max_output_tokens": 16, "temperature": 0,
                                        "store": False},
                      ((), ("model",), ("input",), ("instructions",), ("max_output_tokens",), ("temperature",),
                       ("top_p",), ("tools",), ("tool_choice",), ("parallel_tool_calls",), ("text",),
                       ("reasoning",), ("store",), ("previous_response_id",), ("stream",), ("metadata",), ("*",))),
        "ollama_chat": ("/api/chat", {"model": model, "messages": HI, "stream": False,
                                      "options": {"num_predict": 1, "temperature": 0}},
                        ((), ("model",), ("messages",), ("messages", 0), ("messages", 0, "content"),
                         ("messages", 0, "role"), ("messages", 0, "images"), ("format",), ("keep_alive",),
                         ("stream",), ("think",), ("tools",), ("*",)) + ollama_options),
        "ollama_generate": ("/api/generate", {"model": model, "prompt": "Hi", "stream": False,
                                              "options": {"num_predict": 1}},
                            ((), ("model",), ("prompt",), ("system",), ("raw",), ("template",), ("images",),
                             ("suffix",), ("context",), ("stream",), ("*",)) + ollama_options),
        "tokenize": ("/tokenize", {"model": model, "messages": HI},
                     ((), ("model",), ("messages",), ("messages", 0, "content"), ("tools",), ("documents",),
                      ("chat_template_kwargs",), ("chat_template",), ("add_generation_prompt",),
                      ("add_special_tokens",), ("return_token_strs",), ("prompt",), ("*",))),
        "detokenize": ("/detokenize", {"model": model, "tokens": [1, 2]},
                       ((), ("model",), ("tokens",), ("tokens", 0), ("*",))),
    }


STREAMS = ("text/event-stream", "application/x-ndjson")


def _post(served, route: str, body: bytes) -> tuple[int, bytes]:
    """POST ``body``; a 200 stream is closed after its head (a client that leaves)."""
    host, port = served.host_port
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request("POST", route, body=body, headers={"Content-Type": "application/json",
                                                        "anthropic-version": "2023-06-01"})
        response = conn.getresponse()
        if response.status == 200 and response.getheader("content-type", "").startswith(STREAMS):
            return 200, b""
        return response.status, response.read()
    finally:
        conn.close()


def _check(name: str, status: int, payload: bytes) -> None:
    assert status < 500, payload[:500]
    if status < 400:
        return
    assert len(payload) < 4096, "error messages quote client values shortened"
    body = json.loads(payload)
    if name in ("messages", "count_tokens"):
        assert body["type"] == "error" and body["error"]["type"] and body["error"]["message"], body
    elif name.startswith("ollama"):
        assert set(body) == {"error"} and isinstance(body["error"], str) and body["error"], body
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["message"], body


NAMES = tuple(_routes("m"))
values = st.one_of(st.sampled_from(FRAGMENTS), st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=3))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=values)
def test_hostile_field_values_get_4xx_or_an_answer_on_every_family(served, data, value):
    name = data.draw(st.sampled_from(NAMES))
    route, body, paths = _routes(served.model)[name]
    path = data.draw(st.sampled_from(paths))
    status, payload = _post(served, route, dump(place(body, path, value)).encode("utf-8"))
    _check(name, status, payload)


def test_the_log_is_clean_and_the_server_idle_after_the_family_sweep(served):
    # Runs after the sweep in this module (pytest keeps file order).
    assert get_json(served, "/health") == (200, {"status": "ok"})
    wait_idle(served)
    assert_log_clean(served)
