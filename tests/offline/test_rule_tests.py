"""``amm-rules test``: the shipped example tests pass and cover every example rules file;
failures say what differed and where; every problem in a test file has a position; the
test files' JSON Schema is shipped and current."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from amm_rules.cli import main, rule_test_schema_text
from amm_rules.offline.casefile import TEST_SCHEMA

ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "examples" / "rules").glob("*.yaml"))
TESTS = sorted((ROOT / "examples" / "tests").glob("*_test.yaml"))


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_the_example_tests_pass_and_cover_every_example_rules_file() -> None:
    status, output = run(
        "test", str(ROOT / "examples" / "tests"), "--coverage", "--format", "json"
    )
    assert status == 0, output
    report = json.loads(output)
    assert report["summary"]["failed"] == 0 and report["summary"]["files_with_errors"] == 0
    assert report["summary"]["cases"] >= 2 * len(RULES)
    tested = {Path(f["rules"]).resolve() for f in report["files"]}
    assert tested == {p.resolve() for p in RULES}
    for name, missing in report["coverage"].items():
        assert missing == {"rules_not_exercised": [], "pools_not_exercised": []}, name


@pytest.mark.parametrize("path", TESTS, ids=lambda p: p.name)
def test_example_tests_name_the_shipped_schema_and_validate(path: Path) -> None:
    from jsonschema import Draft202012Validator

    first = path.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../../amm-rules-test.schema.json"
    assert (
        list(Draft202012Validator(TEST_SCHEMA).iter_errors(yaml.safe_load(path.read_text()))) == []
    )


def doc_test_files() -> list[tuple[str, str]]:
    """Test files in the docs: YAML blocks with ``cases:``."""
    import re

    out = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for m in re.finditer(r"^```ya?ml\n(?P<body>.*?)^```", text, re.MULTILINE | re.DOTALL):
            if "\ncases:" in m["body"]:
                out.append((f"{doc.name}:{text.count(chr(10), 0, m.start()) + 2}", m["body"]))
    return out


@pytest.mark.parametrize(("where", "body"), doc_test_files(), ids=lambda v: v if ":" in v else "")
def test_doc_test_files_pass(
    where: str, body: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every test file shown in the docs runs, against the example rules, and passes
    (from the root of a repository holding ``rules/`` and ``tests/``, as the docs do)."""
    import shutil

    (tmp_path / "pyproject.toml").write_text("")  # the repository's root
    shutil.copytree(ROOT / "examples" / "rules", tmp_path / "rules")
    (tmp_path / "tests").mkdir()
    path = tmp_path / "tests" / "doc_test.yaml"
    path.write_text(body)
    monkeypatch.chdir(tmp_path)
    status, output = run("test", "tests/doc_test.yaml")
    assert status == 0, output
    assert "FAIL" not in output


