"""What the docs state is what the code does: the rebalance defaults in both tables, the
text reporter's output as docs/rules.md shows it, and the README's headline rules on
the chunks of a persisted collection (whose keys are tuples)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import dask.array as da
import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from distributed.utils_test import gen_cluster

from amm_rules.cli import main
from amm_rules.language.expr import compile_expression
from amm_rules.language.fields import parse_duration, parse_fraction, parse_rate, parse_size
from amm_rules.language.loader import check_text
from amm_rules.language.ruleset import TaskFacts
from amm_rules.language.schema import SCHEMA
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, counts

ROOT = Path(__file__).resolve().parent
DOCS = ROOT.parent / "docs"
README = ROOT.parent / "README.md"

#: Rebalance field -> (attribute of RebalanceSettings, how its documented default reads).
REBALANCE_FIELDS = {
    "enabled": ("enabled", lambda text: {"true": True, "false": False}[text]),
    "measure": ("measure", str),
    "sender-min": ("sender_min", parse_fraction),
    "recipient-max": ("recipient_max", parse_fraction),
    "gap": ("gap", parse_fraction),
    "max-bytes-per-cycle": ("max_bytes_per_cycle", parse_size),
    "cool-down": ("cooldown", parse_duration),
    "copy-timeout": ("copy_timeout", parse_duration),
    "drop-timeout": ("drop_timeout", parse_duration),
}


def table_defaults(
    text: str, heading: str, fields: dict[str, Any] = REBALANCE_FIELDS
) -> dict[str, str]:
    """Field -> its Default cell, from the first table after ``heading`` that has a
    field and a default column. The first `code` span of the cell is the default."""
    lines = text[text.index(heading) :].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break  # the table ends
        rows.append(line)
    header = [c.strip().lower() for c in rows[0].strip("|").split("|")]
    column = header.index("default")
    out = {}
    for row in rows[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        name = cells[0].strip("`")
        if name in fields:
            m = re.search(r"`([^`]*)`", cells[column])
            out[name] = m.group(1) if m else cells[column]
    return out


@pytest.mark.parametrize(
    ("doc", "heading"), [("rebalance.md", "## The fields"), ("rules.md", "## Rebalance")]
)
def test_documented_rebalance_defaults_are_the_code_defaults(doc: str, heading: str) -> None:
    documented = table_defaults((DOCS / doc).read_text(), heading)
    assert set(documented) == set(REBALANCE_FIELDS) - {"match"}
    # The defaults of a section that is written, with no field set.
    ruleset, diagnostics = check_text("version: 1\nrebalance: {}\n")
    assert ruleset is not None and not diagnostics
    for name, text in documented.items():
        attribute, read = REBALANCE_FIELDS[name]
        assert read(text) == getattr(ruleset.rebalance, attribute), (doc, name, text)
    # Without the section there is no rebalancing, as both pages say.
    ruleset, _ = check_text("version: 1\n")
    assert ruleset is not None and ruleset.rebalance.enabled is False
    # The schema (what an editor shows) says the same.
    rebalance = SCHEMA["$defs"]["rebalance"]["properties"]
    assert rebalance["enabled"]["default"] is True


#: Adaptive field -> (attribute of AdaptiveSettings, how its documented default reads).
ADAPTIVE_FIELDS = {
    "memory": ("memory", lambda text: {"true": True, "false": False}[text]),
    "headroom": ("headroom", parse_fraction),
    "hold-rules": ("hold_rules", lambda text: {"true": True, "false": False}[text]),
    "disk-rate": ("disk_rate", parse_rate),
    "balance": ("balance", lambda text: {"true": True, "false": False}[text]),
}


@pytest.mark.parametrize(
    ("doc", "heading"), [("adaptive.md", "## The fields"), ("rules.md", "## Adaptive")]
)
def test_documented_adaptive_defaults_are_the_code_defaults(doc: str, heading: str) -> None:
    documented = table_defaults((DOCS / doc).read_text(), heading, ADAPTIVE_FIELDS)
    assert set(documented) == set(ADAPTIVE_FIELDS)
    ruleset, diagnostics = check_text("version: 1\nadaptive: {}\n")
    assert ruleset is not None and ruleset.adaptive is not None and not diagnostics
    for name, text in documented.items():
        attribute, read = ADAPTIVE_FIELDS[name]
        assert read(text) == getattr(ruleset.adaptive, attribute), (doc, name, text)
    properties = SCHEMA["$defs"]["adaptive"]["properties"]
    shown = {True: "true", False: "false"}
    assert {n: shown.get(p["default"], p["default"]) for n, p in properties.items()} == documented
    ruleset, _ = check_text("version: 1\n")
    assert ruleset is not None and ruleset.adaptive is None  # off unless written


def test_rebalance_page_does_not_say_off_unless_enabled() -> None:
    text = (DOCS / "rebalance.md").read_text()
    assert "Writing the `rebalance` section turns rebalancing on" in text
    assert "off unless" not in text


def test_text_format_as_docs_show_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first problem of docs/rules.md's text-format example, as the tool prints it:
    the caret underlines the whole misspelt attribute."""
    text = (DOCS / "rules.md").read_text()
    block = text[text.index("### `--format text`") :]
    block = block[block.index("```console\n") + len("```console\n") :]
    shown = block.splitlines()[1:4]  # after the command line
    monkeypatch.chdir(tmp_path)
    Path("rules.yaml").write_text(
        "version: 1\npools:\n  gpu: worker.resources.GPU >= 1\nrules:\n"
        '  - name: stage-one\n    match: task.prefx == "stage1"\n    replicate: 3\n'
    )
    result = CliRunner().invoke(main, ["validate", "rules.yaml"], catch_exceptions=False)
    assert result.output.splitlines()[:3] == shown
    assert shown[2].strip() == "^~~~~"


def test_pool_names_are_ascii_as_documented() -> None:
    assert "ASCII letters" in (DOCS / "rules.md").read_text()
    for name, ok in (("gpu_a100-80g", True), ("café", False), ("日本", False)):
        ruleset, diagnostics = check_text(
            f"version: 1\npools:\n  {name}: worker.nthreads > 1\n", "pools.yaml"
        )
        assert (ruleset is not None) is ok, name
        if not ok:
            assert "ASCII letters" in diagnostics[0].message


def readme_rules() -> dict:
    text = README.read_text()
    m = re.search(r"^```yaml\n(?P<body>.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert m is not None and "version: 1" in m["body"]
    return yaml.safe_load(m["body"])


def test_readme_headline_rule_matches_chunks_where_key_globs_do_not() -> None:
    (precious,) = [r for r in readme_rules()["rules"] if r["name"] == "precious"]
    match = compile_expression(precious["match"], "task").predicate
    old = compile_expression('task.key matches "checkpoint-*"', "task").predicate
    from dask.utils import key_split

    for key in (("checkpoint-1a2b3c4d", 0), ("stage1-5e6f7a8b", 3), "checkpoint-7"):
        group = key[0] if isinstance(key, tuple) else key
        facts = TaskFacts(key=str(key), prefix=key_split(key), group=group)
        assert match(facts), key
        assert old(facts) is isinstance(key, str)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(readme_rules()))
async def test_readme_headline_rules_hold_a_persisted_collection(c, s, *workers):
    x = da.from_array(np.arange(6), chunks=2, name="checkpoint-1a2b3c4d5e6f")
    x = c.persist(x)
    await x
    keys = [("checkpoint-1a2b3c4d5e6f", i) for i in range(3)]
    assert all(k in s.tasks for k in keys)
    await wait_for(lambda: counts(s, keys) == [3] * 3, "every chunk at the rule's 3 copies")
