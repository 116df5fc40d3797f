#!/usr/bin/env python3
"""Prepare what a device call carries: the wheels the GPU machine lacks, the Llama 3 tokenizer, a baseline tree.

    python tools/prepare_device.py [--server] [--baseline REV]

The GPU machine cannot reach a registry and starts bare for every session, so each session
prepares these here (the device tool's README, "Notes") and names `.whl` and `.carry` in
the call's carry:

  .whl/                          cp312 wheels of the runtime dependencies its image lacks
  .whl/server/                   with --server: the HTTP clients tests/server imports and what
                                 they need there (tools/gpu_check.sh --server-tests)
  .carry/llama3-tokenizer.json   the test fixture's tokenizer (tools/bench_gpu.py --tokenizer)
  .carry/base/                   with --baseline REV: that commit's sources, benchmarked beside
                                 the working tree by tools/gpu_ab.sh

Wheels are pinned to the versions installed here, the ones the test suite ran against.
Both folders are in .gitignore. A call carries at most 64 MiB with the tracked tree; the
script prints the total and fails past it.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Runtime dependencies (pyproject.toml [project].dependencies) the device image already holds
# (the device tool's KINDS.md, "Python packages already there"): nothing to carry for these.
# cuda-python is a meta-package there as cuda-bindings, which is what flare imports.
ON_DEVICE = frozenset({"numpy", "torch", "cuda-python", "uvloop", "tokenizers", "pillow", "prometheus-client",
                       "safetensors", "rich"})
# Other packages of that image the carried wheels need (the same list).
IMAGE = ON_DEVICE | {"pyyaml", "requests", "tqdm", "idna", "certifi", "attrs"}
# The rest of the runtime dependencies, carried as wheels.
CARRIED = ("httptools", "simplejpeg", "gguf", "llguidance")
# tools/gpu_check.sh --server-tests: the clients tests/server imports (openai, anthropic, ollama,
# jsonschema) and what they need beyond IMAGE. anyio, httpx, httpcore and typing-extensions are
# on the image too, but carried at the versions the tests ran against here.
SERVER = ("openai", "anthropic", "ollama", "jsonschema", "httpx2", "httpcore2", "httpx", "httpcore", "h11",
          "truststore", "anyio", "sniffio", "jiter", "pydantic", "pydantic-core", "typing-inspection",
          "annotated-types", "typing-extensions", "docstring-parser", "opentelemetry-api",
          "jsonschema-specifications", "referencing", "rpds-py")
# The baseline tree: what building and benchmarking a commit needs, not its tests or docs.
BASELINE_PATHS = ("flare", "tools", "setup.py", "pyproject.toml")
# pip matches a manylinux tag exactly, so every glibc up to the device's (Ubuntu 24.04: 2.39) is
# named; llguidance 1.9 ships manylinux_2_31 only.
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in range(39, 16, -1)) + ("manylinux2014_x86_64",
                                                                          "manylinux1_x86_64")
CARRY_LIMIT = 64 << 20


def pinned(name: str) -> str:
    try:
        return f"{name}=={metadata.version(name)}"
    except metadata.PackageNotFoundError:
        print(f"  {name} is not installed here; taking PyPI's newest", flush=True)
        return name


def download(requirements: list[str], dest: Path) -> None:
    """cp312 manylinux (or pure, or abi3) wheels of exactly these requirements into dest, replacing
    the wheels there: two versions of one package stop the install on the device."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "--dest", str(dest)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    print(f"  pip download {' '.join(requirements)}", flush=True)
    subprocess.run(command + requirements, check=True)


def export_baseline(rev: str, dest: Path) -> str:
    """Write rev's BASELINE_PATHS under dest (emptied first); return the full commit id."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with tempfile.TemporaryFile() as archive:
        subprocess.run(["git", "archive", "--format=tar", commit, *BASELINE_PATHS], cwd=ROOT, check=True,
                       stdout=archive)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(dest, filter="data")
    (dest / "REVISION").write_text(commit + "\n")
    return commit


def tree_bytes() -> int:
    """What the device tool sends besides the carried folders: the tracked and the untracked,
    not ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.split(b"\0")
    paths = (ROOT / name.decode() for name in listed if name)
    return sum(path.stat().st_size for path in paths if path.is_file())


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", action="store_true", help="also .whl/server for gpu_check.sh --server-tests")
    parser.add_argument("--baseline", metavar="REV", help="export REV's sources to .carry/base for tools/gpu_ab.sh")
    args = parser.parse_args()
    from flare.fixtures import FixtureError, llama3_tokenizer_json

    wheels, carry = ROOT / ".whl", ROOT / ".carry"
    print("wheels the device image lacks -> .whl/", flush=True)
    download([pinned(name) for name in CARRIED], wheels)
    server = wheels / "server"
    if args.server:
        print("the HTTP clients tests/server imports -> .whl/server/", flush=True)
        download([pinned(name) for name in SERVER], server)
    elif server.exists():
        shutil.rmtree(server)  # a stale client would travel with every call
    print("the Llama 3 tokenizer -> .carry/llama3-tokenizer.json", flush=True)
    carry.mkdir(exist_ok=True)
    try:
        shutil.copyfile(llama3_tokenizer_json(), carry / "llama3-tokenizer.json")
    except FixtureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.baseline:
        commit = export_baseline(args.baseline, carry / "base")
        print(f"baseline {commit[:12]} -> .carry/base/", flush=True)
    elif (carry / "base").exists():
        print(f"keeping .carry/base/ ({(carry / 'base' / 'REVISION').read_text().strip()[:12]})", flush=True)
    sizes = {"tree": tree_bytes(), ".whl": folder_bytes(wheels), ".carry": folder_bytes(carry)}
    total = sum(sizes.values())
    print("carried: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sizes.items())
          + f"; {total / 2**20:.1f} of {CARRY_LIMIT >> 20} MiB")
    if total > CARRY_LIMIT:
        print("error: over the device tool's limit; drop --server or the baseline", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
