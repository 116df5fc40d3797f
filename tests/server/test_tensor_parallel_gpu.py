"""Tensor parallel on GPU ranks (issue 28): `flare-serve CORE --tensor-parallel 2` on the GPU
test core (tools/make_test_core.py, FLARE_E2E_CORE; tools/gpu_check.sh builds it) over NCCL.
One rank killed or stopped mid-answer ends every open stream with an error naming it, and the
server exits 1 with no rank left behind. Skipped without the core or below two GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from test_tensor_parallel import fail_a_rank


def _gpus() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return sum(line.startswith("GPU ") for line in listed.splitlines())


pytestmark = pytest.mark.skipif(not os.environ.get("FLARE_E2E_CORE") or _gpus() < 2,
                                reason="needs FLARE_E2E_CORE and two GPUs")


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_failed_gpu_rank_fails_every_open_stream_and_the_server_exits_1(how):
    # a small core decodes thousands of tokens a second: long answers keep the streams open
    fail_a_rank("core", ("--device", "cuda", "--tensor-parallel", "2"), 2, how, streams=4, max_tokens=8000)
