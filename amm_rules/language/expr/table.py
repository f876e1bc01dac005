"""The expression grammar and the LALR parser lark makes of it (:func:`make_parser`,
which :mod:`amm_rules.language.expr.parser` calls once), from a prebuilt parse table
stored as JSON when it is current.

Building lark's LALR tables from ``grammar/expr.lark`` costs more than every other
step of ``amm-rules validate`` on a small file. The table is a pure function of the
grammar, so it is built once, ahead of time, and shipped as ``parse_table.json`` next
to this module, together with the SHA-256 of the grammar it was built from. At run time
:func:`load_parser` uses it only if that hash matches the grammar being used; otherwise
the parser is built from the grammar as usual. The file is JSON (data, not code), so
loading it executes nothing.

JSON has only string keys, while lark's serialized tables use integer keys (parser
states); :func:`_encode` and :func:`_decode` keep those keys' types. Regenerate with
``python -m amm_rules.language.expr.table`` after changing the grammar; a test fails while the
shipped table is stale.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
from pathlib import Path
from typing import Any

from lark import Lark
from lark.grammar import Rule
from lark.lexer import TerminalDef

TABLE_PATH = Path(__file__).with_name("parse_table.json")
#: Bumped when the layout of the file changes, independently of lark's own format.
FORMAT = 1
_INT_KEYS = "__int_keyed__"


def grammar_text() -> str:
    """The grammar, from the installed package or else from a source checkout."""
    resource = importlib.resources.files("amm_rules") / "grammar" / "expr.lark"
    if resource.is_file():
        return resource.read_text(encoding="utf-8")
    # Source checkout or editable install: grammar/ sits next to the package.
    return (Path(__file__).resolve().parents[3] / "grammar" / "expr.lark").read_text(
        encoding="utf-8"
    )


#: Options of the shared parser; part of the prebuilt table's identity.
LARK_OPTIONS = {"parser": "lalr", "propagate_positions": True, "maybe_placeholders": False}


def build_parser(grammar: str) -> Lark:
    return Lark(grammar, **LARK_OPTIONS)


def grammar_hash(grammar: str, options: dict[str, Any]) -> str:
    text = grammar + json.dumps(options, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _encode(value: Any) -> Any:
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return {k: _encode(v) for k, v in value.items()}
        return {_INT_KEYS: [[k, _encode(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if _INT_KEYS in value:
            return {k: _decode(v) for k, v in value[_INT_KEYS]}
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def dump_table(parser: Lark, digest: str) -> str:
    data, memo = parser.memo_serialize([TerminalDef, Rule])
    payload = {"format": FORMAT, "grammar_sha256": digest, "data": data, "memo": memo}
    return json.dumps(_encode(payload), sort_keys=True, separators=(",", ":")) + "\n"


def load_parser(digest: str) -> Lark | None:
    """The parser from the shipped table, or ``None`` if it is missing, stale or
    unreadable (the caller then builds the parser from the grammar)."""
    try:
        payload = _decode(json.loads(TABLE_PATH.read_text(encoding="utf-8")))
        if payload.get("format") != FORMAT or payload.get("grammar_sha256") != digest:
            return None
        # ``Lark.load`` would read a pickle; ``_load`` accepts the same data as a dict.
        return Lark.__new__(Lark)._load({"data": payload["data"], "memo": payload["memo"]})
    except Exception:  # any problem with the table only costs the slow path
        return None


def make_parser() -> Lark:
    """The parser of the grammar: from the shipped table when it was built from this
    grammar, else built from the grammar (tens of milliseconds)."""
    grammar = grammar_text()
    return load_parser(grammar_hash(grammar, LARK_OPTIONS)) or build_parser(grammar)


def main() -> None:
    grammar = grammar_text()
    digest = grammar_hash(grammar, LARK_OPTIONS)
    TABLE_PATH.write_text(dump_table(build_parser(grammar), digest), encoding="utf-8")
    print(f"wrote {TABLE_PATH.name} for grammar {digest[:12]}")


if __name__ == "__main__":
    main()
