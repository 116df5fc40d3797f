"""Input checks and device facts shared by the kernel wrappers.

Every wrapper validates tensor metadata only (shapes, dtypes, devices, strides),
never tensor values, so the checks cost host time once per call and nothing
inside a captured CUDA graph.
"""

from __future__ import annotations

import functools
import os

import torch

from ...errors import ExecutionError

# The interpreter runs on CPU tensors and has no multiprocessor count; launch
# heuristics then assume the H200 the CUDA path is tuned for (132 SMs).
DEFAULT_SM_COUNT = 132

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class KernelInputError(ExecutionError):
    """A kernel was called with tensors it cannot accept (shape, dtype, device, layout)."""

    code = "kernel_input_error"


# Kernels run under Triton's interpreter (tests without a GPU); read once, as triton does.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"


def require(ok: bool, kernel: str, message: str) -> None:
    """Raise KernelInputError naming the kernel when ``ok`` is false."""
    if not ok:
        raise KernelInputError(f"{kernel}: {message}")


def require_float(kernel: str, name: str, t: torch.Tensor) -> None:
    require(t.dtype in FLOAT_DTYPES, kernel, f"{name} must be bf16, fp16 or fp32, got {t.dtype}")


def require_inner_contiguous(kernel: str, name: str, t: torch.Tensor) -> None:
    require(t.stride(-1) == 1 or t.shape[-1] == 1, kernel,
            f"{name} must have a contiguous last dimension, got strides {tuple(t.stride())}")


def require_same_device(kernel: str, **tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    require(all(d == first for d in devices.values()), kernel,
            "tensors must share one device, got " + ", ".join(f"{n}={d}" for n, d in devices.items()))


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessors of ``device`` (cached), or DEFAULT_SM_COUNT off CUDA."""
    if device.type != "cuda":
        return DEFAULT_SM_COUNT
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_sm_count(index)


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot input precision: exact fp32 for fp32 operands (tests), native otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"
