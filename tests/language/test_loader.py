"""The loader's API: load_ruleset / check_* on files, text and inline mappings,
the safety limits, and what a loaded Ruleset holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from amm_rules import RulesError, load_ruleset
from amm_rules.language.fields import parse_actions
from amm_rules.language.loader import check_file, check_mapping, check_text
from amm_rules.language.ruleset import Target, TaskFacts, WorkerFacts
from amm_rules.language.scalar_positions import source_indices
from amm_rules.language.yaml_source import MAX_BYTES, read_yaml

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "rules" / "demo.yaml"


def test_load_demo_ruleset() -> None:
    ruleset = load_ruleset(DEMO)
    assert list(ruleset.pools) == ["gpu", "cpu"]
    assert [r.name for r in ruleset.rules] == [
        "precious",
        "device-data",
        "host-data",
        "pinned",
        "frames",
    ]
    precious, device, host, pinned, frames = ruleset.rules
    assert precious.actions.replicate == Target(3, 3)
    assert precious.actions.spread == "host"
    assert device.actions.pool == ("gpu",)
    assert host.actions.avoid == ("gpu",)
    assert pinned.actions.move == "never"
    assert frames.actions.replicate == Target(2, 2)
    # Whichever name pandas records for a DataFrame.
    assert frames.match(TaskFacts(key="f-1", type="pandas.core.frame.DataFrame"))
    assert frames.match(TaskFacts(key="f-1", type="pandas.DataFrame"))
    assert ruleset.reduce_replicas is True
    assert ruleset.source == str(DEMO)
    assert precious.position is not None and precious.position.line > 1
    assert precious.match(TaskFacts(key="precious-1", prefix="precious"))
    assert not precious.match(TaskFacts(key="x-1", prefix="x"))
    gpu = WorkerFacts(address="tcp://a:1", resources={"GPU": 1})
    plain = WorkerFacts(address="tcp://b:1")
    assert ruleset.pools["gpu"].predicate(gpu) and not ruleset.pools["gpu"].predicate(plain)
    assert ruleset.pools["cpu"].predicate(plain) and not ruleset.pools["cpu"].predicate(gpu)
    assert precious.depends == frozenset({"prefix"})
    assert ruleset.pools["gpu"].depends == frozenset({"resources"})


CASCADE = """
version: 1
pools:
  gpu: worker.resources.GPU >= 1
rules:
  - name: stage-one
    match: task.prefix == "stage1"
    replicate: 3
  - name: device-arrays
    match: task.type == "cupy.ndarray"
    pool: gpu
    replicate: 1
  - name: big
    match: task.nbytes > 1 GiB
    spread: host
    move: never
