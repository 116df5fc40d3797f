"""Export ("ignition"): a checkpoint directory or GGUF file -> a core directory.

The core is written into a staging directory beside the output and renamed into
place only when complete, so a failed export leaves nothing behind. Exporting
onto an existing core succeeds only when the result is identical (same
manifest); a directory holding anything else is refused. The core records the
source's generation defaults (generation_config.json's sampling values, a GGUF's
``general.sampling.*`` metadata), each overridable with ``ExportOptions.generation``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save_file

from ..config import MAX_ACTIVE_LIMIT, PAGE_TOKENS
from ..errors import FrontendError
from ..model.checkpoint import iter_runtime_weights, read_config, runtime_weight_shapes
from ..model.spec import ModelSpec
from ..progress import Progress, Reporter, reporter, sha256_file
from ..request import GENERATION_KEYS, GenerationDefaults
from .format import FORMAT_NAME, FORMAT_VERSION, MANIFEST, REPORT_BYTES, CoreContract, read_manifest

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHARD_BYTES = 2 << 30


@dataclass(frozen=True)
class ExportOptions:
    context: int | None = None  # default: the checkpoint's max_position_embeddings
    max_active: int = 16
    prefill_chunk_size: int = 512
    mixed_prefill: bool = False  # flare export --mixed-prefill: the core's contract captures MIXED graphs
    served_names: tuple[str, ...] = ()
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    identifier: str | None = None
    context_hint: str = "re-export the core with a larger --context"
    capacity_hint: str = "raise --max-active when exporting or serving"
    # (key, value) generation defaults (flare export --generation KEY=VALUE), over the source's
    generation: tuple[tuple[str, int | float], ...] = ()
    # A template source exported instead of the checkpoint's (flare export --chat-template FILE; the
    # command checks that it compiles).
    chat_template: str | None = None
    # The output parsers recorded for the template (frontend/parsers): "auto" asks
    # ``detect_parsers`` (template source -> (tool, reasoning) names; the CLI passes
    # frontend/parsers/detect.py's, which core may not import), None records none. "auto"
    # without a detector records nothing: the server then detects them from the template.
    tool_parser: str | None = "auto"
    reasoning_parser: str | None = "auto"
    detect_parsers: Callable[[str], tuple[str | None, str | None]] | None = None

    def validate(self, spec: ModelSpec) -> tuple[int, torch.dtype]:
        context = self.context or spec.max_position_embeddings
        if context < PAGE_TOKENS:
            raise FrontendError(f"context {context} is below one page ({PAGE_TOKENS} tokens)")
        if not 1 <= self.max_active <= MAX_ACTIVE_LIMIT:
            raise FrontendError(f"max_active must be between 1 and {MAX_ACTIVE_LIMIT}, got {self.max_active}")
        chunk = self.prefill_chunk_size
        if chunk < PAGE_TOKENS or chunk % PAGE_TOKENS:
            raise FrontendError(
                f"prefill_chunk_size must be a positive multiple of {PAGE_TOKENS}, got {chunk}")
        if chunk > context:
            raise FrontendError(f"prefill_chunk_size {chunk} exceeds the context {context}")
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise FrontendError(f"unsupported dtype {self.dtype!r}; choose auto, {', '.join(DTYPES)}")
        GenerationDefaults.from_mapping(dict(self.generation), source="--generation")
        return context, DTYPES.get(self.dtype, torch.float32)


def _source_dtype(config: dict) -> torch.dtype:
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    return DTYPES.get(str(name).replace("torch.", ""), torch.float32)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FrontendError(f"{path} is not valid JSON: {exc}") from None


def _chat_template(checkpoint: Path, tokenizer_config: dict) -> str | None:
    jinja = checkpoint / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    return template


def _token_text(value) -> str | None:
    if isinstance(value, dict):  # AddedToken serialization
        return value.get("content")
    return value


def _frontend_settings(checkpoint: Path, spec: ModelSpec) -> tuple[dict[str, Any], str | None]:
    tokenizer_config = _read_json(checkpoint / "tokenizer_config.json")
    generation_config = _read_json(checkpoint / "generation_config.json")
    eos = generation_config.get("eos_token_id", list(spec.eos_token_ids))
    eos_ids = sorted({int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None}
                     | set(spec.eos_token_ids))
    frontend = {
        "bos_token": _token_text(tokenizer_config.get("bos_token")),
        "eos_token": _token_text(tokenizer_config.get("eos_token")),
        "pad_token": _token_text(tokenizer_config.get("pad_token")),
        "unk_token": _token_text(tokenizer_config.get("unk_token")),
        "add_bos_token": bool(tokenizer_config.get("add_bos_token", False)),
        "eos_token_ids": eos_ids,
    }
    return frontend, _chat_template(checkpoint, tokenizer_config)


def _output_parsers(template: str | None, options: ExportOptions) -> tuple[str | None, str | None] | None:
    """The (tool-call, reasoning) parser names to record: the options', or what the template
    implies; None (record nothing) when a choice is "auto" and there is no detector."""
    auto = "auto" in (options.tool_parser, options.reasoning_parser)
    if auto and options.detect_parsers is None:
        return None
    detected = options.detect_parsers(template) if auto and template is not None else (None, None)
    tool = detected[0] if options.tool_parser == "auto" else options.tool_parser
    reasoning = detected[1] if options.reasoning_parser == "auto" else options.reasoning_parser
    return tool, reasoning


def _generation(checkpoint: Path, origin: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The core's request defaults: generation_config.json's sampling values (vLLM reads the
    same six keys; null counts as absent), each key ``overrides`` sets replaced. ``origin``
    names where the file's values came from in errors."""
    generation_config = _read_json(checkpoint / "generation_config.json")
    source = {k: generation_config[k] for k in GENERATION_KEYS
              if generation_config.get(k) is not None and k not in overrides}
    try:
        GenerationDefaults.from_mapping(source, source=origin)
    except FrontendError as exc:
        raise FrontendError(f"{exc} (override it with --generation {exc.param}=VALUE)", param=exc.param) from None
    return GenerationDefaults.from_mapping({**source, **overrides}).to_json()