@pytest.mark.parametrize("where", ["elsewhere", "tests", "examples"])
def test_rules_paths_are_bounded_by_the_tree_not_the_working_directory(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The project's own examples/tests (``rules: ../rules/x.yaml``) run from any
    directory: their tree is the repository's (it holds pyproject.toml), whatever the
    working directory is; a file named alone works as well as its directory."""
    cwd = {
        "elsewhere": tmp_path,
        "tests": ROOT / "examples" / "tests",
        "examples": ROOT / "examples",
    }
    monkeypatch.chdir(cwd[where])
    status, output = run("test", str(ROOT / "examples" / "tests"))
    assert status == 0, output
    assert "outside" not in output
    status, output = run("test", str(ROOT / "examples" / "tests" / "demo_test.yaml"))
    assert status == 0, output


def test_without_a_marker_the_tree_is_the_files_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No .git or pyproject.toml above: ``../rules`` is outside, unless the directory
    holding both is given or --allow-outside; a marker makes it one tree."""
    import shutil

    shutil.copytree(ROOT / "examples" / "rules", tmp_path / "rules")
    shutil.copytree(ROOT / "examples" / "tests", tmp_path / "tests")
    monkeypatch.chdir(tmp_path)
    test = "tests/minimal_test.yaml"
    status, output = run("test", test)
    assert status == 1 and "is outside the tree this test file belongs to" in output, output
    assert run("test", test, "--allow-outside")[0] == 0
    assert run("test", ".")[0] == 0  # the directory given holds rules/ and tests/
    (tmp_path / ".git").mkdir()
    assert run("test", test)[0] == 0


def test_the_docs_show_test_files() -> None:
    assert len(doc_test_files()) >= 1


def test_shipped_schema_is_current_and_valid() -> None:
    from jsonschema import Draft202012Validator

    Draft202012Validator.check_schema(TEST_SCHEMA)
    assert (ROOT / "amm-rules-test.schema.json").read_text() == rule_test_schema_text()
    status, output = run("test", "--schema")
    assert status == 0 and json.loads(output) == TEST_SCHEMA


def test_a_broken_rule_fails_its_example_test(tmp_path: Path) -> None:
    """The example tests can fail: the same tests against a changed rules file."""
    rules = (ROOT / "examples" / "rules" / "precious-checkpoints.yaml").read_text()
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "precious-checkpoints.yaml").write_text(
        rules.replace("replicate: {min: 2, max: 4}", "replicate: {min: 2, max: 5}").replace(
            "avoid: preemptible\n", ""
        )
    )
    (tmp_path / "tests").mkdir()
    test = tmp_path / "tests" / "precious-checkpoints_test.yaml"
    test.write_text((ROOT / "examples" / "tests" / "precious-checkpoints_test.yaml").read_text())
    status, output = run("test", str(tmp_path))
    assert status == 1
    assert "FAIL  extra copies are trimmed to four, the preemptible one first" in output
    assert (
        f"{test}:21:17: key 'checkpoint-1': target: expected {{min: 2, max: 4}}, got {{min: 2, max: 5}}"
        in output
    )
    assert (
        f"{test}:23:45: key 'checkpoint-1': avoid decided by: expected 'checkpoints', got nothing"
        in output
    )
    assert f"{test}:41:37: key 'checkpoint-2': copies: expected 4, got 5" in output


RULES_TEXT = """\
version: 1
pools:
  gpu: worker.resources.GPU >= 1
  spare: worker.name matches "spare-*"
rules:
  - name: keep-three
    match: task.prefix == "x"
    replicate: 3
  - name: on-gpu
    match: task.prefix == "dev"
    pool: gpu
  - name: unused
    match: task.prefix == "never"
    replicate: 2
"""

