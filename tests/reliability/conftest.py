"""The fault suite runs against the same server kinds as tests/server (see its harness)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))

from server_harness import ENGINE_KINDS, Served, launch  # noqa: E402


@pytest.fixture(scope="module", params=ENGINE_KINDS)
def engine_kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def served(engine_kind) -> Served:
    """A subprocess server per module, so its stderr (tracebacks) and RSS can be read."""
    server = launch(engine_kind, subprocess_mode=True, max_active=4, tokens_per_s=200)
    yield server
    server.stop()
