"""The ``memory-pressure`` section of a rules file: its field names and defaults are a
public contract (docs/rules.md, the JSON Schema), its values mean the same written in any
of their forms, and its ``producers`` expression reads only what a whole prefix shares.
Wrong values are in ``tests/cases/invalid/memory-pressure-*.yaml``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amm_rules.language.loader import check_text, load_ruleset
from amm_rules.language.ruleset import DEFAULT_PRODUCERS, MemoryPressureSettings, TaskFacts
from amm_rules.language.schema import SCHEMA

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
FIELDS = {
    "enabled": ("enabled", True),
    "measure": ("measure", "process"),
    "threshold": ("threshold", 0.6),
    "require-transfers": ("require_transfers", True),
    "release": ("release", 0.5),
    "saturation": ("saturation", 0.5),
    "producers": ("producers_source", DEFAULT_PRODUCERS),
    "check-interval": ("check_interval", 0.5),
    "min-hold": ("min_hold", 2.0),
    "max-hold": ("max_hold", 60.0),
    "cool-down": ("cooldown", 30.0),
}
#: How the schema and the docs write the defaults that are not plain values.
SHOWN = {
    "threshold": "60%",
    "release": "50%",
    "check-interval": "500ms",
    "min-hold": "2s",
    "max-hold": "60s",
    "cool-down": "30s",
}


def test_no_section_means_nothing_is_held_and_an_empty_one_every_default():
    assert load_ruleset({"version": 1}).memory_pressure is None
    settings = load_ruleset({"version": 1, "memory-pressure": {}}).memory_pressure
    assert settings is not None
    assert {name: getattr(settings, attr) for name, (attr, _) in FIELDS.items()} == {
        name: default for name, (_, default) in FIELDS.items()
    }
    defaults = MemoryPressureSettings()
    assert {name: getattr(defaults, attr) for name, (attr, _) in FIELDS.items()} == {
        name: default for name, (_, default) in FIELDS.items()
    }


def test_the_schema_and_the_docs_know_every_field_and_its_default():
    properties = SCHEMA["$defs"]["memoryPressure"]["properties"]
    assert list(properties) == list(FIELDS)
    for name, (_, default) in FIELDS.items():
        assert properties[name]["default"] == SHOWN.get(name, default)
    section = DOCS.read_text().split("## Memory pressure", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| [^|]+ \| `([^`]+)` \|", section, re.MULTILINE))
    shown = {name: str(SHOWN.get(name, default)) for name, (_, default) in FIELDS.items()}
    shown["enabled"] = shown["require-transfers"] = "true"
    assert rows == shown


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("threshold: 0.7", {"threshold": 0.7}),
        ("threshold: 70%\n  release: 65%", {"threshold": 0.7, "release": 0.65}),
        ("release: 0.1", {"release": 0.1}),
        ("saturation: 1", {"saturation": 1.0}),
        ("saturation: 0.25", {"saturation": 0.25}),
        ("measure: managed", {"measure": "managed"}),
        ("require-transfers: false", {"require_transfers": False}),
        ("enabled: false", {"enabled": False}),
        ("check-interval: 2s", {"check_interval": 2.0}),
        ("check-interval: 250ms", {"check_interval": 0.25}),
        ("min-hold: 0", {"min_hold": 0.0}),
        ("max-hold: 5 min", {"max_hold": 300.0}),
        ("cool-down: 0", {"cooldown": 0.0}),
    ],
)
def test_values_in_their_forms(text: str, expected: dict):
    ruleset, diagnostics = check_text(f"version: 1\nmemory-pressure:\n  {text}\n", "rules.yaml")
    assert [str(d) for d in diagnostics] == []
    assert ruleset is not None and ruleset.memory_pressure is not None
    for attr, value in expected.items():
        assert getattr(ruleset.memory_pressure, attr) == pytest.approx(value)


def facts(prefix: str, net: float | None = None, tasks: int | None = None) -> TaskFacts:
    return TaskFacts(key="", prefix=prefix, prefix_net_per_task=net, prefix_tasks=tasks)


def test_the_default_producers_are_kinds_that_add_memory_and_kinds_not_measured_yet():
    producers = load_ruleset({"version": 1, "memory-pressure": {}}).memory_pressure.producers
    assert producers is not None
    assert producers(facts("read", 8e6, 10))
    assert producers(facts("new"))  # not measured yet
    assert not producers(facts("sum", -8e6, 10))
    assert not producers(facts("noop", 0.0, 10))


def test_producers_may_name_prefixes():
    text = 'memory-pressure:\n  producers: task.prefix in ["read_parquet", "random_sample"]\n'
    ruleset, diagnostics = check_text(f"version: 1\n{text}", "rules.yaml")
    assert [str(d) for d in diagnostics] == []
    producers = ruleset.memory_pressure.producers
    assert producers(facts("read_parquet")) and not producers(facts("sum"))


def test_an_inline_mapping_from_the_dask_config_reads_the_same():
    inline = {"version": 1, "memory-pressure": {"threshold": "70%", "max-hold": "2m"}}
    settings = load_ruleset(inline).memory_pressure
    assert settings is not None and (settings.threshold, settings.max_hold) == (0.7, 120.0)
