"""Generate tests/frontend/qwen3vl_images.json: Qwen3-VL image references.

Runs in its own venv with the reference stack (not the project's):

    python3 -m venv /work/venv-imgref && . /work/venv-imgref/bin/activate
    pip install torch==2.14.1 torchvision==0.29.1 transformers pillow numpy simplejpeg
    python tools/generate_image_fixtures.py            # writes the fixture + inputs

What it pins (every figure is a SHA-256, compared with no tolerance):

- inputs: deterministic scenes encoded with Pillow (PNG colour modes, 16-bit
  PNGs written by hand, JPEG baseline/progressive/CMYK/grey and all eight EXIF
  orientations, WebP lossy and lossless) into tests/frontend/image_inputs/;
- decoded RGB: how a user would feed transformers (Pillow, EXIF transposed,
  ``convert("RGB")``), cross-checked against simplejpeg's accurate IDCT and
  fancy upsampling for every JPEG; the two places the native decoder defines
  its own rule (16-bit grey keeps the high byte, CMYK uses Pillow's formula)
  are decoded that way here too, and each input says how it was decoded;
- per pipeline: every resized RGB byte, pixel_values, image_grid_thw (from the
  transformers Qwen2VLImageProcessor, torchvision backend, built from the
  Qwen3-VL preprocessor settings without a hub), vision position ids and
  bilinear interpolation taps/weights (transformers.vision_utils, the helpers
  Qwen3VLVisionModel.forward calls), cumulative patch offsets, and the prompt
  through Qwen3VLProcessor + Qwen3VLModel.get_rope_index;
- geometry cases through transformers' smart_resize, and direct resize cases
  through the backend's torchvision resize.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import platform
import struct
import sys
import types
import zlib
from pathlib import Path

import numpy as np
import PIL
import simplejpeg
import torch
import torchvision
import transformers
from PIL import Image, ImageOps
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.image_utils import SizeDict
from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
    Qwen2VLImageProcessor,
    smart_resize,
)
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLConfig
from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
from transformers.vision_utils import (
    get_vision_cu_seqlens,
    get_vision_interpolation_indices_and_weights,
    get_vision_position_ids,
)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "frontend" / "qwen3vl_images.json"
INPUT_DIR = ROOT / "tests" / "frontend" / "image_inputs"

# Qwen3-VL preprocessor_config.json values.
SETTINGS = {
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
}
NUM_GRID_PER_SIDE = 48  # sqrt(num_position_embeddings = 2304)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
IMAGE_BLOCK = "<|vision_start|><|image_pad|><|vision_end|>"


def sha(array_or_bytes) -> str:
    if isinstance(array_or_bytes, (bytes, bytearray)):
        return hashlib.sha256(array_or_bytes).hexdigest()
    array = np.ascontiguousarray(array_or_bytes)
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return hashlib.sha256(little.tobytes()).hexdigest()


def tensor_record(array: np.ndarray) -> dict:
    array = np.ascontiguousarray(array)
    return {"shape": list(array.shape), "dtype": str(array.dtype), "sha256": sha(array)}


# -- deterministic inputs ------------------------------------------------------

def pattern(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    """Hash noise, uint8 [h, w, c]; the project's tests compute the same formula."""
    y = np.arange(height, dtype=np.uint32)[:, None, None]
    x = np.arange(width, dtype=np.uint32)[None, :, None]
    c = np.arange(channels, dtype=np.uint32)[None, None, :]
    v = (x * np.uint32(73856093)) ^ (y * np.uint32(19349663)) ^ ((c + np.uint32(seed)) * np.uint32(83492791))
    v = (v ^ (v >> np.uint32(13))) * np.uint32(1274126177)
    return ((v >> np.uint32(16)) & np.uint32(255)).astype(np.uint8)


