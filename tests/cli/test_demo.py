"""``amm-rules demo``, end to end: a real local cluster obeying the demo rules."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from amm_rules import demo
from amm_rules.cli import main as cli
from tests.support.rulesets import PANDAS_FRAME

REPO = Path(__file__).resolve().parents[2]


def run_demo(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["demo", *args], catch_exceptions=False)
    return result.exit_code, result.output


def table_row(output: str, section: str, rule: str) -> list[str]:
    """The cells of ``rule``'s row in the per-rule table following ``section``."""
    text = output.split(section, 1)[1]
    for line in text.splitlines():
        if line.startswith(rule + " "):
            return re.split(r"\s{2,}", line.strip())
    raise AssertionError(f"no row for {rule!r} after {section!r} in:\n{output}")


def test_demo_meets_every_target():
    code, output = run_demo()
    assert code == 0, output
    assert "Every target is met." in output
    for rule in ("precious", "device-data", "host-data", "pinned", "frames"):
        table_row(output, "Before", rule)
        table_row(output, "After", rule)
    # Before: precious keys have one copy each and device/host data sit on the wrong
    # workers; after: three copies, and every placement is right.
    assert table_row(output, "Before", "precious")[-3:] == ["1", "0/3", "3/3"]
    assert table_row(output, "After", "precious")[-3:] == ["3", "3/3", "3/3"]
    assert table_row(output, "Before", "device-data")[-1] == "0/4"
    assert table_row(output, "After", "device-data")[-1] == "4/4"
    assert table_row(output, "After", "host-data")[-1] == "4/4"
    # Broadcast scratch data, which no rule targets, is trimmed back to one copy...
    assert table_row(output, "Before", "(no rule)")[-4:] == ["3", "4", "0/3", "3/3"]
    assert table_row(output, "After", "(no rule)")[-3:] == ["1", "3/3", "3/3"]
    # ... while the keys of the `move: never` rule keep their two copies.
    assert table_row(output, "Before", "pinned")[-4:] == ["2", "2", "2/2", "2/2"]
    assert table_row(output, "After", "pinned")[-4:] == ["2", "2", "2/2", "2/2"]
    assert "move: never (rule pinned): 2/2 keys kept the 2 copies they were given" in output
    # DataFrames made with the installed pandas, matched by their type.
    assert f"rule frames: 3 keys frames-N, {PANDAS_FRAME} of" in output
    assert table_row(output, "After", "frames")[-3:] == ["2", "3/3", "3/3"]
    # The engine's own explanation of one key.
    explained = output.split("Why is precious-0 where it is? amm_rules.explain answers:", 1)[1]
    assert "  desired: replicate=3 from rule precious, spread=host from rule precious" in explained
    assert len(re.findall(r"^  \S+: holds a copy$", explained, re.M)) == 3
    # The per-worker table names every worker and its pool.
    after = output.split("After", 1)[1]
    assert re.search(r"^gpu-0\s+\S+\s+gpu\s", after, re.M)
    assert re.search(r"^cpu-3\s+\S+\s+cpu\s", after, re.M)
    # With its own rules, the demo ends by suggesting the recommended file.
    recommended = REPO / "examples" / "rules" / "recommended.yaml"
    assert output.rstrip().endswith(f"  amm-rules demo --rules {recommended}")
    assert "No rules of your own yet? The recommended file" in output


