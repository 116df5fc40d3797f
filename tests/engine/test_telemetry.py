"""EngineStats is the one declaration of engine statistics: docs/metrics.md follows it."""

from __future__ import annotations

import re
from pathlib import Path

from flare.engine.telemetry import COUNTER, EngineStats, stat_fields
from flare.server.metrics import ENGINE_COUNTERS, ENGINE_GAUGES

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(\w+)` \| `(flare_\w+)` \| (counter|gauge) \|", re.M)


def test_docs_metrics_lists_every_engine_stat_with_its_name_and_type():
    documented = {key: (name, kind) for key, name, kind in ROW.findall(DOC.read_text(encoding="utf-8"))}
    declared = {name: kind for name, kind, _ in stat_fields()}
    assert set(documented) == set(declared), set(documented) ^ set(declared)
    for key, kind in declared.items():
        exported = f"flare_{key}_total" if kind == COUNTER else f"flare_{key}"
        assert documented[key] == (exported, kind), key


def test_metrics_export_exactly_the_declared_stats():
    assert list(ENGINE_COUNTERS) == [name for name, _, _ in stat_fields(COUNTER)]
    assert set(ENGINE_COUNTERS) | set(ENGINE_GAUGES) == {name for name, _, _ in stat_fields()}
    assert EngineStats().slots_live == 0 and EngineStats().launches == {}