FAILING = """\
rules: rules.yaml
workers:
  - {name: a, host: h1, resources: {GPU: 1}}
  - {name: b, host: h2}
cases:
  - name: right
    keys:
      - {key: x-1, holders: [a]}
    expect:
      - {key: x-1, target: 3, rule: keep-three, copies: 2, unmet: wants 3 copies}
  - name: wrong
    keys:
      - {key: x-2, holders: [a]}
      - {key: dev-0, holders: [b]}
    expect:
      - {key: x-2, copies: 3, rule: on-gpu, copies-on-distinct-hosts: false}
      - {key: dev-0, holders: [b], in-pool: gpu}
    expect-actions:
      - {op: drop, key: x-2, worker: a}
    expect-pools: {gpu: [a, b]}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "rules.yaml").write_text(RULES_TEXT)
    return tmp_path


def test_pass_and_fail_with_what_differed_and_where(project: Path) -> None:
    path = project / "cases_test.yaml"
    path.write_text(FAILING)
    status, output = run("test", str(path))
    assert status == 1
    lines = output.splitlines()
    assert lines[0] == f"{path} (rules: {project / 'rules.yaml'})"
    assert lines[1] == "  PASS  right"
    assert lines[2] == "  FAIL  wrong"
    named = (
        "(named from the key by dask's key_split, as the scheduler names them; set "
        "'prefix:' and 'group:' on the key to change them), no type, no resources"
    )
    assert lines[3:] == [
        f"        {path}:16:28: key 'x-2': copies: expected 3, got 2",
        f"        {path}:16:37: key 'x-2': rule: expected 'on-gpu', got 'keep-three'",
        f"        {path}:16:71: key 'x-2': copies-on-distinct-hosts: expected false, got true (hosts: h1, h2)",
        f"        {path}:13:9: key 'x-2' is seen as prefix 'x' and group 'x' {named}",
        f"        {path}:17:31: key 'dev-0': holders: expected ['b'], got ['a']",
        f"        {path}:14:9: key 'dev-0' is seen as prefix 'dev' and group 'dev' {named}",
        f"        {path}:18:5: actions: missing: drop x-2 on a, unexpected: replicate x-2 on b (keep-three); replicate dev-0 on a (on-gpu); drop dev-0 on b (on-gpu)",
        f"        {path}:20:25: pool 'gpu': expected workers ['a', 'b'], got ['a']",
        "1 file, 2 cases: 1 passed, 1 failed",
    ]
    status, output = run("test", str(path), "--coverage")
    assert output.splitlines()[-3:] == [
        f"coverage of {project / 'rules.yaml'}: 2 of 3 rules, 1 of 2 pools exercised",
        "  not exercised: rule 'unused'",
        "  not exercised: pool 'spare'",
    ]
    status, output = run("test", str(path), "--format", "json")
    report = json.loads(output)
    assert status == 1
    (entry,) = report["files"]
    assert [c["passed"] for c in entry["cases"]] == [True, False]
    assert entry["cases"][1]["line"] == 11
    assert len(entry["cases"][1]["failures"]) == 8


def readme_rules() -> str:
    """The README's first rules file (its GPU rule reads task.resources.GPU)."""
    import re

    text = (ROOT / "README.md").read_text()
    body = re.search(r"^```yaml\n(?P<body>.*?)^```", text, re.MULTILINE | re.DOTALL)
    assert body is not None and "task.resources.GPU" in body["body"]
    return body["body"]


GPU_CASES = """\
rules: rules.yaml
workers:
  - {name: gpu-0, host: h1, resources: {GPU: 1}}
  - {name: cpu-0, host: h2}
cases:
  - name: a result of a task that asked for a GPU goes to the GPU worker
    keys:
      - {key: embed-0, resources: {GPU: 1}, holders: [cpu-0]}
      - {key: embed-1, resources: {GPU: 0}, holders: [cpu-0]}
    expect:
      - {key: embed-0, rules: {pool: gpu-results}, holders: [gpu-0]}
      - {key: embed-1, governed: false, holders: [cpu-0]}
  - name: the same name as an annotation is no resource restriction
    keys:
      - {key: embed-2, annotations: {resources: {GPU: 1}}, holders: [cpu-0]}
    expect:
      - {key: embed-2, holders: [gpu-0]}
"""


def test_a_case_key_states_its_tasks_resources(tmp_path: Path) -> None:
    """``resources:`` on a case key is the producing task's resource restriction
    (task.resources), so the README's GPU rule is tested; an annotation of that name is
    not, and the failure says what the key was seen as, and why."""
    (tmp_path / "rules.yaml").write_text(readme_rules())
    path = tmp_path / "gpu_test.yaml"
    path.write_text(GPU_CASES)
    status, output = run("test", str(path))
    assert status == 1, output
    lines = output.splitlines()
    assert lines[1:3] == [
        "  PASS  a result of a task that asked for a GPU goes to the GPU worker",
        "  FAIL  the same name as an annotation is no resource restriction",
    ]
    assert lines[3] == (
        f"        {path}:17:33: key 'embed-2': holders: expected ['gpu-0'], got ['cpu-0']"
    )
    assert lines[4] == (
        f"        {path}:15:9: key 'embed-2' is seen as prefix 'embed' and group 'embed' "
        "(named from the key by dask's key_split, as the scheduler names them; set "
        "'prefix:' and 'group:' on the key to change them), no type, no resources "
        "('annotations: {resources: ...}' is an annotation; what resources= sets is "
        "'resources:' on the key)"
    )


