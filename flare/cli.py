"""Command line: ``flare export``, ``flare run``, ``flare info`` and ``flare-serve``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Sequence

from . import __version__
from .config import MAX_ACTIVE_LIMIT, EngineConfig
from .core.export import DTYPES, ExportOptions
from .errors import Error, FrontendError
from .progress import stderr_progress
from .request import GENERATION_KEYS

DEMO_NAME = "demo"  # `flare info demo`: the embedded demo core


def _export_parser(sub) -> None:
    defaults = ExportOptions()
    p = sub.add_parser("export", help="prepare a checkpoint directory or GGUF file as a core",
                       description="Prepare SOURCE (a Hugging Face checkpoint directory or a .gguf file) "
                                   "as a core directory that `flare run` serves.")
    p.add_argument("source", type=Path, help="checkpoint directory or .gguf file")
    p.add_argument("-o", "--output", type=Path, required=True, help="core directory to write")
    p.add_argument("--context", type=int, default=None,
                   help="tokens per request, prompt + output (default: the checkpoint's max_position_embeddings)")
    p.add_argument("--max-active", type=int, default=defaults.max_active,
                   help=f"concurrent requests the core is prepared for, 1..{MAX_ACTIVE_LIMIT} "
                        f"(default {defaults.max_active})")
    p.add_argument("--prefill-chunk-size", type=int, default=defaults.prefill_chunk_size,
                   help=f"largest prefill chunk, a multiple of 64 (default {defaults.prefill_chunk_size})")
    p.add_argument("--mixed-prefill", action="store_true",
                   help="capture mixed steps: the decode cohort rides inside packed prefill steps "
                        "(docs/scheduler.md)")
    p.add_argument("--served-name", dest="served_names", action="append", default=[],
                   help="model name clients may use (repeatable; the first is the advertised id)")
    p.add_argument("--dtype", default=defaults.dtype, choices=("auto", *DTYPES),
                   help="weight and KV dtype (default: the checkpoint's)")
    p.add_argument("--identifier", default=None, help="checkpoint identifier reported as the model root")
    p.add_argument("--context-hint", default=defaults.context_hint,
                   help="appended to context-length errors")
    p.add_argument("--capacity-hint", default=defaults.capacity_hint, help="appended to capacity errors")
    p.add_argument("--chat-template", type=Path, default=None, metavar="FILE",
                   help="a Jinja chat template exported instead of the checkpoint's (checked to compile)")
    p.add_argument("--tool-parser", default="auto", metavar="NAME",
                   help="the tool-call parser recorded for the core: auto (chosen from the chat template), "
                        "none, or one of flare/frontend/parsers' names")
    p.add_argument("--reasoning-parser", default="auto", metavar="NAME",
                   help="the reasoning parser recorded for the core: auto, none, or a parser name")
    p.add_argument("--generation", action="append", default=[], metavar="KEY=VALUE",
                   help="a request default, over the checkpoint's generation_config.json value (repeatable; "
                        f"KEY is one of {', '.join(GENERATION_KEYS)})")


def _serve_arguments(p: argparse.ArgumentParser, *, core_optional: bool) -> None:
    from .server.options import add_server_arguments

    if core_optional:
        p.add_argument("core", nargs="?", type=Path, default=None,
                       help="core directory (default: the embedded SmolLM2-135M-Instruct demo core)")
    else:
        p.add_argument("core", type=Path, help="core directory written by `flare export`")
    engine = p.add_argument_group("engine")
    engine.add_argument("--device", default=argparse.SUPPRESS, help="auto, cpu, cuda or cuda:N (default auto)")
    engine.add_argument("--kv-memory-bytes", dest="kv_memory_bytes", type=int, default=argparse.SUPPRESS,
                        help="KV cache budget (default: 1 GiB on the CPU, a fraction of free GPU memory)")
    add_server_arguments(p)


def _serve(args: argparse.Namespace) -> int:
    from .engine.native import NativeEngine
    from .server.options import load_server_config
    from .server.session import serve

    core = args.core
    del args.core
    config = load_server_config(args, os.environ)
    if config.engine.tensor_parallel > 1 and os.environ.get("RANK", "0") != "0":
        # a rank torchrun started on another host (or beside rank 0): it serves nothing itself
        from .execution.ranks import plan_from_environment, run_rank
        return run_rank(int(os.environ["RANK"]), plan_from_environment(config.engine.tensor_parallel))
    if core is None:
        from .core.embedded import demo_core
        core = demo_core(stderr_progress())
        print(f"flare: serving the demo core at {core}", file=sys.stderr)
    else:
        from .core.format import load_core
        # Refuse a bad core here, as one line and exit 2, before the server starts: every
        # check but the full SHA-256 pass, which the engine's load makes.
        load_core(core, verify=False)
    if config.chat_template:
        _template_text(Path(config.chat_template))  # one line and exit 2 before any weight is read
    return serve(lambda progress: NativeEngine.load(core, config, progress), config)


def _generation_settings(items: Sequence[str]) -> tuple[tuple[str, int | float], ...]:
    """``KEY=VALUE`` items as (key, number) pairs; the last of a repeated key wins. Ranges are
    ExportOptions.validate's to check."""
    settings: dict[str, int | float] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or key not in GENERATION_KEYS:
            raise FrontendError(f"--generation {item!r}: expected KEY=VALUE with KEY one of "
                                f"{', '.join(GENERATION_KEYS)}")
        try:
            value: int | float = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise FrontendError(f"--generation {item!r}: {text!r} is not a number") from None
        settings[key] = value
    return tuple(settings.items())


