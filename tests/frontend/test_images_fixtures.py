"""Differential tests against tests/frontend/qwen3vl_images.json (no tolerance).

The fixture is produced by tools/generate_image_fixtures.py in a separate venv
with transformers' Qwen2VLImageProcessor (torchvision backend), the Qwen3-VL
processor and position helpers. Here the native pipeline recomputes every
decoded and resized RGB byte and every tensor and compares SHA-256 digests.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from flare._fast.image_resize import ISAS, resize_bicubic_aa
from flare.frontend.images import EncodedImage, ImageError, ImageProcessor, smart_resize

HERE = Path(__file__).parent
FIXTURE = json.loads((HERE / "qwen3vl_images.json").read_text())
PROCESSOR = ImageProcessor()


def digest(array: np.ndarray) -> str:
    array = np.ascontiguousarray(array)
    return hashlib.sha256(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()).hexdigest()


def assert_matches(array: np.ndarray, record: dict, what: str) -> None:
    assert list(array.shape) == record["shape"], f"{what}: shape {array.shape} != {record['shape']}"
    assert str(array.dtype) == record["dtype"], f"{what}: dtype {array.dtype} != {record['dtype']}"
    assert digest(array) == record["sha256"], f"{what}: bytes differ from the reference"


def load_input(name: str) -> EncodedImage:
    record = FIXTURE["inputs"][name]
    data = (HERE / record["file"]).read_bytes()
    assert hashlib.sha256(data).hexdigest() == record["sha256"], f"{record['file']} changed"
    return EncodedImage(record["media_type"], data)


def pattern(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    """The generator's hash-noise formula (tools/generate_image_fixtures.py)."""
    y = np.arange(height, dtype=np.uint32)[:, None, None]
    x = np.arange(width, dtype=np.uint32)[None, :, None]
    c = np.arange(channels, dtype=np.uint32)[None, None, :]
    v = (x * np.uint32(73856093)) ^ (y * np.uint32(19349663)) ^ ((c + np.uint32(seed)) * np.uint32(83492791))
    v = (v ^ (v >> np.uint32(13))) * np.uint32(1274126177)
    return ((v >> np.uint32(16)) & np.uint32(255)).astype(np.uint8)


def test_fixture_coverage():
    names = {p["name"] for p in FIXTURE["pipelines"]}
    assert len(names) >= 19
    assert {"png_rgb", "png_rgba", "png_gray", "png_gray_alpha", "png_palette", "png_rgb16",
            "png_gray16", "jpeg_progressive", "jpeg_cmyk", "batch_mixed", "batch_repeated",
            "half_even", "height_only_resize", "width_only_resize"} <= names
    assert {f"jpeg_orientation_{v}" for v in range(1, 9)} <= names
    assert len(FIXTURE["geometry"]) >= 6
    assert {"tokens_16384_exact", "tokens_16384_over", "half_even_down", "width_unchanged"} <= {
        g["name"] for g in FIXTURE["geometry"]}


@pytest.mark.parametrize("name", sorted(FIXTURE["inputs"]))
def test_decoded_rgb_matches_reference(name):
    image = PROCESSOR.decode(load_input(name))
    assert_matches(image.pixels, FIXTURE["inputs"][name]["decoded"], f"{name} decoded RGB")


@pytest.mark.parametrize("pipeline", FIXTURE["pipelines"], ids=lambda p: p["name"])
def test_pipeline_matches_reference(pipeline):
    images = [PROCESSOR.decode(load_input(name)) for name in pipeline["images"]]
    for index, (image, record) in enumerate(zip(images, pipeline["resized"])):
        assert_matches(PROCESSOR.resize(image), record, f"image {index} resized RGB")
    processed = PROCESSOR.process(images)
    for field, record in pipeline["tensors"].items():
        assert_matches(getattr(processed, field), record, field)
    tokenizer = Tokenizer.from_str(FIXTURE["tokenizer"])
    prompt = PROCESSOR.expand_prompt(pipeline["prompt"]["text"],
                                     [PROCESSOR.geometry(image) for image in images], tokenizer)
    assert_matches(prompt.token_ids, pipeline["prompt"]["token_ids"], "token ids")
    assert_matches(prompt.modality_ids, pipeline["prompt"]["modality_ids"], "modality ids")
    assert_matches(prompt.positions, pipeline["prompt"]["positions"], "position rows")
    assert prompt.mrope_delta == pipeline["prompt"]["mrope_delta"]


@pytest.mark.parametrize("case", FIXTURE["geometry"], ids=lambda g: g["name"])
def test_geometry_matches_reference(case):
    profile = PROCESSOR.profile
    if "error" in case:
        with pytest.raises(ImageError) as info:
            smart_resize(case["height"], case["width"], profile.factor, profile.min_pixels,
                         profile.max_pixels)
        assert info.value.code == "image_dimensions"
        return
    geometry = PROCESSOR.geometry((case["height"], case["width"]))
    assert [geometry.resized_height, geometry.resized_width] == case["resized"]
    assert geometry.num_tokens == case["num_tokens"]


@pytest.mark.parametrize("case", FIXTURE["resize"], ids=lambda r: r["name"])
@pytest.mark.parametrize("isa", ISAS)
def test_resize_kernel_matches_torchvision(case, isa):
    source = pattern(case["height"], case["width"], 3, case["seed"])
    assert digest(source) == case["input_sha256"]
    out = resize_bicubic_aa(source, case["out_height"], case["out_width"], isa=isa)
    assert_matches(out, case["output"], "resized pattern")
