"""The core format: a prepared model directory and its manifest, ``core.json``.

See docs/core-format.md. Loading checks the format version, then every asset's
size and SHA-256 before anything is parsed, so a truncated or edited core fails
with a FrontendError naming the asset.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..errors import FrontendError
from ..fixtures import sha256_file as sha256_path
from ..model.spec import ModelSpec

FORMAT_NAME = "flare-core"
FORMAT_VERSION = 1
MANIFEST = "core.json"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class CoreContract:
    """Serving limits fixed at export (the runtime may lower max_active, never raise it)."""

    context: int
    max_active: int
    prefill_chunk_size: int
    page_tokens: int = 64
    served_names: tuple[str, ...] = ()
    context_hint: str = ""
    capacity_hint: str = ""
    frontend: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "context": self.context, "max_active": self.max_active,
            "prefill_chunk_size": self.prefill_chunk_size, "page_tokens": self.page_tokens,
            "served_names": list(self.served_names), "context_hint": self.context_hint,
            "capacity_hint": self.capacity_hint, "frontend": self.frontend,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CoreContract":
        data = dict(data)
        data["served_names"] = tuple(data.get("served_names") or ())
        return cls(**data)


@dataclass(frozen=True)
class Core:
    """A verified core on disk."""

    path: Path
    identifier: str
    recipe: ModelSpec
    dtype: str
    contract: CoreContract
    generation: dict[str, Any]
    assets: dict[str, dict[str, Any]]
    manifest: dict[str, Any]

    def asset(self, name: str) -> Path:
        return self.path / name

    @property
    def weight_files(self) -> list[Path]:
        return [self.path / n for n in sorted(self.assets) if n.startswith("weights")]

    @property
    def chat_template(self) -> str | None:
        p = self.path / "chat_template.jinja"
        return p.read_text(encoding="utf-8") if "chat_template.jinja" in self.assets else None


def read_manifest(path: Path) -> dict[str, Any]:
    manifest_path = Path(path) / MANIFEST
    if not manifest_path.is_file():
        raise FrontendError(f"{path} is not a Flare core: {MANIFEST} is missing")
    try:
        data = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FrontendError(f"{manifest_path} is corrupt: {exc}") from None
    if data.get("format") != FORMAT_NAME:
        raise FrontendError(f"{manifest_path} is not a Flare core manifest")
    if data.get("format_version") != FORMAT_VERSION:
        raise FrontendError(
            f"{manifest_path} has format version {data.get('format_version')}; this Flare reads {FORMAT_VERSION}")
    return data


def verify_assets(path: Path, assets: dict[str, dict[str, Any]], progress: Progress | None = None) -> None:
    """Check every asset's size, then its SHA-256 (shards hashed in parallel: hashlib
    releases the GIL, so a 16 GB core verifies in a few seconds on a many-core host)."""
    from concurrent.futures import ThreadPoolExecutor

    for name, info in sorted(assets.items()):
        asset = path / name
        if not asset.is_file():
            raise FrontendError(f"core asset {name} is missing from {path}")
        size = asset.stat().st_size
        if size != info["bytes"]:
            raise FrontendError(f"core asset {name} has {size} bytes, the manifest records {info['bytes']}")
    total = sum(info["bytes"] for info in assets.values())
    if progress and total > (256 << 20):
        progress(f"verifying {len(assets)} assets ({total / 2**30:.1f} GiB)")
    names = sorted(assets)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names)))) as pool:
        digests = dict(zip(names, pool.map(lambda n: sha256_path(path / n), names)))
    for name in names:
        if digests[name] != assets[name]["sha256"]:
            raise FrontendError(f"fingerprint mismatch for core asset {name}: SHA-256 {digests[name]}, "
                                f"manifest records {assets[name]['sha256']}")


def load_core(path: Path, *, verify: bool = True, progress: Progress | None = None) -> Core:
    """Read a core's manifest and verify every asset's size and SHA-256."""
    path = Path(path)
    data = read_manifest(path)
    assets = data.get("assets") or {}
    if verify:
        verify_assets(path, assets, progress)
    try:
        return Core(
            path=path,
            identifier=data["identifier"],
            recipe=ModelSpec.from_json(data["recipe"]),
            dtype=data["dtype"],
            contract=CoreContract.from_json(data["contract"]),
            generation=data.get("generation") or {},
            assets=assets,
            manifest=data,
        )
    except (KeyError, TypeError) as exc:
        raise FrontendError(f"{path / MANIFEST} is missing or has a malformed field: {exc}") from None
