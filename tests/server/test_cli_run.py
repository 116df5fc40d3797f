"""`flare run` without a core serves the embedded demo core, as flare-serve does, says where
the core is, and logs each startup step once."""

from __future__ import annotations

import sys

import pytest
from server_harness import ENGINE_KINDS, post_json, start_subprocess


@pytest.mark.skipif("demo" not in ENGINE_KINDS, reason="the demo engine is off (FLARE_E2E_DEMO=0)")
def test_flare_run_without_a_core_serves_the_demo():
    from flare.core.embedded import demo_core

    argv = [sys.executable, "-c", "import sys; from flare.cli import main; sys.exit(main())",
            "run", "--host", "127.0.0.1", "--port", "0"]
    served = start_subprocess(argv, kind="demo")
    try:
        assert any(f"serving the demo core at {demo_core()}" in line for line in served.stderr_lines)
        for step in ("chat template endpoints", "KV cache:", "structured output: grammar engine ready"):
            assert sum(step in line for line in served.stderr_lines) == 1, (step, served.stderr_lines)
        assert not any("loading loading" in line for line in served.stderr_lines)
        status, reply = post_json(served, "/v1/completions", {"model": served.model, "prompt": "Hello",
                                                               "max_tokens": 2, "temperature": 0}, timeout=120)
        assert status == 200 and reply["usage"]["completion_tokens"] == 2, reply
    finally:
        assert served.stop() == 0