"""


# The worked example of docs/rules.md ("How rules combine"), row by row.
@pytest.mark.parametrize(
    ("prefix", "type_", "nbytes", "explained"),
    [
        (
            "stage1",
            "cupy.ndarray",
            10 * 2**20,
            "replicate=3 from rule stage-one, pool=gpu from rule device-arrays",
        ),
        (
            "load",
            "cupy.ndarray",
            10 * 2**20,
            "replicate=1 from rule device-arrays, pool=gpu from rule device-arrays",
        ),
        (
            "stage1",
            "numpy.ndarray",
            2 * 2**30,
            "replicate=3 from rule stage-one, spread=host from rule big, move=never from rule big",
        ),
        ("load", "numpy.ndarray", 10 * 2**20, "no rule applies"),
    ],
)
def test_cascade_explained(prefix: str, type_: str, nbytes: int, explained: str) -> None:
    assert CASCADE in (ROOT / "docs" / "rules.md").read_text()
    ruleset, diagnostics = check_text(CASCADE)
    assert ruleset is not None and diagnostics == []
    task = TaskFacts(key=f"{prefix}-1", prefix=prefix, type=type_, nbytes=nbytes)
    assert ruleset.resolve(task).explain() == explained


def test_rule_actions_mean_what_annotations_mean() -> None:
    fields = {
        "replicate": {"min": 2, "max": 4},
        "pool": ["gpu"],
        "avoid": "cpu",
        "spread": "host",
        "move": "never",
    }
    ruleset = load_ruleset(
        {
            "version": 1,
            "pools": {"gpu": "worker.resources.GPU >= 1", "cpu": "not worker.resources.GPU"},
            "rules": [{"name": "r", "match": "true", **fields}],
        }
    )
    assert ruleset.rules[0].actions == parse_actions(fields)


def test_rebalance_section() -> None:
    ruleset = load_ruleset(
        {
            "version": 1,
            "rebalance": {
                "sender-min": "25%",
                "gap": 0.05,
                "max-bytes-per-cycle": "1 GiB",
                "match": "task.nbytes < 1 MiB",
            },
        }
    )
    settings = ruleset.rebalance
    assert settings.enabled is True  # the section's presence turns it on
    assert settings.sender_min == pytest.approx(0.25)
    assert settings.recipient_max == pytest.approx(0.60)
    assert settings.gap == pytest.approx(0.05)
    assert settings.max_bytes_per_cycle == 2**30
    assert settings.match is not None and settings.match(TaskFacts(key="k", nbytes=10))
    assert load_ruleset({"version": 1}).rebalance.enabled is False
    off = load_ruleset({"version": 1, "rebalance": {"enabled": False}})
    assert off.rebalance.enabled is False


def test_rebalance_timings() -> None:
    defaults = load_ruleset({"version": 1, "rebalance": {}}).rebalance
    assert (defaults.cooldown, defaults.copy_timeout, defaults.drop_timeout) == (60, 30, 30)
    settings = load_ruleset(
        {
            "version": 1,
            "rebalance": {"cool-down": "2 min", "copy-timeout": "500ms", "drop-timeout": 45},
        }
    ).rebalance
    assert settings.cooldown == 120.0
    assert settings.copy_timeout == 0.5
    assert settings.drop_timeout == 45.0
    assert load_ruleset({"version": 1, "rebalance": {"cool-down": 0}}).rebalance.cooldown == 0
    with pytest.raises(RulesError, match="copy-timeout: must be more than 0 seconds"):
        load_ruleset({"version": 1, "rebalance": {"copy-timeout": "0s"}})


def test_load_ruleset_raises_with_every_error(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        'version: 1\nrules:\n  - name: a\n    match: task.prefx == "x"\n    replicate: 0\n'
    )
    with pytest.raises(RulesError) as info:
        load_ruleset(path)
    errors = info.value.errors
    assert [(d.line, d.column, d.code) for d in errors] == [
        (4, 17, "unknown-attribute"),
        (5, 16, "bad-value"),
    ]
    assert all(d.rule == "a" for d in errors)
    assert str(info.value).splitlines()[0].startswith(f"{path}:4:17: error: ")


def test_every_section_of_the_file_names_its_problems(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "version: 1\nspill:\n  order: mru\nprotect:\n  budget: lots\n"
        "adaptive:\n  headroom: 300%\nrebalance:\n  gap: 3\nrules: []\n"
    )
    with pytest.raises(RulesError) as info:
        load_ruleset(path)
    assert [(d.line, d.rule) for d in info.value.errors] == [
        (3, "spill"),
        (5, "protect"),
        (7, "adaptive"),
        (9, "rebalance"),
    ]
    lines = [line for line in str(info.value).splitlines() if ": error: " in line]
    assert [line.rsplit(" (in ", 1)[-1] for line in lines] == [
        "section 'spill')",
        "section 'protect')",
        "section 'adaptive')",
        "section 'rebalance')",
    ]


def test_load_ruleset_filename_and_types(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("version: 2\n")
    with pytest.raises(RulesError) as info:
        load_ruleset(path, filename="shown.yaml")
    assert info.value.errors[0].file == "shown.yaml"
    with pytest.raises(TypeError):
        load_ruleset(42)
    ruleset = load_ruleset({"version": 1})
    assert load_ruleset(ruleset) is ruleset


def test_inline_mapping_diagnostics_have_no_positions() -> None:
    ruleset, diags = check_mapping(
        {
            "version": 1,
            "rules": [
                {"name": "r", "match": "task.prefix == 1 MiB", "replicate": {"min": 0}},
            ],
        },
        filename="<dask config>",
    )
    assert ruleset is None
    assert {(d.file, d.line, d.column, d.rule) for d in diags} == {("<dask config>", 0, 0, "r")}
    assert sorted(d.code for d in diags) == ["bad-value", "type-mismatch"]
    assert any(d.message.startswith("replicate.min: ") for d in diags)


def test_inline_mapping_that_is_not_plain_data() -> None:
    ruleset, diags = check_mapping({"version": 1, 3: "x", "rules": [{"name": {1, 2}}]})
    assert ruleset is None
    messages = " | ".join(d.message for d in diags)
    assert "keys must be strings" in messages
    assert "set is not plain data" in messages
    deep: dict = {}
    node = deep
    for _ in range(100):
        node["a"] = {}
        node = node["a"]
    _, diags = check_mapping({"version": 1, "rules": deep})
    assert any(d.code == "too-deep" for d in diags)


@pytest.mark.parametrize("as_bytes", [True, False])
def test_size_limit(as_bytes: bool) -> None:
    text = "version: 1\n" + "# padding\n" * (MAX_BYTES // 10 + 1)
    ruleset, diags = check_text(text.encode() if as_bytes else text, "big.yaml")
    assert ruleset is None
    assert [(d.line, d.code) for d in diags] == [(0, "too-large")]
    assert "1 MiB" in diags[0].message


def test_size_limit_file_reads_only_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_bytes(b"version: 1\n" + b"#" * (3 * MAX_BYTES))
    ruleset, diags = check_file(path)
    assert ruleset is None and [d.code for d in diags] == ["too-large"]


def test_unreadable_sources(tmp_path: Path) -> None:
    _, missing = check_file(tmp_path / "nope.yaml")
    _, directory = check_file(tmp_path)
    assert [(d.line, d.code, d.message) for d in missing] == [(0, "unreadable", "no such file")]
    assert "directory" in directory[0].message


def test_check_text_accepts_text_and_bytes() -> None:
    text = 'version: 1\nrules:\n  - name: é\n    match: task.key == "é"\n    replicate: 2\n'
    for content in (text, text.encode(), "\ufeff" + text):
        ruleset, diags = check_text(content)
        assert diags == [] and ruleset is not None and ruleset.rules[0].name == "é"


def test_constructing_tags_never_construct(tmp_path: Path) -> None:
    marker = tmp_path / "constructed"
    text = f'version: 1\nx: !!python/object/apply:os.system ["touch {marker}"]\n'
    _, diags = check_text(text)
    assert not marker.exists()
    assert "yaml-tag" in {d.code for d in diags}


# Every scalar style maps each value character back to where it was written.
@pytest.mark.parametrize("style", [None, "'", '"', "|", ">"])
@pytest.mark.parametrize(
    "value",
    [
        'task.prefix == "a" and task.nbytes > 3 MiB',
        "task.key == 'it''s'",
        "first line\n  indented line\nlast line",
    ],
)
def test_scalar_source_indices(style: str | None, value: str) -> None:
    text = yaml.safe_dump({"match": value}, default_style=style, width=30)
    source, problems = read_yaml(text)
    assert source is not None and not problems
    node = source.values[("match",)]
    assert node.value == value
    indices = source_indices(text, node)
    assert indices is not None, (style, text)
    assert len(indices) == len(value)
    for char, index in zip(value, indices, strict=True):
        if char not in "\n \\\"'":  # written literally (not escaped, folded or doubled)
            assert text[index] == char


def test_import_and_validate_do_not_import_distributed() -> None:
    code = (
        "import sys\n"
        "import amm_rules\n"
        "from amm_rules.cli import main\n"
        "try:\n"
        f"    main(['validate', {str(DEMO)!r}, '--format', 'json'])\n"
        "except SystemExit as exc:\n"
        "    status = exc.code\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'distributed')\n"
        "assert not loaded, loaded\n"
        "sys.stderr.write(f'status={status}')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.endswith("status=0")
