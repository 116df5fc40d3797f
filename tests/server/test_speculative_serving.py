"""flare-serve --speculative copy and --speculative draft on the demo core: the same answers as
without them, the speculative counters in /metrics, and clear refusals of bad settings."""

from __future__ import annotations

import argparse

import pytest
from server_harness import post_json, request

from flare.server.options import ConfigError, add_server_arguments, load_server_config

PASSAGE = ("The lighthouse stood at the end of the rocky point, its white tower streaked with salt. Every "
           "evening the keeper climbed the steps, trimmed the wick and watched the beam sweep the water.")


def _parse(argv):
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return parser.parse_args(argv)


def test_bad_speculative_settings_are_refused():
    with pytest.raises(ConfigError, match="speculative must be one of copy, draft, none"):
        load_server_config(_parse(["--speculative", "draft-everything"]), {})
    with pytest.raises(ConfigError, match="speculative_depth must be 1..7"):
        load_server_config(_parse(["--speculative", "copy", "--speculative-depth", "9"]), {})
    with pytest.raises(ConfigError, match="needs a draft core"):
        load_server_config(_parse(["--speculative", "draft"]), {})
    with pytest.raises(ConfigError, match="used only with speculative 'draft'"):
        load_server_config(_parse(["--draft-core", "/tmp/draft"]), {})
    config = load_server_config(_parse(["--speculative", "draft", "--draft-core", "/tmp/draft"]), {})
    assert config.engine.draft_core == "/tmp/draft"
    config = load_server_config(_parse([]), {"FLARE_SPECULATIVE": "copy", "FLARE_SPECULATIVE_DEPTH": "3"})
    assert config.engine.speculative == "copy" and config.engine.speculative_depth == 3


def _metric(served, name: str) -> float:
    status, _, body = request(served, "GET", "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _assert_same_answers(server, spec, max_tokens: int) -> None:
    """A greedy copy request gets the same text and usage from both servers."""
    body = {"temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"Copy the following text word for word:\n\n{PASSAGE}"}]}
    answers = []
    for served in (server, spec):
        status, reply = post_json(served, "/v1/chat/completions", {**body, "model": served.model or "demo"},
                                  timeout=300)
        assert status == 200, reply
        answers.append((reply["choices"][0]["message"]["content"], reply["usage"]["completion_tokens"]))
    assert answers[0] == answers[1]


def test_copy_proposals_serve_the_same_answers(server, engine_kind, launcher):
    if engine_kind == "fake":
        pytest.skip("speculation runs in the model runtime: the real demo engine only")
    spec = launcher(extra_flags=("--speculative", "copy"))
    _assert_same_answers(server, spec, max_tokens=60)
    assert _metric(spec, "flare_speculative_verification_steps_total") > 0
    assert _metric(spec, "flare_speculative_accepted_tokens_total") > 0
    assert _metric(spec, "flare_speculative_mean_acceptance_length") > 0
    assert _metric(spec, 'flare_graph_launches_total{kind="speculative"}') > 0
    assert _metric(server, "flare_speculative_verification_steps_total") == 0


def test_a_draft_core_serves_the_same_answers(server, engine_kind, launcher):
    """The demo core drafting for itself (``flare-serve --speculative draft --draft-core``):
    explored widths verify its drafts, the answers stay the target's, the drafter steps count."""
    if engine_kind == "fake":
        pytest.skip("speculation runs in the model runtime: the real demo engine only")
    from flare.core.embedded import demo_core

    spec = launcher(extra_flags=("--speculative", "draft", "--draft-core", str(demo_core())))
    _assert_same_answers(server, spec, max_tokens=40)
    assert _metric(spec, "flare_speculative_drafter_steps_total") > 0
    assert _metric(spec, "flare_speculative_verification_steps_total") > 0
