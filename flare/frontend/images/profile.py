"""Preparation profiles: the settings that decide pixels, tokens and identities."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

# The resize mode of the Qwen profile: PyTorch's uint8 bicubic antialias.
RESIZE_BICUBIC_AA_U8 = "bicubic-antialias-uint8"


@dataclass(frozen=True)
class QwenImageProfile:
    """The Qwen3-VL image processor settings (preprocessor_config.json values).

    patch_size 16, temporal_patch_size 2, merge_size 2, mean/std 0.5 and the
    size bounds shortest_edge 65,536 / longest_edge 16,777,216 pixels, which
    transformers' Qwen2VLImageProcessor reads as min/max pixels.
    """

    name: str = "qwen3_vl"
    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 65_536
    max_pixels: int = 16_777_216
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    rescale_factor: float = 1 / 255
    num_position_embeddings: int = 2304   # the vision tower's 48 x 48 learned table
    max_aspect_ratio: float = 200.0
    resize_mode: str = RESIZE_BICUBIC_AA_U8
    keep_alpha: bool = False   # RGB8 profile: alpha is discarded
    keep_cmyk: bool = False

    @property
    def factor(self) -> int:
        """Side length both resized dimensions are multiples of."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Features per patch row: channels x temporal copies x patch pixels."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def position_grid_side(self) -> int:
        return int(self.num_position_embeddings ** 0.5)

    def settings_key(self) -> bytes:
        """Canonical bytes of every setting, for encoded-source keys."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    def normalization(self) -> tuple[np.ndarray, np.ndarray]:
        """(offset [3], divisor [3]) float32: a value x becomes (x - offset) / divisor.

        transformers fuses rescale and normalise: mean and std are divided by
        the rescale factor as float32 tensors, then ``(x - mean) / std`` runs
        in float32. The pack kernels run exactly those two float32 operations
        (for Qwen: (x - 127.5) / 127.5).
        """
        scale = np.float32(1.0 / self.rescale_factor)
        offset = np.asarray(self.image_mean, dtype=np.float32) * scale
        divisor = np.asarray(self.image_std, dtype=np.float32) * scale
        return np.ascontiguousarray(offset, dtype=np.float32), np.ascontiguousarray(divisor, dtype=np.float32)


QWEN3_VL = QwenImageProfile()
