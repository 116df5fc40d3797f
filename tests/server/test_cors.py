"""Requests from web pages (server/cors.py), on every engine kind.

A browser's flow: the preflight (OPTIONS with Origin and Access-Control-Request-*),
then the request with Origin, whose response must name that origin for the page to
read it, streamed or not, errors included. Origins that are not allowed get 403 in the
route family's error shape before any work; requests without Origin are untouched.
"""

from __future__ import annotations

import json

import pytest
from server_harness import metrics, request, wait_idle

from flare.config import ServerConfig
from flare.server.cors import OriginPolicy
from flare.server.options import ConfigError, load_server_config

ALLOWED = ("https://chat.example.com", "https://*.apps.example.net", "http://10.1.2.3:*")


@pytest.fixture(scope="module")
def cors_server(engine_kind):
    from server_harness import launch

    served = launch(engine_kind, allowed_origins=ALLOWED)
    yield served
    served.stop()


def chat(served, **extra):
    return {"model": served.model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 3, **extra}


def _preflight(served, origin, path="/v1/chat/completions", headers="content-type, authorization"):
    return request(served, "OPTIONS", path, headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                                     "Access-Control-Request-Headers": headers})


@pytest.mark.parametrize("origin", ["http://localhost:5173", "http://127.0.0.1", "https://[::1]:8443",
                                    "https://chat.example.com", "https://ui.apps.example.net",
                                    "http://10.1.2.3:3000"])
def test_preflight_then_request_from_an_allowed_origin(cors_server, origin):
    status, headers, body = _preflight(cors_server, origin)
    assert status == 204 and body == b"" and "content-length" not in headers
    assert headers["access-control-allow-origin"] == origin
    assert "POST" in headers["access-control-allow-methods"]
    assert headers["access-control-allow-headers"] == "content-type, authorization"
    assert int(headers["access-control-max-age"]) > 0
    status, headers, body = request(cors_server, "POST", "/v1/chat/completions", chat(cors_server),
                                    headers={"Origin": origin})
    assert status == 200, body
    assert headers["access-control-allow-origin"] == origin and "origin" in headers["vary"]
    assert json.loads(body)["choices"][0]["message"]["content"]


def test_streamed_response_names_the_origin(cors_server):
    origin = "https://chat.example.com"
    status, headers, body = request(cors_server, "POST", "/v1/chat/completions", chat(cors_server, stream=True),
                                    headers={"Origin": origin})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert headers["access-control-allow-origin"] == origin
    assert body.rstrip().endswith(b"data: [DONE]")


def _family_error(path: str, payload: dict) -> str:
    """The message of an error in the route family's own shape."""
    if path == "/api/chat":  # Ollama: {"error": "..."}
        return payload["error"]
    if path == "/v1/messages":  # Anthropic: {"type": "error", "error": {"type", "message"}}
        assert payload["type"] == "error" and payload["error"]["type"] == "permission_error"
        return payload["error"]["message"]
    assert payload["error"]["code"] == "origin_not_allowed"  # OpenAI
    return payload["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/api/chat"])
def test_other_origins_get_403_in_the_family_shape_before_any_work(cors_server, path):
    body = chat(cors_server)
    if path == "/api/chat":  # Ollama's request shape
        del body["max_tokens"]
        body.update(stream=False, options={"num_predict": 3})
    before = wait_idle(cors_server)
    for origin in ("https://evil.example.org", "https://chat.example.com.evil.org", "null",
                   "https://deep.apps.example.net.evil.org", "http://10.1.2.3.evil.org:80"):
        status, headers, raw = request(cors_server, "POST", path, body,
                                       headers={"Origin": origin, "Content-Type": "text/plain"})
        assert status == 403, (origin, raw)
        assert "access-control-allow-origin" not in headers
        assert origin in _family_error(path, json.loads(raw))
        status, headers, _ = _preflight(cors_server, origin, path)
        assert status == 403 and "access-control-allow-origin" not in headers
    # none of them reached the model
    assert metrics(cors_server)["flare_requests_admitted_total"] == before["flare_requests_admitted_total"]
    # the server goes on serving the same request without an Origin
    status, _, raw = request(cors_server, "POST", path, body)
    assert status == 200, raw


