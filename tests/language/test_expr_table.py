"""The prebuilt parse table matches the grammar and parses exactly like a fresh parser."""

from __future__ import annotations

import json

import pytest

from amm_rules.language.expr import table

EXPRESSIONS = [
    'task.prefix == "a" and task.nbytes > 5 MiB or not (task.key matches "x*")',
    'worker.resources["gpu-a100"] >= 1 and worker.memory_fraction < 30%',
    "task.type in ['numpy.ndarray', \"cupy.ndarray\"] and task.annotations.tier != 2",
    "not not true",
]


def test_shipped_table_is_current():
    grammar = table.grammar_text()
    digest = table.grammar_hash(grammar, table.LARK_OPTIONS)
    assert table.load_parser(digest) is not None, (
        "amm_rules/language/expr/parse_table.json is stale: run `python -m amm_rules.language.expr.table`"
    )


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_table_parser_equals_built_parser(text):
    digest = table.grammar_hash(table.grammar_text(), table.LARK_OPTIONS)
    loaded = table.load_parser(digest)
    built = table.build_parser(table.grammar_text())
    assert loaded.parse(text) == built.parse(text)


def test_stale_or_broken_table_falls_back(tmp_path, monkeypatch):
    assert table.load_parser("0" * 64) is None  # another grammar
    broken = tmp_path / "parse_table.json"
    broken.write_text("{not json", encoding="utf-8")
    monkeypatch.setattr(table, "TABLE_PATH", broken)
    digest = table.grammar_hash(table.grammar_text(), table.LARK_OPTIONS)
    assert table.load_parser(digest) is None


def test_int_keys_survive_json_round_trip():
    value = {"states": {0: {"a": (1, 2)}, 7: {}}, "plain": ["x", {"k": 3}]}
    decoded = table._decode(json.loads(json.dumps(table._encode(value))))
    assert decoded == {"states": {0: {"a": [1, 2]}, 7: {}}, "plain": ["x", {"k": 3}]}
