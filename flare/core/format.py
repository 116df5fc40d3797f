"""The core format: a prepared model directory and its manifest, ``core.json``.

See docs/core-format.md. Loading refuses, with a CoreError naming the file and
the field, a manifest with a field of the wrong type or range
(flare/core/schema.py), a missing or resized asset, weights that disagree with
the recipe (flare/core/layout.py, headers only), a contract hash that disagrees
with its asset, and then any asset whose SHA-256 differs from its record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CoreError
from ..model.spec import ModelSpec
from ..progress import Progress, reporter, sha256_file
from ..request import GenerationDefaults
from .layout import check_weights
from .schema import TEMPLATE_ASSET, check_manifest

FORMAT_NAME = "flare-core"
FORMAT_VERSION = 1
MANIFEST = "core.json"
REPORT_BYTES = 256 << 20  # hashing more than this is reported as a task (flare/progress.py)


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
    mixed_prefill: bool = False  # capture MIXED graphs (decode rows inside packed prefill steps)

    def to_json(self) -> dict[str, Any]:
        return {
            "context": self.context, "max_active": self.max_active,
            "prefill_chunk_size": self.prefill_chunk_size, "page_tokens": self.page_tokens,
            "served_names": list(self.served_names), "context_hint": self.context_hint,
            "capacity_hint": self.capacity_hint, "frontend": self.frontend, "mixed_prefill": self.mixed_prefill,
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
    generation: GenerationDefaults  # request defaults (core.json "generation")
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
    """core.json as a JSON object of this format and version (its fields unchecked)."""
    manifest_path = Path(path) / MANIFEST
    if not manifest_path.is_file():
        raise CoreError(path, f"is not a Flare core: {MANIFEST} is missing")
    try:
        data = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CoreError(manifest_path, f"is corrupt: not valid JSON ({exc})") from None
    except OSError as exc:
        raise CoreError(manifest_path, f"cannot be read: {exc.strerror or exc}") from None
    if not isinstance(data, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(data), "a number")
        raise CoreError(manifest_path, f"must hold a JSON object, got {kind}")
    if data.get("format") != FORMAT_NAME:
        raise CoreError(manifest_path, f"format must be {FORMAT_NAME!r}: this is not a Flare core manifest",
                        field="format")
    version = data.get("format_version")
    if version != FORMAT_VERSION or isinstance(version, bool):
        raise CoreError(manifest_path, f"format_version is {json.dumps(version)}; this Flare reads "
                                       f"{FORMAT_VERSION}", field="format_version")
    return data


def check_files(path: Path, assets: dict[str, dict[str, Any]]) -> None:
    """Every asset is present with its recorded size (a stat each, no reading)."""
    for name, info in sorted(assets.items()):
        asset = path / name
        if not asset.is_file():
            raise CoreError(asset, f"is missing (core.json assets.{name} lists it)", field=f"assets.{name}")
        size = asset.stat().st_size
        if size != info["bytes"]:
            raise CoreError(asset, f"has {size} bytes but core.json assets.{name}.bytes records {info['bytes']}",
                            field=f"assets.{name}.bytes")


def check_contract_hashes(path: Path, contract: dict[str, Any], assets: dict[str, dict[str, Any]]) -> list[str]:
    """The contract's asset hashes against the assets' records; returns the assets they name."""
    recorded = contract["frontend"]["template"]["sha256"]
    name = "contract.frontend.template.sha256"
    if recorded is None:
        if TEMPLATE_ASSET in assets:
            raise CoreError(path / MANIFEST, f"{name} is null but the core has {TEMPLATE_ASSET}", field=name)
        return []
    if TEMPLATE_ASSET not in assets:
        raise CoreError(path / MANIFEST, f"{name} records a chat template but assets has no {TEMPLATE_ASSET}",
                        field=name)
    if recorded != assets[TEMPLATE_ASSET]["sha256"]:
        raise CoreError(path / MANIFEST, f"{name} is {recorded} but assets.{TEMPLATE_ASSET}.sha256 is "
                                         f"{assets[TEMPLATE_ASSET]['sha256']}: the template changed after export "
                                         "without its contract; export the core again", field=name)
    return [TEMPLATE_ASSET]


def verify_assets(path: Path, assets: dict[str, dict[str, Any]], progress: Progress | None = None) -> None:
    """Check every asset's SHA-256 (shards hashed in parallel: hashlib releases the
    GIL, so a 16 GB core verifies in a few seconds on a many-core host)."""
    from concurrent.futures import ThreadPoolExecutor

    total = sum(info["bytes"] for info in assets.values())
    names = sorted(assets)
    with reporter(progress if total > REPORT_BYTES else None).task(f"verifying {len(assets)} assets",
                                                                   total=total) as advance:
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(names)))) as pool:
            digests = dict(zip(names, pool.map(lambda n: sha256_file(path / n, advance), names)))
    for name in names:
        if digests[name] != assets[name]["sha256"]:
            raise CoreError(path / name, f"fingerprint mismatch for core asset {name}: SHA-256 {digests[name]}, "
                                         f"core.json assets.{name}.sha256 records {assets[name]['sha256']}",
                            field=f"assets.{name}.sha256")


def load_core(path: Path, *, verify: bool = True, progress: Progress | None = None) -> Core:
    """Read and check a core, cheapest checks first: core.json's fields, each asset's
    presence and size, the weights' headers against the recipe, the contract's asset
    hashes; then (``verify``) every asset's SHA-256. ``verify=False`` still hashes the
    assets the contract fingerprints (the chat template: small). Raises CoreError."""
    path = Path(path)
    data = read_manifest(path)
    check_manifest(path / MANIFEST, data)
    assets = data["assets"]
    check_files(path, assets)
    recipe = ModelSpec.from_json(data["recipe"])
    check_weights([path / n for n in sorted(assets) if n.startswith("weights")], recipe, data["dtype"])
    hashed = check_contract_hashes(path, data["contract"], assets)
    verify_assets(path, assets if verify else {n: assets[n] for n in hashed}, progress)
    return Core(
        path=path,
        identifier=data["identifier"],
        recipe=recipe,
        dtype=data["dtype"],
        contract=CoreContract.from_json(data["contract"]),
        generation=GenerationDefaults.from_mapping(data.get("generation") or {}),
        assets=assets,
        manifest=data,
    )
