"""Runs tests/kernels/interpreted in subprocesses with TRITON_INTERPRET=1.

The subprocesses keep the interpreter out of this process, where tests/gpu may
run the same kernels compiled for CUDA. The files are spread over one process per
CPU (two at most): the interpreter is CPU-bound and single-threaded, and the rest of
the suite runs in one process, so on the 2-core CI machine the second core would
otherwise idle through the longest test of the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]
INTERPRETED = ROOT / "tests" / "kernels" / "interpreted"
# Seconds each file took alone on the 2-core development machine (2026-12-03), to balance
# the processes; a file not listed counts UNKNOWN_S. Every file runs whatever its weight.
SECONDS = {"test_attention.py": 93, "test_gemv_norm.py": 68, "test_decoder_ops.py": 41, "test_gemv_split.py": 30,
           "test_gemv.py": 15, "test_elementwise.py": 12, "test_sampling.py": 12, "test_slots.py": 7}
UNKNOWN_S = 20
MAX_PROCESSES = 2


def shards(files: list[str], count: int) -> list[list[str]]:
    """``files`` in at most ``count`` groups of about equal time (longest first, each to the
    least loaded group)."""
    groups: list[list[str]] = [[] for _ in range(max(1, count))]
    loads = [0.0] * len(groups)
    for name in sorted(files, key=lambda f: (-SECONDS.get(f, UNKNOWN_S), f)):
        i = loads.index(min(loads))
        groups[i].append(name)
        loads[i] += SECONDS.get(name, UNKNOWN_S)
    return [g for g in groups if g]


def test_shards_cover_every_file_once():
    files = sorted(p.name for p in INTERPRETED.glob("test_*.py"))
    for count in (1, 2, 3):
        groups = shards(files, count)
        assert sorted(f for g in groups for f in g) == files
        assert len(groups) == min(count, len(files))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                    reason="interpreted/ is collected in this process already")
def test_kernels_match_torch_reference_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONHASHSEED="0")
    files = sorted(p.name for p in INTERPRETED.glob("test_*.py"))
    groups = shards(files, min(MAX_PROCESSES, os.cpu_count() or 1))
    procs = [subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               *(str(INTERPRETED.relative_to(ROOT) / f) for f in group)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for group in groups]
    try:
        outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for group, proc, output in zip(groups, procs, outputs):
        assert proc.returncode == 0, f"interpreter tests {group} failed (rc={proc.returncode}):\n{output[-12000:]}"
        summary = output.strip().splitlines()[-1]
        assert " passed" in summary and "skipped" not in summary, output[-4000:]
