"""ImageProcessor: decode, resize, patch and position images; expand prompts.

The Qwen3-VL profile end to end (transformers ``Qwen2VLImageProcessor`` with
the torchvision backend and the Qwen3-VL model's position helpers):

    RgbImage --smart resize (uint8 bicubic antialias)--> [h, w, 3] uint8
             --fused (x - 127.5) / 127.5, 16x16 patches, 2 temporal copies,
               2x2 merge order--> pixel_values rows [h/16 * w/16, 1536]

``process`` packs a batch contiguously; ``expand_prompt`` turns each
``<|image_pad|>`` of rendered chat text into one token per merged block.

``process`` runs the two arrows as one pass per image
(flare._fast.image_patches.resize_pack): each band of 32 resized rows (one
row of 2x2 merge blocks) is resized into a cache-sized buffer and packed
straight into its contiguous run of pixel_values, so the resized image is
never built; ``resize`` builds it for inspection and tests. pixel_values come
from an OutputArena that reuses the previous batch's block once it has been
dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from flare._fast.image_patches import resize_pack
from flare._fast.image_resize import resize_bicubic_aa

from .arena import OutputArena
from .decode import decode_image
from .errors import ImageError
from .geometry import ImageGeometry, image_geometry
from .identity import semantic_identity, source_key
from .limits import ImageLimits
from .positions import patch_positions, rope_positions
from .profile import QWEN3_VL, QwenImageProfile
from .rgb_image import RgbImage
from .source import EncodedImage, parse_data_url

IMAGE_PAD = "<|image_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"

# The pixel_values block an ImageProcessor keeps for reuse, at most: a
# 4-megapixel image's 100 MB, or a batch of smaller ones.
OUTPUT_REUSE_BYTES = 256 << 20

# pixel_values of at least this many bytes are written with streaming
# (non-temporal) stores: six bytes out per byte of resized image would only
# evict the band being packed, and the next reader is a copy to the device.
# Measured here: 1 MP 3.0 ms streaming vs 6.5 ms cached, 4 MP 10 vs 29 ms.
STREAM_MIN_BYTES = 1 << 20

# Modality ids of expanded prompt tokens (transformers' mm_token_type_ids).
TEXT_MODALITY = 0
IMAGE_MODALITY = 1


@dataclass(frozen=True, eq=False)
class ProcessedImages:
    """Vision-tower inputs of a batch, packed in image order."""

    pixel_values: np.ndarray      # [N, 1536] float32, N = sum of per-image patches
    image_grid_thw: np.ndarray    # [num_images, 3] int64 rows [1, grid_h, grid_w]
    vision_positions: np.ndarray  # [N, 2] int64 (row, column) per patch
    interp_indices: np.ndarray    # [N, 4] int64 taps into the 48 x 48 position table
    interp_weights: np.ndarray    # [N, 4] float32 bilinear weights of those taps
    patch_offsets: np.ndarray     # [num_images + 1] int32 cumulative patch rows

    @property
    def num_images(self) -> int:
        return self.image_grid_thw.shape[0]


@dataclass(frozen=True, eq=False)
class ExpandedPrompt:
    """Token-level prompt with image placeholders expanded."""

    token_ids: np.ndarray         # [L] int32
    modality_ids: np.ndarray      # [L] int32: 0 text, 1 image
    positions: np.ndarray         # [4, L] int64 rows [text, T, H, W]
    mrope_delta: int              # next position minus L, for decode steps
    image_spans: tuple[tuple[int, int], ...]  # [start, end) tokens of each image


class ImageProcessor:
    """Native image preparation for one profile (Qwen3-VL by default)."""

    def __init__(self, profile: QwenImageProfile = QWEN3_VL, limits: ImageLimits | None = None,
                 *, output_reuse_bytes: int = OUTPUT_REUSE_BYTES):
        """``output_reuse_bytes`` bounds the pixel_values block kept for reuse
        between ``process`` calls (flare/frontend/images/arena.py); 0 disables it."""
        self.profile = profile
        self.limits = limits if limits is not None else ImageLimits()
        self._arena = OutputArena(output_reuse_bytes)
        self._offset, self._divisor = profile.normalization()
        self._settings = profile.settings_key()

    # -- sources -----------------------------------------------------------

    def parse(self, url: str, *, param: str | None = None) -> EncodedImage:
        """A base64 data URL as an EncodedImage (limits checked before decoding base64)."""
        return parse_data_url(url, self.limits, param=param)

    def decode(self, source: str | EncodedImage) -> RgbImage:
        """Decode a data URL or EncodedImage into the profile's RgbImage."""
        encoded = self.parse(source) if isinstance(source, str) else source
        return decode_image(encoded, self.limits, keep_alpha=self.profile.keep_alpha,
                            keep_cmyk=self.profile.keep_cmyk)

    def source_key(self, encoded: EncodedImage) -> bytes:
        """32-byte key of the encoded input under this processor's settings."""
        return source_key(encoded, self._settings)

    def semantic_identity(self, image: RgbImage) -> bytes:
        """32-byte identity of the decoded content and resize mode."""
        return semantic_identity(image, self.profile.resize_mode)

    # -- pixels ------------------------------------------------------------

    def geometry(self, image: RgbImage | tuple[int, int]) -> ImageGeometry:
        """Resized size and patch grid of an image (or of a (height, width) pair)."""
        height, width = (image.height, image.width) if isinstance(image, RgbImage) else image
        return image_geometry(height, width, self.profile)

    def resize(self, image: RgbImage, geometry: ImageGeometry | None = None) -> np.ndarray:
        """The resized [h, w, 3] uint8 RGB the patches are cut from."""
        geometry = geometry or self.geometry(image)
        if (geometry.resized_height, geometry.resized_width) == (image.height, image.width):
            return image.pixels
        return resize_bicubic_aa(image.pixels, geometry.resized_height, geometry.resized_width)

    def process(self, images: Sequence[RgbImage]) -> ProcessedImages:
        """Vision-tower inputs for ``images``, packed in order."""
        if len(images) > self.limits.max_images:
            raise ImageError("image_too_many_images",
                             f"{len(images)} images exceed the limit of {self.limits.max_images}")
        profile = self.profile
        geometries = [self.geometry(image) for image in images]
        offsets = np.zeros(len(images) + 1, dtype=np.int32)
        np.cumsum([g.num_patches for g in geometries], out=offsets[1:])
        num_patches = int(offsets[-1])
        pixel_values = self._arena.rows(num_patches, profile.patch_dim)
        stream = pixel_values.nbytes >= STREAM_MIN_BYTES
        start = 0
        for image, geometry in zip(images, geometries):
            end = start + geometry.num_patches
            # Resize, normalise and pack in one pass; the resized image is never built.
            resize_pack(image.pixels, geometry.resized_height, geometry.resized_width,
                        profile.patch_size, profile.merge_size, profile.temporal_patch_size,
                        self._offset, self._divisor, pixel_values[start:end], stream=stream)
            start = end
        grids = [(g.grid_h, g.grid_w) for g in geometries]
        positions, indices, weights = patch_positions(grids, profile.merge_size,
                                                      profile.position_grid_side)
        grid_thw = np.array([g.grid_thw for g in geometries], dtype=np.int64).reshape(-1, 3)
        return ProcessedImages(pixel_values, grid_thw, positions, indices, weights, offsets)

    # -- prompt ------------------------------------------------------------

    def expand_prompt(self, text: str, geometries: Sequence[ImageGeometry], tokenizer,
                      *, add_special_tokens: bool = True) -> ExpandedPrompt:
        """Expand each ``<|image_pad|>`` of rendered ``text`` and tokenize it.

        ``tokenizer`` is a ``tokenizers.Tokenizer`` that knows ``<|image_pad|>``
        as a special token. Returns token and modality ids and the four
        position rows [text, T, H, W] with the mRoPE delta.
        """
        pieces = text.split(IMAGE_PAD)
        if len(pieces) - 1 != len(geometries):
            raise ImageError("image_placeholders",
                             f"prompt has {len(pieces) - 1} {IMAGE_PAD} placeholders for "
                             f"{len(geometries)} images")
        pad_id = tokenizer.token_to_id(IMAGE_PAD)
        if pad_id is None:
            raise ImageError("image_placeholders", f"tokenizer has no {IMAGE_PAD} token")
        expanded = [pieces[0]]
        for geometry, piece in zip(geometries, pieces[1:]):
            expanded.append(IMAGE_PAD * geometry.num_tokens)
            expanded.append(piece)
        encoding = tokenizer.encode("".join(expanded), add_special_tokens=add_special_tokens)
        token_ids = np.asarray(encoding.ids, dtype=np.int32)
        is_image = token_ids == pad_id
        spans = _image_spans(is_image, [g.num_tokens for g in geometries])
        llm_grids = [(g.grid_h // g.merge_size, g.grid_w // g.merge_size) for g in geometries]
        positions, delta = rope_positions(len(token_ids), spans, llm_grids)
        return ExpandedPrompt(token_ids, is_image.astype(np.int32), positions, delta, tuple(spans))


def _image_spans(is_image: np.ndarray, counts: list[int]) -> list[tuple[int, int]]:
    """Split the image-token positions into one contiguous run per image."""
    where = np.flatnonzero(is_image)
    if len(where) != sum(counts):
        raise ImageError("image_placeholders",
                         f"tokenized prompt has {len(where)} image tokens, expected {sum(counts)} "
                         f"(is {IMAGE_PAD} a special token of this tokenizer?)")
    spans = []
    first = 0
    for count in counts:
        start = int(where[first]) if count else (spans[-1][1] if spans else 0)
        end = start + count
        if count and int(where[first + count - 1]) != end - 1:
            raise ImageError("image_placeholders", "an image's placeholder tokens are not contiguous")
        spans.append((start, end))
        first += count
    return spans
