"""Benchmark: native image preparation vs the transformers Qwen3-VL processor.

Per workload, the time from encoded bytes to vision-tower inputs (decode +
process): ours (flare.frontend.images, this venv) next to transformers'
Qwen2VLImageProcessor with the torchvision backend fed by Pillow (the
reference venv of tools/generate_image_fixtures.py, run as a subprocess in
the same invocation). Both sides run single-threaded on identical bytes and
their pixel_values are checked to be byte-identical.

The two sides take turns: ``--rounds`` rounds, each timing every workload
``--repeats / --rounds`` times on one side and then the other (the order
alternates by round), so a burst of load from other processes on this shared
machine lands on both sides alike. Each figure is the best time over all
rounds; the per-round speedups show the spread.

    python tools/bench_images.py [--reference-python /work/venv-imgref/bin/python]

Workloads: a 1-megapixel JPEG photo, a 4-megapixel PNG, and a batch of 8
small images (JPEG and PNG). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_REFERENCE_PYTHON = "/work/venv-imgref/bin/python"
SETTINGS = {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "size": {"shortest_edge": 65536, "longest_edge": 16777216}}


def scene(height: int, width: int, seed: int) -> np.ndarray:
    """A photo-like scene: smooth gradients, a disc, an edge and mild texture."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 40 + 180 * x / max(width - 1, 1)
    g = 30 + 200 * y / max(height - 1, 1)
    b = 128 + 100 * np.sin((x + 2 * y + seed * 17) / 23.0)
    disc = (x - width * 0.6) ** 2 + (y - height * 0.4) ** 2 < (min(height, width) * 0.25) ** 2
    r = np.where(disc, 230 - 0.2 * y, r)
    g = np.where(disc, 60 + 0.1 * x, g)
    rng = np.random.default_rng(seed)
    noise = rng.normal(0.0, 4.0, (height, width, 3)).astype(np.float32)
    return np.clip(np.rint(np.stack([r, g, b], -1) + noise), 0, 255).astype(np.uint8)


def build_workloads(directory: Path) -> dict[str, list[str]]:
    from PIL import Image

    def save(name: str, pixels: np.ndarray, fmt: str, **params) -> str:
        path = directory / name
        Image.fromarray(pixels).save(path, fmt, **params)
        return path.name

    return {
        "jpeg_1mp": [save("photo_1mp.jpg", scene(1000, 1000, 1), "JPEG", quality=90)],
        "png_4mp": [save("photo_4mp.png", scene(1536, 2730, 2), "PNG")],
        "batch_8_small": [
            save(f"small_{i}.{'jpg' if i % 2 else 'png'}", scene(240 + 16 * i, 320 + 8 * i, 10 + i),
                 "JPEG" if i % 2 else "PNG", **({"quality": 90} if i % 2 else {}))
            for i in range(8)
        ],
    }


def media_type(name: str) -> str:
    return "image/jpeg" if name.endswith(".jpg") else "image/png"


def time_runs(fn, repeats: int) -> tuple[float, str]:
    """Best-of-N seconds of ``fn`` (which returns pixel_values) and its SHA-256.

    The minimum, not the median: the machine is shared, and the best run is
    the one least disturbed by other processes on both sides alike.
    """
    digest = hashlib.sha256(np.ascontiguousarray(fn()).tobytes()).hexdigest()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), digest


def time_workloads(preparers: dict, repeats: int) -> dict:
    return {name: time_runs(prepare, repeats) for name, prepare in preparers.items()}


def our_preparers(directory: Path, workloads: dict[str, list[str]]) -> dict:
    from flare.frontend.images import EncodedImage, ImageProcessor

    processor = ImageProcessor()
    preparers = {}
    for name, files in workloads.items():
        encoded = [EncodedImage(media_type(f), (directory / f).read_bytes()) for f in files]

        def prepare(encoded=encoded):
            images = [processor.decode(e) for e in encoded]
            return processor.process(images).pixel_values

        preparers[name] = prepare
    return preparers


def reference_preparers(directory: Path, workloads: dict[str, list[str]]) -> dict:
    import torch
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    torch.set_num_threads(1)
    processor = Qwen2VLImageProcessor(**SETTINGS)
    preparers = {}
    for name, files in workloads.items():
        blobs = [(directory / f).read_bytes() for f in files]

        def prepare(blobs=blobs):
            images = [Image.open(io.BytesIO(b)).convert("RGB") for b in blobs]
            return processor(images=images, return_tensors="pt")["pixel_values"].numpy()

        preparers[name] = prepare
    return preparers


