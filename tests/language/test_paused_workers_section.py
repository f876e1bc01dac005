"""The ``paused-workers`` section of a rules file: its field names and defaults are a
public contract (docs/rules.md, the JSON Schema), and its values mean the same written
in any of their forms. Wrong values are in ``tests/cases/invalid/paused-workers-*.yaml``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from amm_rules.language.loader import check_text, load_ruleset
from amm_rules.language.ruleset import PausedWorkersSettings
from amm_rules.language.schema import SCHEMA

DOCS = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
FIELDS = {
    "after": ("after", 300.0),
    "action": ("action", "restart"),
    "require-unmanaged": ("require_unmanaged", 0.5),
    "max-concurrent": ("max_concurrent", 1),
    "max-paused-fraction": ("max_paused_fraction", 0.25),
    "cool-down": ("cooldown", 900.0),
    "max-bytes-per-cycle": ("max_bytes_per_cycle", 512 * 2**20),
}


def test_no_section_means_nothing_is_done_and_an_empty_one_every_default():
    assert load_ruleset({"version": 1}).paused_workers is None
    settings = load_ruleset({"version": 1, "paused-workers": {}}).paused_workers
    assert settings == PausedWorkersSettings()
    assert {name: getattr(settings, attr) for name, (attr, _) in FIELDS.items()} == {
        name: default for name, (_, default) in FIELDS.items()
    }


def test_the_schema_and_the_docs_know_every_field_and_its_default():
    properties = SCHEMA["$defs"]["pausedWorkers"]["properties"]
    assert list(properties) == list(FIELDS)
    shown = {"after": "5m", "require-unmanaged": "50%", "max-paused-fraction": "25%"}
    shown |= {"cool-down": "15m", "max-bytes-per-cycle": "512 MiB"}
    for name, (_, default) in FIELDS.items():
        assert properties[name]["default"] == shown.get(name, default)
    section = DOCS.read_text().split("## Paused workers", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| [^|]+ \| `([^`]+)` \|", section, re.MULTILINE))
    assert rows == {name: str(shown.get(name, default)) for name, (_, default) in FIELDS.items()}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("after: 90s", {"after": 90.0}),
        ("after: 1.5 min", {"after": 90.0}),
        ("after: 90", {"after": 90.0}),
        ("cool-down: 0", {"cooldown": 0.0}),
        ("cool-down: 1h", {"cooldown": 3600.0}),
        ("require-unmanaged: 0.6", {"require_unmanaged": 0.6}),
        ("require-unmanaged: 60%", {"require_unmanaged": 0.6}),
        ("max-paused-fraction: 12.5%", {"max_paused_fraction": 0.125}),
        ("max-concurrent: 3", {"max_concurrent": 3}),
        ("action: report", {"action": "report"}),
        ("action: retire", {"action": "retire"}),
        ("max-bytes-per-cycle: 2 GiB", {"max_bytes_per_cycle": 2 * 2**30}),
        ("max-bytes-per-cycle: 1000", {"max_bytes_per_cycle": 1000}),
    ],
)
def test_values_in_their_forms(text: str, expected: dict):
    ruleset, diagnostics = check_text(f"version: 1\npaused-workers:\n  {text}\n", "rules.yaml")
    assert [str(d) for d in diagnostics] == []
    assert ruleset is not None and ruleset.paused_workers is not None
    for attr, value in expected.items():
        assert getattr(ruleset.paused_workers, attr) == pytest.approx(value)


def test_an_inline_mapping_from_the_dask_config_reads_the_same():
    inline = {"version": 1, "paused-workers": {"after": "2m", "max-concurrent": 2}}
    settings = load_ruleset(inline).paused_workers
    assert settings is not None and (settings.after, settings.max_concurrent) == (120.0, 2)
