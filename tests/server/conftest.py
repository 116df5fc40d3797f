"""Fixtures: servers under test, parametrized by engine kind (see server_harness.py).

The "demo" kind (on unless FLARE_E2E_DEMO=0) is a real ``flare-serve`` subprocess on
the embedded demo core; FLARE_E2E_CORE=DIR adds the "core" kind, ``flare-serve DIR``
(a GPU core in tools/gpu_check.sh). Both run the same tests as the fake engine.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
from server_harness import ENGINE_KINDS, Served, launch


@pytest.fixture(scope="module", params=ENGINE_KINDS)
def engine_kind(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(engine_kind) -> Served:
    """A default server (no api key), shared by a module."""
    served = launch(engine_kind, served_names=("flare-test/alias-one", "plain-alias") if engine_kind == "fake" else ())
    yield served
    served.stop()


@pytest.fixture
def fake_only(request, engine_kind) -> None:
    """Skip on real engines; each test names why in ``@pytest.mark.fake_only("reason")``."""
    marker = request.node.get_closest_marker("fake_only")
    assert marker and marker.args, "a fake_only test says why it cannot run on a real engine"
    if engine_kind != "fake":
        pytest.skip(f"fake engine only: {marker.args[0]}")


@pytest.fixture
def launcher(engine_kind) -> Callable[..., Served]:
    """Start extra servers with custom settings; stopped after the test."""
    started: list[Served] = []

    def start(**settings: Any) -> Served:
        served = launch(engine_kind, **settings)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