def test_demo_workload_follows_another_rules_file(tmp_path):
    """Keys for each rule of the file (prefixes, key globs, annotations), placed where
    the rule does not want them; a rule the demo cannot make a key for is named."""
    rules = tmp_path / "mine.yaml"
    rules.write_text(
        "version: 1\n"
        "pools:\n"
        "  gpu: worker.resources.GPU >= 1\n"
        "rules:\n"
        "  - name: two-features\n"
        '    match: task.prefix == "features"\n'
        "    replicate: 2\n"
        "  - name: gold-on-gpu\n"
        '    match: task.annotations.tier == "gold"\n'
        "    pool: gpu\n"
        "  - name: temporary\n"
        '    match: task.key matches "tmp-*"\n'
        "    move: never\n"
        "  - name: device\n"
        '    match: task.type == "cupy.ndarray"\n'
        "    pool: gpu\n"
    )
    code, output = run_demo("--rules", str(rules))
    assert code == 0, output
    assert "rule gold-on-gpu: 4 keys " in output and "annotated {'tier': 'gold'}" in output
    assert "rules the demo makes no key for: device." in output
    assert table_row(output, "Before", "two-features")[-3:] == ["1", "0/3", "3/3"]
    assert table_row(output, "After", "two-features")[-3:] == ["2", "3/3", "3/3"]
    assert table_row(output, "Before", "gold-on-gpu")[-1] == "0/4"
    assert table_row(output, "After", "gold-on-gpu")[-1] == "4/4"
    assert table_row(output, "After", "temporary")[-4:] == ["2", "2", "2/2", "2/2"]
    assert "move: never (rule temporary): 2/2 keys kept the 2 copies" in output
    assert "  desired: replicate=2 from rule two-features" in output


def test_demo_refuses_an_invalid_rules_file(tmp_path):
    rules = tmp_path / "broken.yaml"
    rules.write_text(
        "version: 1\nrules:\n  - name: x\n    match: task.prefx == 1\n    replicate: 2\n"
    )
    code, output = run_demo("--rules", str(rules))
    assert code == 1
    assert f"{rules}:4:" in output


def test_demo_rules_default_to_the_examples_file():
    assert demo.default_rules_path() == REPO / "examples" / "rules" / "demo.yaml"
    assert demo.recommended_rules_path() == REPO / "examples" / "rules" / "recommended.yaml"


def test_the_suggestion_names_the_sections_the_recommended_file_turns_on(tmp_path):
    rules = tmp_path / "r.yaml"
    rules.write_text("version: 1\nrebalance: {}\nmemory-pressure: {}\n")
    lines = demo.suggestion(rules)
    assert "(rebalance, memory-pressure)" in lines[1] and str(rules) in lines[1]
    assert lines[-1] == f"  amm-rules demo --rules {rules}"
    assert demo.suggestion(tmp_path / "missing.yaml") == []


def test_demo_reports_a_target_it_cannot_meet(tmp_path):
    # Two GPU workers cannot hold three copies: the demo stops once nothing more can be
    # done, exits 1, and shows the engine's own explanation.
    rules = tmp_path / "too-many.yaml"
    rules.write_text(
        "version: 1\n"
        "pools:\n"
        "  gpu: worker.resources.GPU >= 1\n"
        "rules:\n"
        "  - name: too-many\n"
        '    match: task.prefix == "device"\n'
        "    replicate: 3\n"
        "    pool: gpu\n"
    )
    code, output = run_demo("--rules", str(rules))
    assert code == 1
    assert table_row(output, "After", "too-many")[-3:] == ["2", "0/4", "4/4"]
    assert "Some targets are not met" in output
    assert re.search(
        r"^  device-0: on 2 workers, wants replicate=3 from rule too-many", output, re.M
    )
    assert "  unmet: " in output  # in the explain answer too


def test_demo_without_pandas_says_pandas_is_not_installed():
    """After ``pip install .`` without pandas, the shipped ``frames`` rule gets no key:
    the demo says pandas is the cause, not "a match on other types". pandas is made
    unimportable in the demo's own process (a None in sys.modules), not uninstalled."""
    run = (
        "import sys; sys.modules['pandas'] = None\n"
        "from amm_rules.cli import main\n"
        "main(['demo'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", run],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert (
        "rule frames: no key: pandas is not installed, and its keys would be "
        "pandas.DataFrame (pip install pandas)" in output
    )
    assert "rules the demo makes no key for" not in output  # nothing else is blamed
    assert "Every target is met." in output
