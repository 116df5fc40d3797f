"""Fixes to Triton 3.6's interpreter so kernels run on CPU tensors as they do on the GPU.

Applied only inside the interpreter subprocess (see tests/kernels/test_interpreter.py):

1. Loop bounds loaded from memory are 1-element arrays, and NumPy >= 2.4 refuses
   ``int()`` on them (triton-lang/triton#9171, fixed upstream after 3.6.0).
2. bf16 values are stored as uint16 and ``tl.dot`` multiplies that storage as
   integers; the GPU multiplies bf16 exactly into fp32, so widen first.
3. fp32 -> bf16 casts truncate; the GPU rounds to nearest even.
4. libdevice has no interpreter implementation; the kernels call its exp and rsqrt (the
   functions torch's CUDA kernels use). NumPy's, through tl.exp and tl.rsqrt, stand in.
"""

from __future__ import annotations

import numpy as np
import torch
import triton.language as tl
from triton.language.extra import libdevice
from triton.runtime import interpreter


def _bf16_to_fp32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _fp32_to_bf16(values: np.ndarray) -> np.ndarray:
    rounded = torch.from_numpy(np.array(values, dtype=np.float32)).to(torch.bfloat16)
    return rounded.view(torch.int16).numpy().view(np.uint16)


def install() -> None:
    """Patch the interpreter in this process (idempotent)."""
    if getattr(interpreter, "_flare_compat", False):
        return
    interpreter._flare_compat = True

    patch_tensor = interpreter._patch_lang_tensor

    def _patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(np.asarray(self.handle.data).reshape(())))

    interpreter._patch_lang_tensor = _patch_lang_tensor

    builder = interpreter.InterpreterBuilder
    create_dot = builder.create_dot

    def _widen(handle):
        if handle.dtype.scalar == tl.bfloat16:
            return interpreter.TensorHandle(_bf16_to_fp32(handle.data), tl.float32)
        return handle

    def _create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, _widen(a), _widen(b), d, input_precision, max_num_imprecise_acc)

    builder.create_dot = _create_dot

    cast_impl = builder.cast_impl

    def _cast_impl(self, src, dst_type):
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        if src_ty == tl.float32 and dst_ty == tl.bfloat16:
            return interpreter.TensorHandle(_fp32_to_bf16(src.data), tl.bfloat16)
        if src_ty == tl.bfloat16 and dst_ty == tl.float32:
            return interpreter.TensorHandle(_bf16_to_fp32(src.data), tl.float32)
        return cast_impl(self, src, dst_type)

    builder.cast_impl = _cast_impl  # create_fp_ext / create_fp_trunc dispatch through it

    # Called while the interpreter has tl's builtins patched (a kernel is running).
    libdevice.exp = lambda x: tl.exp(x)
    libdevice.rsqrt = lambda x: tl.rsqrt(x)
