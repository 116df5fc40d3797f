"""Native image preparation: data URLs -> RgbImage -> vision-tower inputs.

See flare/frontend/images/processor.py for the pipeline and the spec's
"Native image preparation" section for the contract.
"""

from .decode import decode_image
from .errors import IMAGE_ERROR_CODES, ImageError
from .geometry import ImageGeometry, image_geometry, smart_resize
from .headers import ImageHeader, probe_header
from .identity import semantic_identity, source_key
from .limits import ImageLimits
from .processor import ExpandedPrompt, ImageProcessor, ProcessedImages
from .profile import QWEN3_VL, QwenImageProfile
from .rgb_image import RgbImage
from .source import EncodedImage, parse_data_url

__all__ = [
    "EncodedImage", "ExpandedPrompt", "IMAGE_ERROR_CODES", "ImageError", "ImageGeometry",
    "ImageHeader", "ImageLimits", "ImageProcessor", "ProcessedImages", "QWEN3_VL",
    "QwenImageProfile", "RgbImage", "decode_image", "image_geometry", "parse_data_url",
    "probe_header", "semantic_identity", "smart_resize", "source_key",
]
