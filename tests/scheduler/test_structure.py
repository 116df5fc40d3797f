"""The scheduler package's internal structure: selection reads a view, never the scheduler.

policy.py (Selection), targets.py (CheckpointTargets) and view.py (SchedulerView) must
not import scheduler.py, so the policy cannot reach the scheduler's mutators, and the
RequestScheduler must provide every member of the view it hands to Selection.
"""

from __future__ import annotations

import ast
from pathlib import Path

from flare.scheduler.scheduler import RequestScheduler
from flare.scheduler.view import SchedulerView

from .driver import IDENTITY, contract

PACKAGE = Path(__file__).resolve().parents[2] / "flare" / "scheduler"


def _relative_imports(name: str) -> set[str]:
    tree = ast.parse((PACKAGE / name).read_text(encoding="utf-8"))
    return {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}


def test_selection_targets_and_the_view_do_not_import_the_scheduler():
    for name in ("policy.py", "targets.py", "view.py"):
        assert "scheduler" not in _relative_imports(name), name


def test_the_scheduler_provides_every_member_of_its_view():
    sched = RequestScheduler(contract(), IDENTITY)
    members = [name for name in vars(SchedulerView) if not name.startswith("_")]
    assert members and all(hasattr(sched, name) for name in members), \
        [name for name in members if not hasattr(sched, name)]
    assert sched.selection.s is sched and sched.selection.targets is sched.targets