def scene(height: int, width: int, seed: int) -> np.ndarray:
    """A photo-like RGB scene: gradients, a disc, a bar and mild texture."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r = 40 + 180 * x / max(width - 1, 1)
    g = 30 + 200 * y / max(height - 1, 1)
    b = 128 + 100 * np.sin((x + 2 * y + seed * 17) / 23.0)
    disc = (x - width * 0.6) ** 2 + (y - height * 0.4) ** 2 < (min(height, width) * 0.25) ** 2
    r = np.where(disc, 230 - 0.2 * y, r)
    g = np.where(disc, 60 + 0.1 * x, g)
    bar = (np.abs(x - y * width / max(height, 1) * 0.5 - width * 0.1) < max(width // 20, 1))
    b = np.where(bar, 20, b)
    rgb = np.stack([r, g, b], axis=-1)
    noise = pattern(height, width, 3, seed).astype(np.float64) / 255.0 * 6 - 3
    return np.clip(np.rint(rgb + noise), 0, 255).astype(np.uint8)


def png_chunk(ctype: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", zlib.crc32(ctype + body))


def png_16bit(samples: np.ndarray, color_type: int, exif: bytes | None = None) -> bytes:
    """A 16-bit PNG written by hand (Pillow cannot save 16-bit RGB)."""
    height, width = samples.shape[:2]
    rows = samples.astype(">u2").reshape(height, -1).tobytes()
    stride = len(rows) // height
    raw = b"".join(b"\x00" + rows[i * stride:(i + 1) * stride] for i in range(height))
    out = b"\x89PNG\r\n\x1a\n"
    out += png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 16, color_type, 0, 0, 0))
    if exif is not None:
        out += png_chunk(b"eXIf", exif)
    out += png_chunk(b"IDAT", zlib.compress(raw, 9))
    return out + png_chunk(b"IEND", b"")


def exif_orientation(value: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = value
    return exif.tobytes()


def encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def build_inputs() -> dict[str, tuple[str, bytes]]:
    """name -> (media type, encoded bytes)."""
    inputs = {}
    rgb = Image.fromarray(scene(333, 517, 1))
    inputs["png_rgb"] = ("image/png", encode(rgb, "PNG"))
    rgba = np.dstack([scene(301, 257, 2), pattern(301, 257, 1, 9)[..., 0]])
    inputs["png_rgba"] = ("image/png", encode(Image.fromarray(rgba, "RGBA"), "PNG"))
    inputs["png_gray"] = ("image/png", encode(Image.fromarray(scene(250, 380, 3)).convert("L"), "PNG"))
    la = np.dstack([np.asarray(Image.fromarray(scene(210, 300, 4)).convert("L")),
                    pattern(210, 300, 1, 5)[..., 0]])
    inputs["png_gray_alpha"] = ("image/png", encode(Image.fromarray(la, "LA"), "PNG"))
    palette = Image.fromarray(scene(280, 350, 6)).quantize(colors=64, method=Image.Quantize.MEDIANCUT,
                                                         dither=Image.Dither.NONE)
    inputs["png_palette"] = ("image/png", encode(palette, "PNG", transparency=3))
    wide16 = scene(150, 200, 7).astype(np.uint16) * 256 + pattern(150, 200, 3, 8).astype(np.uint16)
    inputs["png_rgb16"] = ("image/png", png_16bit(wide16, 2))
    gray16 = scene(230, 170, 9)[..., 1].astype(np.uint16) * 256 + pattern(230, 170, 1, 10)[..., 0]
    inputs["png_gray16"] = ("image/png", png_16bit(gray16[..., None], 0))
    inputs["png_exif6"] = ("image/png", encode(Image.fromarray(scene(200, 310, 11)), "PNG",
                                               exif=exif_orientation(6)))
    inputs["png_tiny"] = ("image/png", encode(Image.fromarray(scene(7, 5, 12)), "PNG"))
    inputs["png_wide"] = ("image/png", encode(Image.fromarray(scene(20, 2000, 13)), "PNG"))
    inputs["png_half_even"] = ("image/png", encode(Image.fromarray(scene(272, 400, 14)), "PNG"))
    inputs["png_height_only"] = ("image/png", encode(Image.fromarray(scene(300, 512, 15)), "PNG"))
    inputs["png_width_only"] = ("image/png", encode(Image.fromarray(scene(512, 300, 16)), "PNG"))
    photo = Image.fromarray(scene(480, 640, 20))
    inputs["jpeg_420"] = ("image/jpeg", encode(photo, "JPEG", quality=90, subsampling=2))
    inputs["jpeg_444"] = ("image/jpeg", encode(Image.fromarray(scene(345, 271, 21)), "JPEG",
                                               quality=95, subsampling=0))
    inputs["jpeg_progressive"] = ("image/jpeg", encode(Image.fromarray(scene(400, 300, 22)), "JPEG",
                                                       quality=85, progressive=True))
    inputs["jpeg_cmyk"] = ("image/jpeg", encode(Image.fromarray(scene(256, 320, 23)).convert("CMYK"),
                                                "JPEG", quality=90))
    inputs["jpeg_gray"] = ("image/jpeg", encode(Image.fromarray(scene(300, 300, 24)).convert("L"),
                                                "JPEG", quality=90))
    oriented = Image.fromarray(scene(240, 320, 25))
    for value in range(1, 9):
        inputs[f"jpeg_orientation_{value}"] = ("image/jpeg", encode(
            oriented, "JPEG", quality=90, exif=exif_orientation(value)))
    inputs["webp_lossy"] = ("image/webp", encode(Image.fromarray(scene(300, 400, 26)), "WEBP",
                                                 quality=80))
    alpha = np.dstack([scene(260, 260, 27), pattern(260, 260, 1, 28)[..., 0]])
    inputs["webp_lossless_alpha"] = ("image/webp", encode(Image.fromarray(alpha, "RGBA"), "WEBP",
                                                          lossless=True))
    return inputs


# -- reference decode ----------------------------------------------------------

def reference_decode(media_type: str, data: bytes) -> tuple[np.ndarray, str]:
    """RGB [h, w, 3] as a user would feed transformers, and how it was obtained."""
    with Image.open(io.BytesIO(data)) as opened:
        image = ImageOps.exif_transpose(opened)
        if image.mode in ("I;16", "I;16B", "I;16L", "I"):
            gray = (np.asarray(image).astype(np.uint32) >> 8).astype(np.uint8)
            return np.repeat(gray[..., None], 3, axis=2), (
                "Pillow, 16-bit grey: high byte of each sample replicated to RGB "
                "(Pillow's own I;16->RGB clips at 255 instead)")
        rgb = np.asarray(image.convert("RGB"))
        how = f"Pillow {opened.mode} -> exif_transpose -> convert('RGB') (alpha dropped)"
        if media_type == "image/jpeg" and opened.mode != "CMYK":
            native = Image.fromarray(simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=False,
                                                            fastupsample=False))
            if "exif" in opened.info:
                native.info["exif"] = opened.info["exif"]
            if not np.array_equal(np.asarray(ImageOps.exif_transpose(native)), rgb):
                raise SystemExit("Pillow and simplejpeg (accurate IDCT, fancy upsampling) disagree")
            how += "; equals simplejpeg accurate IDCT + fancy upsampling"
        if media_type == "image/jpeg" and opened.mode == "CMYK":
            how += " (Pillow's CMYK->RGB with Adobe polarity)"
        return rgb, how


# -- reference pipelines ------------------------------------------------------

def build_tokenizer() -> Tokenizer:
    corpus = [
        "Describe this image in detail.", "What is shown in the picture?",
        "Compare the two images and list the differences.", "The capital of France is Paris.",
        "A photo of a red disc on a gradient background with a dark diagonal bar.",
        "user assistant system You are a helpful assistant.",
    ] * 20
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def chat_text(num_images: int, question: str) -> str:
    return ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
            + IMAGE_BLOCK * num_images + question + "<|im_end|>\n<|im_start|>assistant\n")


def chw(rgb: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1).contiguous()


def run_pipeline(processor: Qwen3VLProcessor, images: list[np.ndarray], question: str) -> dict:
    image_processor = processor.image_processor
    tensors = [chw(image) for image in images]
    resized = []
    for tensor in tensors:
        out = image_processor.resize(images=tensor[None], size=SizeDict(**SETTINGS["size"]),
                                     resample=image_processor.resample,
                                     factor=SETTINGS["patch_size"] * SETTINGS["merge_size"])
        resized.append(out[0].permute(1, 2, 0).contiguous().numpy())
    direct = image_processor(images=tensors, return_tensors="pt")
    text = chat_text(len(images), question)
    batch = processor(text=[text], images=tensors, return_tensors="pt")
    if not torch.equal(batch["pixel_values"], direct["pixel_values"]):
        raise SystemExit("Qwen3VLProcessor and the image processor disagree on pixel_values")
    grid_thw = batch["image_grid_thw"]
    positions = get_vision_position_ids(grid_thw, SETTINGS["merge_size"])
    indices, weights = get_vision_interpolation_indices_and_weights(
        grid_thw, num_grid_per_side=NUM_GRID_PER_SIDE, mode="bilinear", align_corners=True,
        spatial_merge_size=SETTINGS["merge_size"])
    offsets = get_vision_cu_seqlens(grid_thw)
    rope_owner = types.SimpleNamespace(
        config=Qwen3VLConfig(),
        get_vision_position_ids=lambda *a, **k: Qwen3VLModel.get_vision_position_ids(None, *a, **k))
    vision_rows, delta = Qwen3VLModel.get_rope_index(
        rope_owner, batch["input_ids"], mm_token_type_ids=batch["mm_token_type_ids"],
        image_grid_thw=grid_thw)
    input_ids = batch["input_ids"][0]
    text_row = torch.arange(input_ids.shape[0], dtype=torch.long)[None]
    position_rows = torch.cat([text_row, vision_rows[:, 0]], dim=0)
    return {
        "resized": [tensor_record(r) for r in resized],
        "tensors": {
            "pixel_values": tensor_record(batch["pixel_values"].numpy()),
            "image_grid_thw": tensor_record(grid_thw.numpy().astype(np.int64)),
            "vision_positions": tensor_record(positions.numpy().astype(np.int64)),
            "interp_indices": tensor_record(indices.numpy().astype(np.int64)),
            "interp_weights": tensor_record(weights.numpy().astype(np.float32)),
            "patch_offsets": tensor_record(offsets.numpy().astype(np.int32)),
        },
        "prompt": {
            "text": text,
            # int32 token/modality ids as the native API returns them (values unchanged).
            "token_ids": tensor_record(input_ids.numpy().astype(np.int32)),
            "modality_ids": tensor_record(batch["mm_token_type_ids"][0].numpy().astype(np.int32)),
            "positions": tensor_record(position_rows.numpy().astype(np.int64)),
            "mrope_delta": int(delta.reshape(-1)[0]),
        },
    }


PIPELINES = [
    ("png_rgb", ["png_rgb"]), ("png_rgba", ["png_rgba"]), ("png_gray", ["png_gray"]),
    ("png_gray_alpha", ["png_gray_alpha"]), ("png_palette", ["png_palette"]),
    ("png_rgb16", ["png_rgb16"]), ("png_gray16", ["png_gray16"]), ("png_exif6", ["png_exif6"]),
    ("png_tiny", ["png_tiny"]), ("png_wide", ["png_wide"]), ("half_even", ["png_half_even"]),
    ("height_only_resize", ["png_height_only"]), ("width_only_resize", ["png_width_only"]),
    ("jpeg_420", ["jpeg_420"]), ("jpeg_444", ["jpeg_444"]),
    ("jpeg_progressive", ["jpeg_progressive"]), ("jpeg_cmyk", ["jpeg_cmyk"]),
    ("jpeg_gray", ["jpeg_gray"]),
    *[(f"jpeg_orientation_{v}", [f"jpeg_orientation_{v}"]) for v in range(1, 9)],
    ("webp_lossy", ["webp_lossy"]), ("webp_lossless_alpha", ["webp_lossless_alpha"]),
    ("batch_mixed", ["png_rgb", "jpeg_420", "webp_lossy", "png_gray", "jpeg_orientation_6"]),
    ("batch_repeated", ["jpeg_444", "jpeg_444", "jpeg_444"]),
]

GEOMETRY = [
    ("tokens_16384_exact", 4096, 4096), ("tokens_16384_half_even", 4112, 4112),
    ("tokens_16384_over", 4128, 4096), ("half_even_down", 272, 400), ("half_even_up", 304, 400),
    ("width_unchanged", 300, 512), ("height_unchanged", 512, 300), ("large", 6000, 4000),
    ("below_min_pixels", 100, 150), ("tiny", 1, 1), ("aspect_200", 10, 2000),
    ("aspect_over_200", 10, 2011),
]

RESIZE = [  # (name, height, width, out_height, out_width, seed)
    ("down_4x", 1200, 1600, 300, 400, 1), ("down_wide_taps", 900, 700, 96, 64, 2),
    ("up_8x", 40, 30, 320, 256, 3), ("mixed_axes", 333, 517, 640, 160, 4),
    ("near_identity", 1000, 999, 992, 1024, 5), ("single_column", 64, 1, 32, 3, 6),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=FIXTURE)
    parser.add_argument("--input-dir", type=Path, default=INPUT_DIR)
    args = parser.parse_args()
    torch.set_num_threads(1)

    args.input_dir.mkdir(parents=True, exist_ok=True)
    extension = {"image/png": "png", "image/jpeg": "jpg", "image/webp": "webp"}
    inputs, decoded = {}, {}
    for name, (media_type, data) in build_inputs().items():
        path = args.input_dir / f"{name}.{extension[media_type]}"
        path.write_bytes(data)
        rgb, how = reference_decode(media_type, data)
        decoded[name] = rgb
        inputs[name] = {"file": str(path.relative_to(args.output.parent)), "media_type": media_type,
                        "sha256": sha(data), "decode": how, "decoded": tensor_record(rgb)}

    tokenizer = build_tokenizer()
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    image_processor = Qwen2VLImageProcessor(**SETTINGS)
    # The video processor is unused (images only) but the processor requires one.
    processor = Qwen3VLProcessor(image_processor=image_processor, tokenizer=hf_tokenizer,
                                 video_processor=Qwen3VLVideoProcessor())

    pipelines = []
    for name, members in PIPELINES:
        question = "Compare these images." if len(members) > 1 else "Describe this image."
        record = run_pipeline(processor, [decoded[m] for m in members], question)
        pipelines.append({"name": name, "images": members, **record})
        print(f"{name}: {[r['shape'] for r in record['resized']]}", file=sys.stderr)

    geometry = []
    for name, height, width in GEOMETRY:
        case = {"name": name, "height": height, "width": width}
        try:
            resized = smart_resize(height, width, factor=32, min_pixels=SETTINGS["size"]["shortest_edge"],
                                   max_pixels=SETTINGS["size"]["longest_edge"])
            case["resized"] = list(resized)
            case["num_tokens"] = (resized[0] // 32) * (resized[1] // 32)
        except ValueError as exc:
            case["error"] = str(exc)
        geometry.append(case)

    resize_cases = []
    for name, height, width, out_h, out_w, seed in RESIZE:
        source = pattern(height, width, 3, seed)
        # The torchvision backend's resize call (tvF.resize on a uint8 NCHW tensor).
        out = torchvision.transforms.v2.functional.resize(
            chw(source)[None], [out_h, out_w],
            interpolation=torchvision.transforms.v2.InterpolationMode.BICUBIC, antialias=True)
        resize_cases.append({"name": name, "height": height, "width": width, "out_height": out_h,
                             "out_width": out_w, "seed": seed, "input_sha256": sha(source),
                             "output": tensor_record(out[0].permute(1, 2, 0).contiguous().numpy())})

    fixture = {
        "format": 1,
        "generated_by": "tools/generate_image_fixtures.py",
        "versions": {
            "python": platform.python_version(), "transformers": transformers.__version__,
            "torch": torch.__version__, "torchvision": torchvision.__version__,
            "pillow": PIL.__version__, "numpy": np.__version__, "simplejpeg": simplejpeg.__version__,
            "tokenizers": __import__("tokenizers").__version__,
        },
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "processor": {
            "class": "transformers.models.qwen2_vl.Qwen2VLImageProcessor (torchvision backend) "
                     "inside Qwen3VLProcessor", "settings": SETTINGS,
            "num_grid_per_side": NUM_GRID_PER_SIDE,
            "positions": "transformers.vision_utils.get_vision_position_ids / "
                         "get_vision_interpolation_indices_and_weights(mode='bilinear', "
                         "align_corners=True) / get_vision_cu_seqlens, as Qwen3VLVisionModel.forward "
                         "calls them; prompt rows from Qwen3VLModel.get_rope_index plus the text row "
                         "generation prepends",
        },
        "tensor_hashing": "SHA-256 of the C-order little-endian bytes in the recorded dtype",
        "tokenizer": tokenizer.to_str(),
        "inputs": inputs,
        "pipelines": pipelines,
        "geometry": geometry,
        "resize": resize_cases,
    }
    args.output.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {args.output} ({len(pipelines)} pipelines, {len(geometry)} geometry cases, "
          f"{len(resize_cases)} resize cases)", file=sys.stderr)


if __name__ == "__main__":
    main()