def test_a_failing_key_says_why_its_prefix_is_what_it_is(tmp_path: Path) -> None:
    """``features-abc`` is one word to dask's key_split (no hash to strip): a rule on
    the prefix ``features`` does not match it, and the failure says so."""
    (tmp_path / "rules.yaml").write_text(RULES_TEXT.replace('== "x"', '== "features"'))
    path = tmp_path / "prefix_test.yaml"
    path.write_text(
        "rules: rules.yaml\nworkers: [{name: a}, {name: b}]\ncases:\n"
        "  - name: features\n"
        "    keys:\n"
        "      - {key: features-abc, type: numpy.ndarray, holders: [a]}\n"
        "      - {key: features-def, prefix: features, holders: [a]}\n"
        "    expect:\n"
        "      - {key: features-abc, rule: keep-three}\n"
        "      - {key: features-def, rule: keep-three}\n"
    )
    status, output = run("test", str(path))
    assert status == 1
    assert f"{path}:9:35: key 'features-abc': rule: expected 'keep-three', got nothing" in output
    assert (
        f"{path}:6:9: key 'features-abc' is seen as prefix 'features-abc' and group "
        "'features-abc' (named from the key by dask's key_split" in output
    )
    assert "type numpy.ndarray, no resources" in output
    assert "features-def' is seen" not in output  # its expectation held


BAD = """\
rules: rules.yaml
workers:
  - {name: a, host: h1}
  - {name: a, host: h2}
  - {name: c, memory-limit: 1 GiBs, colour: red}
cases:
  - name: one
    keys:
      - {key: x-1, holders: [a, z]}
      - {key: x-1, holders: [a]}
      - {key: "part", count: 3, holders: [a]}
    kill: {hosts: [h9], pools: [gpus]}
    expect:
      - {key: x-9, copies: 2}
      - {key: x-1, rule: keep-3, in-pool: cpu}
      - {key: x-1, copies: two}
    expect-pools: {gpu: [q]}
  - name: one
    keys: []
"""


def test_every_problem_of_a_test_file_has_its_position(project: Path) -> None:
    path = project / "bad_test.yaml"
    path.write_text(BAD)
    status, output = run("test", str(path))
    assert status == 1
    found = [line.strip() for line in output.splitlines() if ": error: " in line]
    assert found == [
        f"{path}:4:12: error: duplicate worker name 'a' (in worker 'a')",
        f"{path}:5:29: error: memory-limit: unknown size unit 'GiBs'; did you mean 'GiB'? (in worker 'c')",
        f"{path}:5:37: error: unknown field 'colour'; expected one of name, host, address, resources, memory-limit, memory, nthreads, status (in worker 'c')",
        f"{path}:9:33: error: unknown worker 'z' (in case 'one')",
        f"{path}:10:15: error: key 'x-1' is listed twice (in case 'one')",
        f"{path}:11:15: error: with 'count', the key must contain '{{i}}' (in case 'one')",
        f"{path}:12:20: error: unknown host 'h9' (in case 'one')",
        f"{path}:12:33: error: unknown pool 'gpus'; did you mean 'gpu'? (in case 'one')",
        f"{path}:14:15: error: key 'x-9' is not among the case's keys (in case 'one')",
        f"{path}:15:26: error: unknown rule 'keep-3'; did you mean 'keep-three'? (a rule name, 'annotation' or 'runtime') (in case 'one')",
        f"{path}:15:43: error: unknown pool 'cpu'; did you mean 'gpu'? (in case 'one')",
        f"{path}:16:28: error: expect.copies: expected a whole number, got 'two' (in case 'one')",
        f"{path}:17:26: error: unknown worker 'q' (in case 'one')",
        f"{path}:18:11: error: duplicate case name 'one' (in case 'one')",
    ]
    assert output.endswith("1 file, 0 cases: 0 passed, 0 failed; 1 file with errors\n")


