"""Shared pytest fixtures: registry-fetched assets (see flare/fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flare import fixtures


@pytest.fixture(scope="session")
def fixture_root() -> Path:
    """The verified fixture directory; fetched with pip on first use."""
    return fixtures.ensure_fixtures()


@pytest.fixture(scope="session")
def template_dir(fixture_root: Path) -> Path:
    return fixture_root / "templates"


@pytest.fixture(scope="session")
def vocab_dir(fixture_root: Path) -> Path:
    return fixture_root / "vocab"


@pytest.fixture(scope="session")
def shared_template_dir() -> Path | None:
    """../shared/templates beside the checkout, when present (50 more real templates)."""
    path = Path(__file__).resolve().parents[2] / "shared" / "templates"
    return path if path.is_dir() else None
