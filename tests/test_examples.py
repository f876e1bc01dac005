"""Every example rules file, every rules example in the docs, and the shipped JSON
Schema are checked here, so that what users copy works."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from amm_rules.cli import schema_text
from amm_rules.language.loader import check_file, check_text
from amm_rules.language.schema import SCHEMA

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples" / "rules").glob("*.yaml"))
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SCHEMA_LINE = re.compile(r"^# yaml-language-server: \$schema=(?P<path>\S+)$")
YAML_BLOCK = re.compile(r"^```ya?ml\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)


def doc_examples() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in YAML_BLOCK.finditer(text):
            if "version: 1" in m["body"]:
                line = text.count("\n", 0, m.start()) + 2
                out.append((f"{doc.name}:{line}", m["body"]))
    return out


def test_there_are_examples() -> None:
    names = {p.name for p in EXAMPLES}
    assert {
        "demo.yaml",
        "gpu-pools.yaml",
        "precious-checkpoints.yaml",
        "rebalance.yaml",
        "minimal.yaml",
    } <= names
    assert len(doc_examples()) >= 5


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_clean(path: Path) -> None:
    ruleset, diagnostics = check_file(path)
    assert [str(d) for d in diagnostics] == []
    assert ruleset is not None


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_names_the_shipped_schema(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    m = SCHEMA_LINE.match(first)
    assert m, f"{path.name} must start with the yaml-language-server schema line"
    assert (path.parent / m["path"]).resolve() == ROOT / "amm-rules.schema.json"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid_for_editors(path: Path) -> None:
    """What an editor sees: the raw schema accepts every example."""
    from jsonschema import Draft202012Validator

    errors = list(Draft202012Validator(SCHEMA).iter_errors(yaml.safe_load(path.read_text())))
    assert errors == []


@pytest.mark.parametrize(("where", "body"), doc_examples(), ids=lambda v: v if ":" in v else "")
def test_doc_example_validates(where: str, body: str) -> None:
    ruleset, diagnostics = check_text(body, where)
    assert [str(d) for d in diagnostics if d.is_error] == []
    assert ruleset is not None


def test_shipped_schema_is_current() -> None:
    """``amm-rules.schema.json`` is ``amm-rules schema``'s output (regenerate with
    ``amm-rules schema > amm-rules.schema.json``)."""
    assert (ROOT / "amm-rules.schema.json").read_text() == schema_text()


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(SCHEMA)


def test_demo_example_is_the_demo_cluster_rules() -> None:
    ruleset, _ = check_file(ROOT / "examples" / "rules" / "demo.yaml")
    assert ruleset is not None
    assert set(ruleset.pools) == {"gpu", "cpu"}
    by_name = {r.name: r.actions for r in ruleset.rules}
    assert str(by_name["precious"].replicate) == "3" and by_name["precious"].spread == "host"
    assert by_name["device-data"].pool == ("gpu",)
    assert by_name["host-data"].avoid == ("gpu",)
    assert by_name["pinned"].move == "never"
    assert ruleset.reduce_replicas is True


def test_the_readme_shows_the_recommended_file() -> None:
    """The README's recommended rules are the shipped file's, whatever its comments."""
    text = (ROOT / "README.md").read_text()
    after = text[text.index("No rules of your own yet?") :]
    shown = YAML_BLOCK.search(after)
    assert shown is not None
    recommended = ROOT / "examples" / "rules" / "recommended.yaml"
    assert yaml.safe_load(shown["body"]) == yaml.safe_load(recommended.read_text())
