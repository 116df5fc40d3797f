"""Runs tests/kernels/interpreted in a subprocess with TRITON_INTERPRET=1.

The subprocess keeps the interpreter out of this process, where tests/gpu may
run the same kernels compiled for CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                    reason="interpreted/ is collected in this process already")
def test_kernels_match_torch_reference_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONHASHSEED="0")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/kernels/interpreted"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"interpreter tests failed (rc={proc.returncode}):\n{output[-12000:]}"
    summary = output.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, output[-4000:]