def test_requests_without_origin_are_untouched(cors_server):
    status, headers, _ = request(cors_server, "POST", "/v1/chat/completions", chat(cors_server))
    assert status == 200 and not any(name.startswith("access-control") for name in headers)
    status, headers, body = request(cors_server, "OPTIONS", "/v1/models")
    assert status == 204 and body == b"" and headers["allow"] == "GET, OPTIONS"
    status, _, _ = request(cors_server, "OPTIONS", "/no/such/route")
    assert status == 404


def test_errors_and_refusals_carry_the_grant(cors_server):
    # a page can read why its request failed: validation errors and unknown models
    origin = "http://localhost:3000"
    status, headers, body = request(cors_server, "POST", "/v1/chat/completions", chat(cors_server, max_tokens=-1),
                                    headers={"Origin": origin})
    assert status == 400 and headers["access-control-allow-origin"] == origin
    status, headers, _ = request(cors_server, "POST", "/v1/chat/completions", {**chat(cors_server), "model": "nope"},
                                 headers={"Origin": origin})
    assert status == 404 and headers["access-control-allow-origin"] == origin


def test_allow_all(launcher):
    served = launcher(allowed_origins=("*",))
    origin = "https://anything.example.org"
    status, headers, _ = _preflight(served, origin, headers="")
    assert status == 204 and headers["access-control-allow-origin"] == origin
    assert "content-type" in headers["access-control-allow-headers"]  # the default list when none are named
    status, headers, _ = request(served, "GET", "/v1/models", headers={"Origin": origin})
    assert status == 200 and headers["access-control-allow-origin"] == origin


def test_api_key_is_still_required_and_its_401_is_readable(launcher):
    served = launcher(api_key="page-key")
    origin = "http://localhost:8080"
    status, headers, _ = _preflight(served, origin)  # a preflight carries no credentials
    assert status == 204
    status, headers, _ = request(served, "POST", "/v1/chat/completions", chat(served), auth=False,
                                 headers={"Origin": origin})
    assert status == 401 and headers["access-control-allow-origin"] == origin
    status, headers, _ = request(served, "POST", "/v1/chat/completions", chat(served), headers={"Origin": origin})
    assert status == 200


# -- the option ------------------------------------------------------------------

def test_option_sources_and_validation():
    assert load_server_config({"allowed_origins": ["https://a.example.com"]}, {}).allowed_origins == (
        "https://a.example.com",)
    env = {"FLARE_ALLOWED_ORIGINS": "https://a.example.com, http://*.lan:*"}
    assert load_server_config(None, env).allowed_origins == ("https://a.example.com", "http://*.lan:*")
    assert ServerConfig().allowed_origins == ()
    for bad in ("example.com", "https://a.example.com/path", "https://a b.com", "ftp//x"):
        with pytest.raises(ConfigError, match="allowed origin"):
            load_server_config({"allowed_origins": [bad]}, {})


def test_policy_matching():
    policy = OriginPolicy(("https://*.example.com",))
    assert policy.allows(b"https://a.example.com") and policy.allows(b"https://A.Example.COM")
    assert policy.allows(b"http://localhost:1234") and policy.allows(b"http://localhost")
    assert not policy.allows(b"https://example.com.evil.org")
    assert not policy.allows(b"https://evil.org/https://a.example.com")
    assert not policy.allows(b"https://a.example.com:1.evil.org")
    assert not policy.allows(b"http://localhost.evil.org")
    assert not policy.allows(b"null")
    for i in range(1000):  # the verdict cache stays bounded
        policy.allows(b"https://h%d.example.com" % i)
    assert len(policy._verdicts) <= 256
