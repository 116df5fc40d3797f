"""Input checks and device facts shared by the kernel wrappers.

Every wrapper validates tensor metadata only (shapes, dtypes, devices, strides),
never tensor values, so the checks cost host time once per call and nothing
inside a captured CUDA graph.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

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


# -- programmatic dependent launch ---------------------------------------------
#
# A decode step is hundreds of short kernels in a row. Launched with programmatic
# dependent launch (Hopper), a kernel's programs may start while the kernel before it
# is still running: the earlier kernel lets them start (griddepcontrol.launch_dependents,
# by every program of it or at its exit) and the later one waits on the grid
# dependency (griddepcontrol.wait: the earlier kernel has finished and its writes are
# visible) before it reads or writes anything an earlier kernel may touch. Only
# immutable data (weights) may be read before the wait: the GEMVs load their first
# weight tile there, so launch latency and the weight stream's ramp-up hide behind
# the previous kernel. Every wait finishes only after the previous kernel has, which
# finished only after its own predecessor, and so on: after its wait, a kernel runs
# after everything before it in the stream, as without PDL.
#
# One exception: the decode attention also reads the step's metadata and its older
# keys before the wait (attention.paged_decode_attention says why that is safe there).
#
# Where the earlier kernel lets the later one start is the level (the PDL constexpr
# of every kernel here): 0 no PDL; 1 after its own wait; 2 at its very start, so a
# chain of short kernels and the next GEMV's first tiles all start early; PDL_LATE where
# the kernel calls start_next_kernel_late, after its wait (at its exit if it never does).
# The GEMV kernel's tensor-core launches (more than one row) take PDL_LATE after their K
# loop (gemv.GemvConfig.trigger_after_loop): their one large program an SM streams better
# without early arrivals beside it.
#
# pdl_mode "auto": level PDL_AUTO_LEVEL for CUDA tensors of a compute capability 9.0+
# device; "on": that level always (the sm_90 compile test, which runs the wrappers on
# CPU tensors); "off": never.
PDL_MODES = ("auto", "on", "off")
pdl_mode = os.environ.get("FLARE_PDL", "auto")
PDL_AUTO_LEVEL = 2
PDL_LATE = 3


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def pdl_level(t: torch.Tensor) -> int:
    """The PDL constexpr for kernels launched on ``t``'s device (0: plain launches)."""
    if pdl_mode not in PDL_MODES:
        raise ExecutionError(f"FLARE_PDL must be one of {', '.join(PDL_MODES)}, got {pdl_mode!r}")
    if pdl_mode == "on":
        return PDL_AUTO_LEVEL
    if pdl_mode == "off" or INTERPRETED or t.device.type != "cuda":
        return 0
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return PDL_AUTO_LEVEL if _capability(index) >= (9, 0) else 0


def pdl_options(level: int) -> dict:
    """Launch options for a kernel whose PDL constexpr is ``level``."""
    return {"launch_pdl": True} if level else {}


@triton.jit
def start_next_kernel_early(PDL: tl.constexpr):
    """At level 2, let the next kernel start now (call first thing in the kernel)."""
    if PDL == 2:
        gdc_launch_dependents()


@triton.jit
def start_next_kernel_late(PDL: tl.constexpr):
    """At level PDL_LATE, let the next kernel start now (after wait_for_inputs)."""
    if PDL == 3:
        gdc_launch_dependents()


@triton.jit
def wait_for_inputs(PDL: tl.constexpr):
    """Under PDL: wait until the previous kernel has finished (its writes visible) and let
    the next kernel start. Before this call a kernel may read only what no kernel of the
    step writes (weights); after it, anything.
    """
    if PDL == 2:
        gdc_launch_dependents()
        gdc_wait()
    elif PDL == 1:
        gdc_wait()
        gdc_launch_dependents()
    elif PDL == 3:  # PDL_LATE: the kernel lets the next one start later
        gdc_wait()
