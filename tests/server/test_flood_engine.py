"""The HTTP benchmark's load source (flare.testing.flood_engine) through the real server.

tools/bench_http.py measures Flare's SSE rate over this engine; when its chat
preparation fell behind the Engine interface every streamed request got a 500 and the
benchmark printed 0 events/s. These run the benchmark's own requests.
"""

from __future__ import annotations

import json

from server_harness import Served, request

from flare.config import ServerConfig
from flare.server.session import Server
from flare.testing.fake_engine import FakeEngineConfig
from flare.testing.flood_engine import FloodEngine


def _serve() -> Served:
    session = Server.start(FloodEngine(FakeEngineConfig(max_active=8, max_pending=64)),
                           ServerConfig(host="127.0.0.1", port=0, log_level="warning",
                                        trust_request_chat_template=True))
    return Served("fake", session.base_url, None, model=session.engine.card.id, session=session)


def test_streams_the_benchmark_request():
    served = _serve()
    try:
        body = {"model": served.model, "messages": [{"role": "user", "content": "benchmark"}], "stream": True,
                "ignore_eos": True, "max_tokens": 64}
        for _ in range(3):  # the benchmark repeats it on each connection
            status, headers, raw = request(served, "POST", "/v1/chat/completions", body)
            assert status == 200 and headers["content-type"].startswith("text/event-stream"), raw[:300]
            events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
            assert len(text.encode()) == 64
        status, _, raw = request(served, "POST", "/v1/chat/completions", {**body, "chat_template": "{{ 1 }}"})
        assert status == 400 and b"flood engine" in raw, raw  # the engine's refusal, the server trusts the field
    finally:
        served.stop()