MIXED = """\
rules: rules.yaml
workers:
  - {name: a, host: h1}
  - {name: "", memory-limit: 1 GiBs}
cases:
  - name: one
    keys:
      - {key: x-1, holders: [a, z], nbytes: lots}
      - {key: x-2, holders: [a], colour: red}
    kill: {hosts: [h9], colour: red}
    expect:
      - {key: x-9, copies: two}
      - {key: x-1, rule: keep-3, in-pool: cpu, hosts: many}
    expect-actions:
      - {op: copy, key: x-8, worker: q}
    expect-lost: [x-7, {}]
    expect-pools: {gpus: [q], gpu: 3}
  - name: ""
    keys: [{key: x-1, holders: [w]}]
"""


def test_every_problem_in_one_pass_beside_the_schemas(project: Path) -> None:
    """Each entry has a problem the schema finds and one only the meaning shows (an
    unknown worker, key, rule, pool or host): both are told at once, not the second
    after the first was fixed."""
    path = project / "mixed_test.yaml"
    path.write_text(MIXED)
    status, output = run("test", str(path))
    assert status == 1
    found = [
        line.strip()[len(str(path)) + 1 :] for line in output.splitlines() if ": error: " in line
    ]
    assert [f.split(": error: ")[0] for f in found] == [
        "4:12", "4:30", "8:33", "8:45", "9:34", "10:20", "10:25", "12:15", "12:28", "13:26",
        "13:43", "13:55", "15:14", "15:25", "15:38", "16:19", "16:24", "17:26", "17:27",
        "17:36", "18:11", "19:33",
    ]  # fmt: skip
    meaning = [f for f in found if "unknown" in f or "not among" in f or "size unit" in f]
    assert [m.split(": error: ")[1] for m in meaning] == [
        "memory-limit: unknown size unit 'GiBs'; did you mean 'GiB'? (in worker '#2')",
        "unknown worker 'z' (in case 'one')",
        "unknown field 'colour'; expected one of key, holders, nbytes, prefix, group, type, "
        "resources, annotations, target, waiters, recompute, count (in case 'one')",
        "unknown host 'h9' (in case 'one')",
        "unknown field 'colour'; expected one of workers, hosts, pools (in case 'one')",
        "key 'x-9' is not among the case's keys (in case 'one')",
        "unknown rule 'keep-3'; did you mean 'keep-three'? (a rule name, 'annotation' or "
        "'runtime') (in case 'one')",
        "unknown pool 'cpu'; did you mean 'gpu'? (in case 'one')",
        "key 'x-8' is not among the case's keys (in case 'one')",
        "unknown worker 'q' (in case 'one')",
        "key 'x-7' is not among the case's keys (in case 'one')",
        "unknown pool 'gpus'; did you mean 'gpu'? (in case 'one')",
        "unknown worker 'q' (in case 'one')",
        "unknown worker 'w' (in case '#2')",
    ]


def test_a_tuple_key_holding_a_mapping_is_an_error_not_a_crash(project: Path) -> None:
    path = project / "key_test.yaml"
    path.write_text(
        "rules: rules.yaml\nworkers: [{name: a}]\n"
        "cases: [{name: c, keys: [{key: [x, {a: 1}], holders: [a]}]}]\n"
    )
    status, output = run("test", str(path))
    assert status == 1
    assert f"{path}:3:36: error: keys.key: expected a string or a whole number" in output


