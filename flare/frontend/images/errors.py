"""Typed image errors: one FrontendError subclass, one stable code per problem.

Every rejection names the problem in its message and carries a distinct
``code`` so the HTTP edge (and tests) can tell a truncated file from a
decompression bomb without parsing text.
"""

from __future__ import annotations

from flare.errors import FrontendError

# code -> what it means; the set is closed so tests can check distinctness.
IMAGE_ERROR_CODES = {
    "image_remote_url": "a remote (http/https/file) URL instead of a data URL",
    "image_data_url": "a malformed data URL (not data:<type>;base64,<payload>)",
    "image_base64": "a payload that is not valid base64",
    "image_media_type": "a media type other than image/png, image/jpeg, image/webp",
    "image_media_type_mismatch": "bytes whose format differs from the declared media type",
    "image_too_large": "more encoded bytes than the limit",
    "image_too_many_pixels": "declared dimensions beyond the decoded-pixel limit",
    "image_too_many_images": "more images in one request than the limit",
    "image_dimensions": "zero, inconsistent or unsupported dimensions or aspect ratio",
    "image_truncated": "a file that ends before its image data does",
    "image_corrupt": "malformed structure or image data the decoder rejects",
    "image_animated": "an animated PNG or WebP",
    "image_jpeg_arithmetic": "an arithmetic-coded JPEG",
    "image_jpeg_lossless": "a lossless JPEG",
    "image_jpeg_unsupported": "a hierarchical, 12-bit or otherwise unsupported JPEG",
    "image_jpeg_scans": "a progressive JPEG with more scans than the limit",
    "image_exif": "EXIF metadata whose orientation cannot be read or is out of range",
    "image_placeholders": "prompt image placeholders that do not match the images",
}


class ImageError(FrontendError):
    """An image the frontend cannot accept. ``code`` is one of IMAGE_ERROR_CODES."""

    status = 400
    code = "image_corrupt"

    def __init__(self, code: str, message: str, *, param: str | None = None):
        if code not in IMAGE_ERROR_CODES:
            raise ValueError(f"unknown image error code {code!r}")
        super().__init__(message, code=code, param=param)
