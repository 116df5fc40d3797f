"""Grammar engines side by side: llguidance and xgrammar on this project's tokenizers.

For issue 21's choice of engine. Both run in this process over the same tokenizer.json
(the demo core's SmolLM2 vocabulary, 49,152 tokens, and the Llama 3 fixture's, 128,256):

- tokenizer setup time;
- compile time of 20 real tool-call and extraction JSON Schemas (caching off);
- mask time per token: each schema's matcher walks an instance of the schema token by
  token (the instance's next token when the mask allows it, else the lowest allowed ID),
  computing the full next-token bitmask before every token;
- JSON Schema coverage: which of a list of schema features each engine compiles, refuses
  with an error, or accepts while ignoring (checked by matching a value that violates the
  feature);
- memory: resident memory the engine adds in a fresh process (setup + the compiled
  matchers), over the same imports.

    python tools/bench_grammar.py            # both tokenizers
    python tools/bench_grammar.py --quick    # the demo tokenizer only

Needs ``pip install llguidance xgrammar`` (the bench extra) and transformers (xgrammar
builds its tokenizer info from a transformers tokenizer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

SCHEMAS: dict[str, dict] = {
    "weather": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"], "additionalProperties": False},
    "web_search": {"type": "object", "properties": {
        "query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
        "site": {"type": "string"}}, "required": ["query"], "additionalProperties": False},
    "send_email": {"type": "object", "properties": {
        "to": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "subject": {"type": "string"}, "body": {"type": "string"},
        "cc": {"type": "array", "items": {"type": "string"}}},
        "required": ["to", "subject", "body"], "additionalProperties": False},
    "calendar_event": {"type": "object", "properties": {
        "title": {"type": "string"}, "start": {"type": "string", "format": "date-time"},
        "end": {"type": "string", "format": "date-time"}, "attendees": {"type": "array", "items": {"type": "string"}},
        "location": {"type": ["string", "null"]}}, "required": ["title", "start", "end"],
        "additionalProperties": False},
    "run_sql": {"type": "object", "properties": {
        "query": {"type": "string"}, "database": {"type": "string", "enum": ["prod", "staging", "analytics"]},
        "timeout_s": {"type": "number", "minimum": 0}}, "required": ["query", "database"],
        "additionalProperties": False},
    "read_file": {"type": "object", "properties": {
        "path": {"type": "string"}, "offset": {"type": "integer", "minimum": 0}, "limit": {"type": "integer"}},
        "required": ["path"], "additionalProperties": False},
    "shell": {"type": "object", "properties": {
        "command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"},
        "timeout_ms": {"type": "integer"}}, "required": ["command"], "additionalProperties": False},
    "create_ticket": {"type": "object", "properties": {
        "title": {"type": "string"}, "priority": {"type": "string", "enum": ["low", "medium", "high", "urgent"]},
        "labels": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "assignee": {"type": "string"}}, "required": ["title", "priority"], "additionalProperties": False},
    "person": {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"}, "phone": {"type": "string"}},
        "required": ["name"], "additionalProperties": False},
    "address": {"type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"},
        "postal_code": {"type": "string", "pattern": "^[0-9]{5}$"},
        "country": {"type": "string", "minLength": 2, "maxLength": 2}}, "required": ["street", "city", "country"],
        "additionalProperties": False},
    "invoice": {"type": "object", "properties": {
        "number": {"type": "string"}, "date": {"type": "string", "format": "date"}, "currency": {"type": "string"},
        "lines": {"type": "array", "items": {"type": "object", "properties": {
            "description": {"type": "string"}, "quantity": {"type": "integer"}, "unit_price": {"type": "number"}},
            "required": ["description", "quantity", "unit_price"], "additionalProperties": False}},
        "total": {"type": "number"}}, "required": ["number", "date", "lines", "total"], "additionalProperties": False},
    "sentiment": {"type": "object", "properties": {
        "label": {"type": "string", "enum": ["positive", "negative", "neutral"]},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["label", "confidence"],
        "additionalProperties": False},
    "entities": {"type": "object", "properties": {"entities": {"type": "array", "items": {
        "type": "object", "properties": {"text": {"type": "string"}, "type": {"type": "string", "enum": [
            "PERSON", "ORG", "LOC", "DATE", "MISC"]}, "start": {"type": "integer"}, "end": {"type": "integer"}},
        "required": ["text", "type"], "additionalProperties": False}}}, "required": ["entities"],
        "additionalProperties": False},
    "product": {"type": "object", "properties": {
        "sku": {"type": "string"}, "name": {"type": "string"}, "price": {"type": "number", "exclusiveMinimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "dimensions": {"type": "object", "properties": {"w": {"type": "number"}, "h": {"type": "number"},
                                                       "d": {"type": "number"}}, "required": ["w", "h", "d"],
                       "additionalProperties": False}}, "required": ["sku", "name", "price"],
        "additionalProperties": False},
    "order": {"type": "object", "properties": {
        "order_id": {"type": "string"}, "customer": {"$ref": "#/$defs/customer"},
        "items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1},
        "status": {"type": "string", "enum": ["new", "paid", "shipped", "cancelled"]}},
        "required": ["order_id", "customer", "items", "status"], "additionalProperties": False,
        "$defs": {"customer": {"type": "object", "properties": {"id": {"type": "string"}, "name": {"type": "string"}},
                               "required": ["id", "name"], "additionalProperties": False},
                  "item": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                           "required": ["sku", "qty"], "additionalProperties": False}}},
    "classification": {"type": "object", "properties": {
        "category": {"type": "string", "enum": ["billing", "technical", "account", "other"]},
        "subcategory": {"type": "string"}, "urgent": {"type": "boolean"}}, "required": ["category", "urgent"],
        "additionalProperties": False},
    "recipe": {"type": "object", "properties": {
        "title": {"type": "string"}, "servings": {"type": "integer"},
        "ingredients": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "amount": {"type": "string"}}, "required": ["name", "amount"],
            "additionalProperties": False}},
        "steps": {"type": "array", "items": {"type": "string"}}}, "required": ["title", "ingredients", "steps"],
        "additionalProperties": False},
    "search_filters": {"type": "object", "properties": {
        "query": {"type": "string"}, "filters": {"anyOf": [
            {"type": "object", "properties": {"price_max": {"type": "number"}}, "required": ["price_max"],
             "additionalProperties": False},
            {"type": "object", "properties": {"brand": {"type": "string"}}, "required": ["brand"],
             "additionalProperties": False}]}}, "required": ["query"], "additionalProperties": False},
    "plan": {"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "object", "properties": {
        "tool": {"type": "string", "enum": ["search", "read", "write", "ask"]}, "input": {"type": "string"},
        "depends_on": {"type": "array", "items": {"type": "integer"}}}, "required": ["tool", "input"],
        "additionalProperties": False}}, "final_answer": {"type": ["string", "null"]}},
        "required": ["steps"], "additionalProperties": False},
    "config": {"type": "object", "properties": {
        "name": {"type": "string"}, "replicas": {"type": "integer", "minimum": 1},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "ports": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 65535}}},
        "required": ["name", "replicas"], "additionalProperties": False},
}

INSTANCES: dict[str, object] = {
    "weather": {"city": "Paris", "unit": "celsius"},
    "web_search": {"query": "flare inference server", "max_results": 5},
    "send_email": {"to": ["a@example.com"], "subject": "Hello", "body": "See you at noon."},
    "calendar_event": {"title": "Standup", "start": "2026-12-01T09:00:00Z", "end": "2026-12-01T09:15:00Z",
                       "attendees": ["ana", "bo"], "location": None},
    "run_sql": {"query": "SELECT count(*) FROM users", "database": "analytics", "timeout_s": 2.5},
    "read_file": {"path": "/etc/hosts", "offset": 0, "limit": 100},
    "shell": {"command": ["ls", "-la"], "workdir": "/tmp"},
    "create_ticket": {"title": "Login fails", "priority": "high", "labels": ["auth", "bug"]},
    "person": {"name": "Ada Lovelace", "age": 36, "email": "ada@example.com"},
    "address": {"street": "1 Rue de Rivoli", "city": "Paris", "postal_code": "75001", "country": "FR"},
    "invoice": {"number": "INV-7", "date": "2026-11-30", "currency": "EUR",
                "lines": [{"description": "Widget", "quantity": 2, "unit_price": 9.5}], "total": 19.0},
    "sentiment": {"label": "positive", "confidence": 0.93},
    "entities": {"entities": [{"text": "Paris", "type": "LOC", "start": 0, "end": 5}]},
    "product": {"sku": "A-1", "name": "Lamp", "price": 20.0, "tags": ["home"],
                "dimensions": {"w": 1.0, "h": 2.0, "d": 3.0}},
    "order": {"order_id": "o1", "customer": {"id": "c1", "name": "Bo"}, "items": [{"sku": "A-1", "qty": 2}],
              "status": "paid"},
    "classification": {"category": "billing", "urgent": False},
    "recipe": {"title": "Tea", "ingredients": [{"name": "water", "amount": "1 cup"}], "steps": ["Boil", "Steep"]},
    "search_filters": {"query": "shoes", "filters": {"brand": "Acme"}},
    "plan": {"steps": [{"tool": "search", "input": "weather", "depends_on": []}], "final_answer": None},
    "config": {"name": "web", "replicas": 3, "env": {"MODE": "prod"}, "ports": [80, 443]},
}

# (feature, schema, a JSON text the feature forbids): "enforced" when the engine refuses
# that text, "ignored" when it accepts it, "error" when the schema does not compile.
FEATURES = [
    ("enum", {"enum": ["a", "b"]}, '"c"'),
    ("const", {"const": "x"}, '"y"'),
    ("minimum/maximum", {"type": "integer", "minimum": 1, "maximum": 9}, "10"),
    ("exclusiveMinimum", {"type": "number", "exclusiveMinimum": 0}, "0"),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, "7"),
    ("minLength/maxLength", {"type": "string", "minLength": 2, "maxLength": 3}, '"abcd"'),
    ("pattern", {"type": "string", "pattern": "^[a-z]+$"}, '"A1"'),
    ("format date-time", {"type": "string", "format": "date-time"}, '"yesterday"'),
    ("format email", {"type": "string", "format": "email"}, '"nope"'),
    ("format uuid", {"type": "string", "format": "uuid"}, '"123"'),
    ("minItems/maxItems", {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}, "[1,2,3]"),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "[1,1]"),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
     '["a",1]'),
    ("required", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, "{}"),
    ("additionalProperties false", {"type": "object", "properties": {"a": {"type": "integer"}},
                                    "additionalProperties": False}, '{"b":1}'),
    ("additionalProperties schema", {"type": "object", "additionalProperties": {"type": "integer"}}, '{"b":"x"}'),
    ("patternProperties", {"type": "object", "patternProperties": {"^x_": {"type": "integer"}},
                           "additionalProperties": False}, '{"y":1}'),
    ("min/maxProperties", {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 1},
     '{"a":1,"b":2}'),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, '"s"'),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "string"}]}, "true"),
    ("allOf", {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]}]}, '{"a":1}'),
    ("$ref recursion", {"$defs": {"node": {"type": "object", "properties": {"next": {"anyOf": [
        {"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["next"], "additionalProperties": False}},
        "$ref": "#/$defs/node"}, '{"next":{"next":1}}'),
    ("type array", {"type": ["string", "null"]}, "1"),
    ("if/then/else", {"if": {"type": "integer"}, "then": {"minimum": 5}, "else": {"type": "string"}}, "1"),
    ("not", {"not": {"type": "string"}}, '"s"'),
]


def _tokenizer_files() -> dict[str, Path]:
    from flare import fixtures
    from flare.core.embedded import demo_core
    files = {"smollm2 (49k)": demo_core() / "tokenizer.json"}
    try:
        files["llama3 (128k)"] = Path(fixtures.llama3_tokenizer_json())
    except Exception as exc:  # noqa: BLE001 - the fixture may be missing offline
        print(f"(llama3 tokenizer unavailable: {exc})", file=sys.stderr)
    return files


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer_json: Path, eos: int):
        import llguidance
        import llguidance.numpy as lnp
        self.llg, self.lnp = llguidance, lnp
        t0 = time.perf_counter()
        self.tok = llguidance.LLTokenizer(tokenizer_json.read_text(encoding="utf-8"), eos_token=eos)
        self.eos = eos
        self.setup_s = time.perf_counter() - t0
        self.vocab = self.tok.vocab_size
        self.mask = lnp.allocate_token_bitmask(1, self.vocab)

    def compile(self, schema: dict):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema)
        matcher = self.llg.LLMatcher(self.tok, grammar)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def fill(self, matcher) -> "object":
        self.lnp.fill_next_token_bitmask(matcher, self.mask, 0)
        return self.mask[0]

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token) and not matcher.is_error()

    def done(self, matcher) -> bool:
        return matcher.is_accepting() or matcher.is_stopped()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer_json: Path, eos: int):
        import xgrammar
        from transformers import PreTrainedTokenizerFast
        self.xgr = xgrammar
        t0 = time.perf_counter()
        hf = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json))
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf), stop_token_ids=[eos])
        self.eos = eos
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.setup_s = time.perf_counter() - t0
        self.vocab = len(hf)
        self.mask = xgrammar.allocate_token_bitmask(1, self.vocab)

    def compile(self, schema: dict):
        compiled = self.compiler.compile_json_schema(json.dumps(schema))
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher):
        matcher.fill_next_token_bitmask(self.mask, 0)
        return self.mask[0].numpy()

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def done(self, matcher) -> bool:
        return matcher.is_completed() or matcher.is_terminated()


def _allowed(mask_row, token: int) -> bool:
    return bool((int(mask_row[token >> 5]) >> (token & 31)) & 1)


def _first_allowed(mask_row) -> int:
    import numpy as np
    words = np.asarray(mask_row).view(np.uint32)
    nonzero = np.flatnonzero(words)
    if not nonzero.size:
        return -1
    word = int(nonzero[0])
    value = int(words[word])
    return word * 32 + ((value & -value).bit_length() - 1)


def _walk(engine, matcher, instance_ids: list[int], limit: int = 160) -> tuple[list[float], bool]:
    """Mask times (s) along the instance; whether the walk followed the instance to the end."""
    times, followed, i = [], True, 0
    for _ in range(limit):
        if engine.done(matcher) and i >= len(instance_ids):
            break
        t0 = time.perf_counter()
        row = engine.fill(matcher)
        times.append(time.perf_counter() - t0)
        token = instance_ids[i] if i < len(instance_ids) else -1
        if token < 0 or not _allowed(row, token):
            followed = False
            token = _first_allowed(row)
            if token < 0:
                break
        i += 1
        if not engine.accept(matcher, token):
            break
    return times, followed


def _coverage(engine) -> dict[str, str]:
    out = {}
    for feature, schema, bad in FEATURES:
        try:
            matcher = engine.compile(schema)
        except Exception:  # noqa: BLE001 - a refusal is the finding
            out[feature] = "error"
            continue
        ids = _encode_ids(engine, bad)
        accepted = True
        for token in ids:
            row = engine.fill(matcher)
            if not _allowed(row, token) or not engine.accept(matcher, token):
                accepted = False
                break
        # The whole text, not a prefix of a valid one ("7" begins "70"): it must be able to end here.
        accepted = accepted and _allowed(engine.fill(matcher), engine.eos)
        out[feature] = "ignored" if accepted else "enforced"
    return out


_ENCODERS: dict[int, object] = {}


def _encode_ids(engine, text: str) -> list[int]:
    tok = _ENCODERS[id(engine)]
    return tok.encode(text, add_special_tokens=False).ids


def run_engine(kind: str, tokenizer_json: Path) -> dict:
    import tokenizers
    eos = 0
    engine = (Llguidance if kind == "llguidance" else Xgrammar)(tokenizer_json, eos)
    _ENCODERS[id(engine)] = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    compile_s, mask_s, followed, refused = {}, [], 0, []
    for name, schema in SCHEMAS.items():
        t0 = time.perf_counter()
        try:
            matcher = engine.compile(schema)
        except Exception as exc:  # noqa: BLE001 - a refused schema is a finding, reported
            refused.append(f"{name}: {str(exc).splitlines()[0][:80]}")
            continue
        compile_s[name] = time.perf_counter() - t0
        ids = _encode_ids(engine, json.dumps(INSTANCES[name], separators=(",", ":")))
        times, ok = _walk(engine, matcher, ids)
        mask_s += times
        followed += ok
    result = {"setup_s": engine.setup_s, "compile_s": compile_s, "mask_s": mask_s, "followed": followed,
              "refused": refused}
    result["coverage"] = _coverage(engine)
    return result


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _memory_mib(kind: str, tokenizer_json: Path) -> float:
    """Resident memory an engine adds (setup + the 20 compiled matchers), in a fresh process."""
    code = ("import sys; sys.path.insert(0, 'tools'); import bench_grammar as b, pathlib; "
            f"print(b._engine_memory({kind!r}, pathlib.Path({str(tokenizer_json)!r})))")
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    return float(run.stdout.split()[-1])


def _engine_memory(kind: str, tokenizer_json: Path) -> float:
    import llguidance  # noqa: F401 - imported before the baseline, like the engine's own modules
    import tokenizers  # noqa: F401
    import transformers  # noqa: F401
    import xgrammar  # noqa: F401
    before = _rss_mib()
    engine = (Llguidance if kind == "llguidance" else Xgrammar)(tokenizer_json, 0)
    matchers = []
    for schema in SCHEMAS.values():
        try:
            matchers.append(engine.compile(schema))
        except Exception:  # noqa: BLE001
            pass
    return _rss_mib() - before


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the demo tokenizer only")
    args = parser.parse_args()
    files = _tokenizer_files()
    if args.quick:
        files = dict(list(files.items())[:1])
    coverage = {}
    for label, path in files.items():
        print(f"\n== {label}: {path.name}")
        print(f"{'engine':12s} {'setup':>8s} {'compile median':>15s} {'p90':>8s} {'max':>8s} "
              f"{'mask/token median':>18s} {'p99':>8s} {'tokens':>7s} {'walks':>6s} {'memory':>9s}")
        for kind in ("llguidance", "xgrammar"):
            r = run_engine(kind, path)
            comp = sorted(r["compile_s"].values())
            mask = sorted(r["mask_s"])
            rss = _memory_mib(kind, path)
            print(f"{kind:12s} {r['setup_s'] * 1e3:7.0f}ms {statistics.median(comp) * 1e3:13.2f}ms "
                  f"{comp[int(0.9 * (len(comp) - 1))] * 1e3:6.2f}ms {comp[-1] * 1e3:6.2f}ms "
                  f"{statistics.median(mask) * 1e6:16.1f}us {mask[int(0.99 * (len(mask) - 1))] * 1e6:6.0f}us "
                  f"{len(mask):7d} {r['followed']:3d}/{len(comp)} {rss:7.0f}MiB")
            for line in r["refused"]:
                print(f"    {kind} refused {line}")
            coverage[kind] = r["coverage"]
    print("\nJSON Schema features (a value the feature forbids: enforced = refused, ignored = accepted, "
          "error = schema refused)")
    print(f"{'feature':30s} {'llguidance':>11s} {'xgrammar':>10s}")
    for feature, _, _ in FEATURES:
        print(f"{feature:30s} {coverage['llguidance'][feature]:>11s} {coverage['xgrammar'][feature]:>10s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
