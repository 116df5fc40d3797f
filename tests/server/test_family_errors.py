"""Protocol-level refusals (decided before any handler runs) answer in the shape of the family
whose route the request named: a 413 on /v1/messages is Anthropic's error, on /api/chat
Ollama's, on /v1/chat/completions and unknown paths OpenAI's (the default)."""

from __future__ import annotations

import json

import pytest
from server_harness import request


@pytest.fixture(scope="module")
def small(launcher_module):
    return launcher_module(max_body_bytes=4096)


@pytest.fixture(scope="module")
def launcher_module(engine_kind):
    from server_harness import launch
    started = []

    def start(**settings):
        served = launch(engine_kind, **settings)
        started.append(served)
        return served
    yield start
    for served in started:
        served.stop()


BIG = json.dumps({"messages": [{"role": "user", "content": "x" * 8000}]}).encode()


@pytest.mark.parametrize("path,shape", [
    ("/v1/messages", "anthropic"), ("/v1/messages/count_tokens", "anthropic"), ("/api/chat", "ollama"),
    ("/api/generate", "ollama"), ("/v1/responses", "openai"), ("/v1/chat/completions", "openai"),
    ("/no/such/route", "openai"),
])
def test_a_body_over_the_limit_is_refused_in_the_routes_shape(small, path, shape):
    status, _, payload = request(small, "POST", path, raw_body=BIG)
    assert status == 413
    body = json.loads(payload)
    if shape == "anthropic":
        assert body["type"] == "error" and "4096" in body["error"]["message"]
    elif shape == "ollama":
        assert set(body) == {"error"} and isinstance(body["error"], str) and "4096" in body["error"]
    else:
        assert body["error"]["code"] == "http_413" and "4096" in body["error"]["message"]
