"""Triton kernels for the CUDA path of the decoder.

- :mod:`.attention`: paged attention over the KV page pool (decode with context
  splits, chunked prefill), the same contract as
  :func:`flare.model.attention.paged_attention_reference`.
- :mod:`.elementwise`: fused RMSNorm, add + RMSNorm and SiLU-mul, matching
  :mod:`flare.model.layers`, and ``qkv_rope_write`` (q/k norm, rotate-half RoPE and the
  KV scatter of a layer in one launch), matching :func:`flare.model.decoder.qkv_rope_write`.
- :mod:`.gemv`: small-batch (decode batches up to 64) linear layers that stream the weights (the
  qkv one with RoPE and the K/V scatter as its epilogue, the gate/up one with the
  SiLU-mul, the logits stored as float32), with selectors that fall back to
  ``torch.nn.functional.linear`` and the elementwise kernels.
- :mod:`.sampling`: the greedy decode variant's token choice; :mod:`.slots`: a step's
  reads of the slot rows and its writes back (tokens, counts, completion records),
  matching :class:`flare.model.programs.StepPrograms`' own methods.

Every kernel takes a ``PDL`` constexpr: on Hopper it is launched with programmatic
dependent launch and waits on the previous kernel before reading anything it may
have written (:func:`._common.wait_for_inputs`); only weights are read before that.

Every wrapper is graph-capturable: launch shapes depend only on tensor shapes,
dtypes and the device, never on tensor values, and no wrapper synchronises. Run
each shape once before capture so compilation happens outside it. Importing
this package needs triton; on CPU tensors the kernels run only under Triton's
interpreter (``TRITON_INTERPRET=1`` set before triton is imported), which is how
tests/kernels checks them.
"""

from ._common import KernelInputError
from .attention import (
    DECODE_LAUNCH,
    MAX_SPLITS,
    PREFILL_LAUNCH,
    AttentionLaunch,
    choose_num_splits,
    packed_attention,
    packed_rows_attention,
    paged_attention,
    paged_decode_attention,
    paged_prefill_attention,
)
from .elementwise import add_rms_norm, embed_rms_norm, qkv_rope_write, rms_norm, silu_mul
from .gemv import (
    MAX_ROWS,
    GemvConfig,
    NormedRows,
    default_config,
    fuses_qkv_rope,
    linear,
    linear_add_rms_norm,
    linear_add_rms_norm_small_m,
    linear_float,
    linear_qkv_rope_small_m,
    linear_qkv_rope_write,
    linear_silu,
    linear_silu_small_m,
    linear_small_m,
    prefers_small_m,
)

__all__ = [
    "KernelInputError",
    "MAX_ROWS", "MAX_SPLITS",
    "GemvConfig", "NormedRows", "default_config", "fuses_qkv_rope", "linear", "linear_add_rms_norm",
    "linear_add_rms_norm_small_m", "linear_float", "linear_qkv_rope_small_m", "linear_qkv_rope_write", "linear_silu",
    "linear_silu_small_m", "linear_small_m", "prefers_small_m",
    "AttentionLaunch", "DECODE_LAUNCH", "PREFILL_LAUNCH", "choose_num_splits", "paged_attention",
    "paged_decode_attention", "paged_prefill_attention", "packed_attention", "packed_rows_attention",
    "add_rms_norm", "embed_rms_norm", "qkv_rope_write", "rms_norm", "silu_mul",
]
