"""Runs only in a process with TRITON_INTERPRET=1 (see ../conftest.py)."""

import os

import pytest

if os.environ.get("TRITON_INTERPRET") != "1":
    raise pytest.UsageError("tests/kernels/interpreted needs TRITON_INTERPRET=1 set before triton is imported")

pytest.importorskip("triton")

from .compat import install  # noqa: E402

install()