def reference_worker(directory: Path) -> None:
    """Inside the reference venv: one line of JSON timings per ``<repeats>`` line on stdin."""
    workloads = json.loads((directory / "workloads.json").read_text())
    preparers = reference_preparers(directory, workloads)
    print("ready", flush=True)
    for line in sys.stdin:
        print("\n" + json.dumps(time_workloads(preparers, int(line))), flush=True)


def best_of_rounds(rounds: list[dict]) -> dict:
    """Per workload: (best seconds over the rounds, digest), all rounds' digests equal."""
    best = {}
    for name in rounds[0]:
        digests = {r[name][1] for r in rounds}
        best[name] = (min(r[name][0] for r in rounds), digests.pop() if len(digests) == 1 else "varies")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reference-python", default=DEFAULT_REFERENCE_PYTHON)
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per workload and side")
    parser.add_argument("--rounds", type=int, default=10, help="turns each side takes")
    parser.add_argument("--reference-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.reference_worker is not None:  # inside the reference venv
        reference_worker(args.reference_worker)
        return

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    per_round = max(1, args.repeats // args.rounds)
    ours_rounds, reference_rounds = [], []
    with tempfile.TemporaryDirectory(prefix="flare-bench-images-") as tmp:
        directory = Path(tmp)
        workloads = build_workloads(directory)
        (directory / "workloads.json").write_text(json.dumps(workloads))
        worker = subprocess.Popen(
            [args.reference_python, str(Path(__file__).resolve()), "--reference-worker", str(directory)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"})
        try:
            line = "start"
            while line and line.strip() != "ready":  # skip anything the imports print
                line = worker.stdout.readline()
            if not line:
                sys.exit("reference worker failed to start")
            ours = our_preparers(directory, workloads)

            def run_reference() -> None:
                worker.stdin.write(f"{per_round}\n")
                worker.stdin.flush()
                line = ""
                while not line.startswith("{"):  # the timings are the next JSON line
                    line = worker.stdout.readline()
                    if not line:
                        sys.exit("reference worker stopped")
                reference_rounds.append(json.loads(line))

            for index in range(args.rounds):
                if index % 2:
                    ours_rounds.append(time_workloads(ours, per_round))
                    run_reference()
                else:
                    run_reference()
                    ours_rounds.append(time_workloads(ours, per_round))
        finally:
            worker.stdin.close()
            worker.wait()
    ours, reference = best_of_rounds(ours_rounds), best_of_rounds(reference_rounds)

    print(f"{'workload':<16} {'images':>6} {'ours ms/img':>12} {'transformers ms/img':>20} "
          f"{'speedup':>8} {'per-round min..max':>19} {'same bytes':>10}")
    summary = {}
    for name, files in workloads.items():
        ours_s, ours_digest = ours[name]
        ref_s, ref_digest = reference[name]
        per_ours = ours_s / len(files) * 1e3
        per_ref = ref_s / len(files) * 1e3
        speedup = ref_s / ours_s
        round_speedups = sorted(r[name][0] / o[name][0] for r, o in zip(reference_rounds, ours_rounds))
        same = ours_digest == ref_digest != "varies"
        print(f"{name:<16} {len(files):>6} {per_ours:>12.2f} {per_ref:>20.2f} {speedup:>7.2f}x "
              f"{round_speedups[0]:>9.2f}..{round_speedups[-1]:.2f}x {'yes' if same else 'NO':>10}")
        summary[name] = {"ours_ms_per_image": round(per_ours, 3),
                         "transformers_ms_per_image": round(per_ref, 3),
                         "speedup": round(speedup, 3),
                         "round_speedups": [round(v, 3) for v in round_speedups],
                         "identical_pixel_values": same}
    result = {
        "benchmark": "images",
        "threads": 1,
        "rounds": args.rounds,
        "repeats_per_side": per_round * args.rounds,
        "workloads": summary,
        "speedup_vs_transformers_min": round(min(v["speedup"] for v in summary.values()), 3),
        "all_identical": all(v["identical_pixel_values"] for v in summary.values()),
    }
    print(json.dumps(result))
    if not result["all_identical"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