def _write_weights(checkpoint: Path, spec: ModelSpec, dtype: torch.dtype, staging: Path,
                   progress: Reporter) -> list[str]:
    """Write the runtime weights as shards of SHARD_BYTES; one task in bytes of the output, each
    tensor's half counted when it is read and cast, the other when its shard is written."""
    names: list[str] = []
    shard: dict[str, torch.Tensor] = {}
    shard_bytes = 0
    total = sum(math.prod(shape) for shape in runtime_weight_shapes(spec).values()) * dtype.itemsize

    def flush() -> None:
        nonlocal shard, shard_bytes
        if shard:
            name = f"weights-{len(names) + 1:05d}.safetensors"
            save_file(shard, str(staging / name), metadata={"format": "flare"})
            advance(shard_bytes / 2)
            names.append(name)
            progress(f"wrote {name} ({shard_bytes / 2**20:.0f} MiB)")
        shard, shard_bytes = {}, 0

    with progress.task(f"writing {str(dtype).replace('torch.', '')} weights", total=total) as advance:
        for name, tensor in iter_runtime_weights(checkpoint, spec, dtype):
            shard[name] = tensor
            tensor_bytes = tensor.numel() * tensor.element_size()
            shard_bytes += tensor_bytes
            advance(tensor_bytes / 2)
            if shard_bytes >= SHARD_BYTES:
                flush()
        flush()
    return names


def _fingerprints(core_dir: Path, names: list[str], progress: Reporter) -> dict[str, dict[str, Any]]:
    """Each asset's size and SHA-256 (hashed in parallel; a task when there is much to read)."""
    sizes = {name: (core_dir / name).stat().st_size for name in names}
    total = sum(sizes.values())
    from concurrent.futures import ThreadPoolExecutor
    with reporter(progress if total > REPORT_BYTES else None).task(
            f"fingerprinting {len(names)} assets", total=total) as advance:
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(names)))) as pool:
            digests = list(pool.map(lambda n: sha256_file(core_dir / n, advance), names))
    return {name: {"bytes": sizes[name], "sha256": digest} for name, digest in zip(names, digests)}