def _template_text(path: Path | None) -> str | None:
    """A --chat-template file's text, refused (line and column) unless it compiles."""
    if path is None:
        return None
    from .frontend.frontend import read_template_file
    return read_template_file(path).decode("utf-8")


def _parser_choice(name: str, kind: str) -> str | None:
    """An export's --tool-parser / --reasoning-parser: auto, none (None) or a known name."""
    from .frontend.parsers import check_parser_name

    return None if name == "none" else name if name == "auto" else check_parser_name(name, kind)


def _export(args: argparse.Namespace) -> int:
    from .core.export import export_core
    from .frontend.parsers.detect import detect

    options = ExportOptions(
        context=args.context, max_active=args.max_active, prefill_chunk_size=args.prefill_chunk_size,
        mixed_prefill=args.mixed_prefill, served_names=tuple(args.served_names), dtype=args.dtype,
        identifier=args.identifier,
        context_hint=args.context_hint, capacity_hint=args.capacity_hint,
        generation=_generation_settings(args.generation), chat_template=_template_text(args.chat_template),
        tool_parser=_parser_choice(args.tool_parser, "tool"),
        reasoning_parser=_parser_choice(args.reasoning_parser, "reasoning"), detect_parsers=detect,
    )
    export_core(args.source, args.output, options, stderr_progress())
    return 0


def _info(args: argparse.Namespace) -> int:
    import json

    from .core.format import load_core

    path, verify = args.core, not args.no_verify
    progress = stderr_progress()  # the demo core's first preparation and the SHA-256 pass
    if str(path) == DEMO_NAME and not path.exists():
        from .core.embedded import demo_core
        path, verify = demo_core(progress), False  # demo_core verified it
    core = load_core(path, verify=verify, progress=progress)
    print(f"{path}:")
    r, c = core.recipe, core.contract
    print(f"{core.identifier}: {r.architecture}, {r.num_layers} layers, hidden {r.hidden_size}, "
          f"{r.num_params / 1e6:.1f}M parameters, {core.dtype}")
    print(f"context {c.context}, max_active {c.max_active}, prefill_chunk_size {c.prefill_chunk_size}, "
          f"served names {', '.join(c.served_names) or '-'}")
    print(f"mixed prefill: {'on (decode rides inside packed prefill steps)' if c.mixed_prefill else 'off'}")
    print(f"speculative decoding: off unless served with --speculative copy (n-gram copy proposals) or "
          f"--speculative draft --draft-core DIR (a draft core with this tokenizer), verified "
          f"{EngineConfig.speculative_depth} drafts deep; docs/speculative.md")
    defaults = core.generation.to_json()
    print("generation defaults: " + (", ".join(f"{k} {v}" for k, v in defaults.items()) if defaults
                                     else "none (requests get OpenAI's)"))
    frontend = c.frontend
    if "tool_parser" in frontend:
        print(f"output parsers: tool calls {frontend['tool_parser'] or 'none'}, "
              f"reasoning {frontend['reasoning_parser'] or 'none'}")
    else:
        print("output parsers: not recorded (chosen from the chat template when served)")
    print(json.dumps({name: info["sha256"][:16] for name, info in core.assets.items()}, indent=2))
    sys.stdout.flush()  # a closed pipe fails here, inside main's handler, not at exit
    return 0


def _closed_pipe() -> int:
    """stdout's reader went away (``flare info CORE | head``): no traceback, and no second
    failure when the interpreter flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 1


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flare", description="Flare LLM inference server")
    _add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    _export_parser(sub)
    run = sub.add_parser("run", help="serve a core over HTTP (default: the embedded demo core)")
    _serve_arguments(run, core_optional=True)
    info = sub.add_parser("info", help="describe a core and verify its fingerprints")
    info.add_argument("core", type=Path, help=f"core directory, or {DEMO_NAME!r} for the embedded demo core")
    info.add_argument("--no-verify", action="store_true", help="skip SHA-256 verification")
    args = parser.parse_args(argv)
    try:
        if args.command == "export":
            return _export(args)
        if args.command == "info":
            return _info(args)
        return _serve(args)
    except BrokenPipeError:
        return _closed_pipe()
    except (Error, OSError) as exc:  # a refusal, or a file the OS would not give us
        print(f"flare: error: {exc}", file=sys.stderr)
        return 2


def serve_main(argv: Sequence[str] | None = None) -> int:
    """``flare-serve [CORE]``: the same as ``flare run CORE``; the demo core without CORE."""
    parser = argparse.ArgumentParser(prog="flare-serve", description="Serve a Flare core over HTTP")
    _add_version(parser)
    _serve_arguments(parser, core_optional=True)
    args = parser.parse_args(argv)
    try:
        return _serve(args)
    except (Error, OSError) as exc:  # a refusal, or a file the OS would not give us
        print(f"flare-serve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
