"""Admission limits for images, checked before any decode allocation."""

from __future__ import annotations

from dataclasses import dataclass

# The spec's scan bound for progressive JPEGs: more scans cost decode time
# without adding pixels (libjpeg-turbo's own guidance for untrusted input).
MAX_JPEG_SCANS = 100


@dataclass(frozen=True)
class ImageLimits:
    """Per-image and per-request bounds.

    max_encoded_bytes bounds the decoded base64 payload; max_pixels bounds
    width * height as declared by the file's header (the decoder never sees
    a file beyond it); max_images bounds images per request.
    """

    max_encoded_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    max_images: int = 32
    max_jpeg_scans: int = MAX_JPEG_SCANS

    def __post_init__(self) -> None:
        for name in ("max_encoded_bytes", "max_pixels", "max_images", "max_jpeg_scans"):
            if getattr(self, name) < 1:
                raise ValueError(f"ImageLimits.{name} must be positive")
