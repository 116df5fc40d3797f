"""Kernel sets, the fused resize+pack driver and the output arena.

Every kernel set this CPU runs (flare._fast.image_resize.ISAS: scalar, and
AVX2 where present) must give the same bytes: on the torchvision fixtures'
pipelines (SHA-256 of pixel_values, no tolerance) and on random geometries
against an independent composition (resize, then a numpy patchify).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from flare._fast.image_patches import resize_pack
from flare._fast.image_positions import fill_positions
from flare._fast.image_resize import BEST_ISA, ISAS, kernel_isa, resize_bicubic_aa
from flare.frontend.images import EncodedImage, ImageProcessor
from flare.frontend.images.arena import ALIGNMENT, OutputArena

HERE = Path(__file__).parent
FIXTURE = json.loads((HERE / "qwen3vl_images.json").read_text())
PROCESSOR = ImageProcessor()
OFFSET, DIVISOR = PROCESSOR.profile.normalization()


def aligned(rows: int, row_len: int = 1536) -> np.ndarray:
    return OutputArena(0).rows(rows, row_len)


def patchify(resized: np.ndarray, patch: int = 16, merge: int = 2, temporal: int = 2) -> np.ndarray:
    """transformers' layout, spelled out with reshapes and a table lookup."""
    table = ((np.arange(256, dtype=np.float32)[None, :] - OFFSET[:, None]) / DIVISOR[:, None])
    height, width, channels = resized.shape
    grid_h, grid_w = height // patch, width // patch
    values = table[np.arange(channels)[None, None, :], resized]
    values = values.reshape(grid_h // merge, merge, patch, grid_w // merge, merge, patch, channels)
    values = values.transpose(0, 3, 1, 4, 6, 2, 5)  # block row, block col, iy, ix, c, py, px
    shape = values.shape[:5] + (temporal,) + values.shape[5:]
    return np.ascontiguousarray(np.broadcast_to(values[:, :, :, :, :, None], shape)).reshape(
        grid_h * grid_w, -1)


def test_isas_and_selection():
    assert ISAS[0] == "scalar" and BEST_ISA == ISAS[-1]
    assert kernel_isa("auto") == kernel_isa(BEST_ISA)
    with pytest.raises(ValueError):
        kernel_isa("neon")
    if "avx2" not in ISAS:
        with pytest.raises(ValueError):
            kernel_isa("avx2")


@pytest.mark.parametrize("pipeline", FIXTURE["pipelines"], ids=lambda p: p["name"])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("stream", [False, True], ids=["stores", "streaming"])
def test_kernel_sets_reproduce_fixture_pixel_values(pipeline, isa, stream):
    images = []
    for name in pipeline["images"]:
        record = FIXTURE["inputs"][name]
        images.append(PROCESSOR.decode(EncodedImage(record["media_type"],
                                                    (HERE / record["file"]).read_bytes())))
    geometries = [PROCESSOR.geometry(image) for image in images]
    out = aligned(sum(g.num_patches for g in geometries))
    start = 0
    for image, g in zip(images, geometries):
        resize_pack(image.pixels, g.resized_height, g.resized_width, 16, 2, 2, OFFSET, DIVISOR,
                    out[start:start + g.num_patches], isa=isa, stream=stream)
        start += g.num_patches
    expected = pipeline["tensors"]["pixel_values"]["sha256"]
    assert hashlib.sha256(out.tobytes()).hexdigest() == expected


@pytest.mark.parametrize("isa", ISAS)
def test_resize_pack_equals_resize_then_patchify(isa):
    rng = np.random.default_rng(5)
    cases = [(1000, 1000, 992, 992), (240, 320, 256, 320), (50, 70, 256, 320), (64, 64, 64, 64),
             (33, 900, 32, 864), (700, 40, 672, 32), (500, 500, 96, 96), (31, 31, 64, 96),
             (2000, 77, 128, 32)]
    cases += [(int(h), int(w), int(oh) * 32, int(ow) * 32)
              for h, w, oh, ow in zip(rng.integers(5, 300, 12), rng.integers(5, 300, 12),
                                      rng.integers(1, 9, 12), rng.integers(1, 9, 12))]
    for height, width, out_h, out_w in cases:
        source = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        expected = patchify(resize_bicubic_aa(source, out_h, out_w, isa="scalar"))
        for stream in (False, True):
            out = aligned(expected.shape[0])
            resize_pack(source, out_h, out_w, 16, 2, 2, OFFSET, DIVISOR, out, isa=isa, stream=stream)
            assert np.array_equal(out.view(np.uint32), expected.view(np.uint32)), (
                height, width, out_h, out_w, stream)


def test_resize_kernel_sets_agree_on_random_shapes():
    rng = np.random.default_rng(9)
    for trial in range(300):
        height, width = (int(v) for v in rng.integers(1, 60, 2))
        out_h, out_w = (int(v) for v in rng.integers(1, 120, 2))
        if trial % 4 == 0:  # strong width reductions: long windows
            out_w = int(rng.integers(1, 30))
            width = out_w * int(rng.integers(2, 7)) + int(rng.integers(0, 5))
        if trial % 5 == 0:
            out_h = height  # width only
        channels = 3 if trial % 3 else int(rng.integers(1, 5))
        source = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
        results = [resize_bicubic_aa(source, out_h, out_w, isa=isa) for isa in ISAS]
        assert all(np.array_equal(results[0], r) for r in results[1:]), (height, width, out_h, out_w)


def test_resize_pack_rejects_bad_arguments():
    image = np.zeros((40, 40, 3), np.uint8)
    out = aligned(4)
    with pytest.raises(ValueError, match="multiple"):
        resize_pack(image, 48, 32, 16, 2, 2, OFFSET, DIVISOR, out)
    with pytest.raises(ValueError, match="out must be"):
        resize_pack(image, 64, 32, 16, 2, 2, OFFSET, DIVISOR, out)
    with pytest.raises(ValueError, match="offset and divisor"):
        resize_pack(image, 32, 32, 16, 2, 2, OFFSET[:2], DIVISOR[:2], out)
    with pytest.raises(ValueError):
        resize_pack(image, 32, 32, 16, 2, 2, OFFSET, DIVISOR, out, isa="sse9")


def test_fill_positions_rejects_bad_shapes():
    positions = np.empty((4, 2), np.int64)
    indices = np.empty((4, 4), np.int64)
    weights = np.empty((4, 4), np.float32)
    fill_positions(2, 2, 2, 48, positions, indices, weights)
    assert positions.tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    with pytest.raises(ValueError):
        fill_positions(3, 2, 2, 48, positions, indices, weights)
    with pytest.raises(ValueError):
        fill_positions(2, 4, 2, 48, positions, indices, weights)


def test_arena_reuses_a_block_only_once_nothing_refers_to_it():
    arena = OutputArena(1 << 20)
    first = arena.rows(10, 1536)
    assert first.ctypes.data % ALIGNMENT == 0 and first.shape == (10, 1536)
    second = arena.rows(10, 1536)  # `first` is alive: a new block
    assert not np.shares_memory(first, second)
    row = second[3]  # a derived view keeps its block busy
    del second
    third = arena.rows(10, 1536)
    assert not np.shares_memory(row, third)
    view = memoryview(third)  # so does an exported buffer
    del third
    fourth = arena.rows(10, 1536)
    assert not np.shares_memory(np.asarray(view), fourth)
    address = fourth.ctypes.data
    del fourth, view, row, first
    assert arena.rows(10, 1536).ctypes.data == address  # nothing refers to it: reused
    assert arena.retained_bytes > 0


def test_arena_never_hands_out_a_block_in_use():
    arena = OutputArena(1 << 24)
    live = [arena.rows(4, 64) for _ in range(5)]
    for index, block in enumerate(live):
        block[...] = index
    for _ in range(5):
        arena.rows(4, 64)[...] = -1  # fresh or recycled, never one of `live`
    assert all((block == index).all() for index, block in enumerate(live))


def test_arena_size_limit():
    arena = OutputArena(0)
    block = arena.rows(16, 1536)
    assert arena.retained_bytes == 0 and block.shape == (16, 1536)
    with pytest.raises(ValueError):
        OutputArena(-1)


def test_processor_results_survive_later_batches():
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)
    from flare.frontend.images import RgbImage
    first = PROCESSOR.process([RgbImage(pixels, "rgb")])
    copy = first.pixel_values.copy()
    for _ in range(3):
        PROCESSOR.process([RgbImage(pixels[::-1].copy(), "rgb")])
    assert np.array_equal(first.pixel_values, copy)