def export_core(source: Path, output: Path, options: ExportOptions = ExportOptions(),
                progress: Progress | None = None) -> Path:
    """Prepare ``source`` (checkpoint directory or .gguf file) as a core at ``output``."""
    progress = reporter(progress)
    source, output = Path(source), Path(output)
    if not source.exists():
        raise FrontendError(f"export source {source} does not exist")
    if output.exists() and any(output.iterdir()):
        read_manifest(output)  # refuses a directory that is not a core
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}-export-", dir=output.parent))
    try:
        checkpoint = source
        identifier = options.identifier
        origin = str(source / "generation_config.json")
        if source.is_file():
            if source.suffix != ".gguf":
                raise FrontendError(f"{source} is neither a checkpoint directory nor a .gguf file")
            from .gguf import import_gguf
            progress(f"converting {source.name} from GGUF")
            checkpoint = import_gguf(source, staging / "checkpoint", progress)
            origin = f"{source} (general.sampling metadata)"
            identifier = identifier or source.name.split(".")[0]
        identifier = identifier or source.resolve().name
        config = read_config(checkpoint)
        spec = ModelSpec.from_hf_config(config)
        context, dtype = options.validate(spec)
        if options.dtype == "auto":
            dtype = _source_dtype(config)
        if not (checkpoint / "tokenizer.json").is_file():
            raise FrontendError(f"{checkpoint} has no tokenizer.json")
        frontend, template = _frontend_settings(checkpoint, spec)
        if options.chat_template is not None:
            template = options.chat_template
            progress("chat template: the one given, not the checkpoint's")
        generation = _generation(checkpoint, origin, dict(options.generation))
        if spec.eos_token_ids != tuple(frontend["eos_token_ids"]):
            spec = ModelSpec.from_json({**spec.to_json(), "eos_token_ids": frontend["eos_token_ids"]})

        core_dir = staging / "core"
        core_dir.mkdir()
        progress(f"exporting {identifier}: {spec.family}, {spec.num_layers} layers, "
                 f"{spec.num_params / 1e6:.0f}M parameters, {str(dtype).replace('torch.', '')}")
        asset_names = _write_weights(checkpoint, spec, dtype, core_dir, progress)
        shutil.copyfile(checkpoint / "tokenizer.json", core_dir / "tokenizer.json")
        asset_names.append("tokenizer.json")
        if template is not None:
            (core_dir / "chat_template.jinja").write_text(template, encoding="utf-8")
            asset_names.append("chat_template.jinja")
        frontend["template"] = _template_annotation(template)
        parsers = _output_parsers(template, options)
        if parsers is not None:
            frontend["tool_parser"], frontend["reasoning_parser"] = parsers
            progress(f"output parsers: tool calls {parsers[0] or 'none'}, reasoning {parsers[1] or 'none'}")
        contract = CoreContract(
            context=context, max_active=options.max_active, prefill_chunk_size=options.prefill_chunk_size,
            mixed_prefill=options.mixed_prefill, page_tokens=PAGE_TOKENS, served_names=tuple(options.served_names),
            context_hint=options.context_hint, capacity_hint=options.capacity_hint, frontend=frontend,
        )
        assets = _fingerprints(core_dir, asset_names, progress)
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "identifier": identifier,
            "dtype": str(dtype).replace("torch.", ""),
            "recipe": spec.to_json(),
            "contract": contract.to_json(),
            "generation": generation,
            "assets": assets,
        }
        (core_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if output.exists() and any(output.iterdir()):
            existing = read_manifest(output)
            if existing != manifest:
                raise FrontendError(f"{output} already holds a different core ({existing.get('identifier')}); "
                                    "choose another output directory or remove it")
            progress(f"{output} already holds this core")
            return output
        if output.exists():
            output.rmdir()
        os.replace(core_dir, output)
        progress(f"core written to {output}")
        return output
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _template_annotation(template: str | None) -> dict[str, Any]:
    """The template's fingerprint; the frontend picks its endpoint path at load."""
    if template is None:
        return {"sha256": None}
    return {"sha256": hashlib.sha256(template.encode("utf-8")).hexdigest()}