def test_a_rules_file_with_errors_is_reported_with_its_own_positions(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(RULES_TEXT.replace("task.prefix", "task.prefx", 1))
    path = tmp_path / "x_test.yaml"
    path.write_text("rules: rules.yaml\nworkers: [{name: a}]\ncases: [{name: c, keys: []}]\n")
    status, output = run("test", str(path))
    assert status == 1
    assert f"{path}:1:8: error: the rules file {tmp_path / 'rules.yaml'} cannot be used" in output
    assert f"{tmp_path / 'rules.yaml'}:7:17: error: match: task has no attribute 'prefx'" in output
    missing = tmp_path / "y_test.yaml"
    missing.write_text("rules: nowhere.yaml\nworkers: [{name: a}]\ncases: [{name: c, keys: []}]\n")
    status, output = run("test", str(missing))
    assert status == 1 and "cannot be used: no such file" in output


def test_usage_errors(tmp_path: Path) -> None:
    status, output = run("test")
    assert status == 2 and "give test files or directories" in output
    status, output = run("test", str(tmp_path))
    assert status == 2 and "no test files in" in output
    status, output = run("test", str(tmp_path / "nothing_test.yaml"))
    assert status == 2


def test_dry_run_rules_are_tested_as_they_act(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(
        RULES_TEXT.replace("    replicate: 3\n", "    replicate: 3\n    enforcement: dry-run\n")
    )
    path = tmp_path / "dry_test.yaml"
    path.write_text(
        "rules: rules.yaml\n"
        "workers: [{name: a}, {name: b}, {name: c}]\n"
        "cases:\n"
        "  - name: held back\n"
        "    keys: [{key: x-1, holders: [a]}, {key: dev-0, holders: [a]}]\n"
        "    expect:\n"
        "      - {key: x-1, dry-run: true, target: 3, copies: 1}\n"
        "      - {key: dev-0, dry-run: false}\n"
        "    expect-actions: []\n"
    )
    status, output = run("test", str(path))
    assert status == 0, output
    path.write_text(path.read_text().replace("dry-run: true, target: 3, copies: 1", "copies: 3"))
    status, output = run("test", str(path))
    assert status == 1 and "key 'x-1': copies: expected 3, got 1" in output


DUMP = ROOT / "examples" / "dumps" / "demo-cluster.msgpack.gz"


def test_cases_from_a_dump_pass_then_fail_after_a_rule_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``test --from-dump``: a test file of the dump's cluster with what the rules decide
    as expectations passes ``amm-rules test`` on those rules, and fails once a rule is
    changed; ``--sample`` bounds it."""
    import shutil

    (tmp_path / "pyproject.toml").write_text("")
    shutil.copytree(ROOT / "examples" / "rules", tmp_path / "rules")
    (tmp_path / "tests").mkdir()
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "tests" / "cluster_test.yaml"
    status, output = run(
        "test", "--from-dump", str(DUMP), "--rules", "rules/demo.yaml", "-o", str(out)
    )
    assert status == 0, output
    assert f"wrote {out}: 1 case of 7 keys (of 7 in memory in {DUMP})" in output
    text = out.read_text()
    assert text.startswith("# Written by `amm-rules test --from-dump")
    assert "\nrules: ../rules/demo.yaml\n" in text
    data = yaml.safe_load(text)
    (case,) = data["cases"]
    expect = {e["key"]: e for e in case["expect"]}
    assert expect["precious-0"] == {
        "key": "precious-0",
        "target": 3,
        "spread": "host",
        "rules": {"replicate": "precious", "spread": "precious"},
        "copies": 3,
    }
    assert expect["device-0"]["rules"] == {"pool": "device-data"}
    assert expect["other-0"] == {"key": "other-0", "governed": False, "copies": 1}
    status, output = run("test", "tests")
    assert status == 0, output
    assert "1 passed, 0 failed" in output

    demo = tmp_path / "rules" / "demo.yaml"
    demo.write_text(demo.read_text().replace("replicate: 3", "replicate: 2"))
    status, output = run("test", "tests")
    assert status == 1
    assert "key 'precious-0': target: expected 3, got 2" in output
    assert "key 'precious-0': copies: expected 3, got 2" in output

    status, output = run(
        "test", "--from-dump", str(DUMP), "--rules", "rules/demo.yaml", "--sample", "3"
    )
    assert status == 0
    keys = [k["key"] for k in yaml.safe_load(output)["cases"][0]["keys"]]
    assert keys == ["device-0", "host-0", "other-0"]  # one of each group first


@pytest.mark.parametrize(
    "args",
    [
        ["--from-dump", str(DUMP)],
        ["--rules", "x.yaml"],
        ["--from-dump", str(DUMP), "--rules", "x.yaml", str(ROOT / "examples" / "tests")],
    ],
)
def test_from_dump_and_rules_go_together(args: list[str]) -> None:
    status, output = run("test", *args)
    assert status == 2
    assert "--from-dump DUMP and --rules RULES go together, without test files" in output
