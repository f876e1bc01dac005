"""``amm-rules validate RULES --dump FILE``: the warnings that need a cluster, on a real
dump, positioned in the rules file."""

from __future__ import annotations

from typing import Any

from click.testing import CliRunner
from distributed.utils_test import gen_cluster

from amm_rules.cli import main
from tests.support.dumps import CONFIG, NTHREADS, dump, populate

RULES = """\
version: 1
pools:
  gpu: worker.resources.GPU >= 1
  tpu: worker.resources.TPU >= 1  # amm-rules: disable=unused-pool
  spare: worker.name == "3"
rules:
  - name: everywhere
    match: task.prefix == "precious"
    replicate: 5
  - name: on-gpu
    match: task.prefix == "device"
    pool: gpu
    replicate: {min: 2, max: 3}
  - name: spread-on-one-host
    match: task.prefix == "host"
    pool: spare
    spread: host
  - name: fine
    match: task.prefix == "part"
    replicate: 3
    spread: host
    avoid: gpu
  - name: on-every-worker
    match: task.prefix == "annotated"
    replicate: {min: all}
"""


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@gen_cluster(client=True, nthreads=NTHREADS, config=CONFIG)
async def test_cluster_warnings(c, s, *workers, tmp_path):
    futures = await populate(c, s)  # noqa: F841
    path = str(await dump(c, tmp_path, "msgpack"))
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    status, output = run("validate", str(rules))
    assert (status, output) == (0, "1 file checked: no problems\n")

    status, output = run("validate", str(rules), "--dump", path)
    assert status == 0
    found = [line for line in output.splitlines() if ": warning[" in line]
    assert found == [
        f"{rules}:4:3: warning[empty-pool]: pool 'tpu' has no worker in the cluster of {path} (4 workers) "
        "(in pool 'tpu')",
        f"{rules}:9:16: warning[min-exceeds-eligible]: replicate: wants 5 copies, but the cluster of {path} has 4 "
        "workers: its keys would stay below target (in rule 'everywhere')",
        f"{rules}:13:22: warning[min-exceeds-eligible]: replicate.min: wants 2 copies, but only 1 worker in pool gpu "
        f"in the cluster of {path}: its keys would stay below target (in rule 'on-gpu')",
        f"{rules}:17:13: warning[spread-one-host]: spread: host, but the workers it may use in the cluster of "
        f"{path} are all on one host (127.0.0.2) (in rule 'spread-on-one-host')",
        # Its one key is annotated amm: {replicate: 2}, which decides first: live status
        # calls the rule shadowed.
        f"{rules}:24:12: warning[shadowed-in-cluster]: matches 1 key, taken by (annotation) "
        f"(replicate), in the cluster of {path}: the rule decides nothing there (in rule "
        "'on-every-worker')",
    ]
    assert output.endswith("1 file checked: 5 warnings\n")
    status, _ = run("validate", str(rules), "--dump", path, "--strict")
    assert status == 1

    status, output = run("validate", str(rules), "--dump", str(tmp_path / "missing.msgpack.gz"))
    assert status == 1 and output.strip().endswith("missing.msgpack.gz: no such file")


NAMED = """\
version: 1
rules:
  - name: frames
    match: task.type == "pandas.Dataframe"  # amm-rules: disable=type-name
    replicate: 2
  - name: gpu
    match: task.resources.gpu >= 1
    replicate: 2
  - name: reader
    match: task.prefix == "read_parquet"
    replicate: 2
  - name: matching
    match: task.prefix == "precious"
    replicate: 2
"""


def frame(n: int) -> Any:
    import pandas as pd

    return pd.DataFrame({"a": range(n)})


@gen_cluster(client=True, nthreads=NTHREADS, config=CONFIG)
async def test_rules_matching_no_key_of_the_dump(c, s, *workers, tmp_path):
    futures = await populate(c, s)
    futures["frames"] = [c.submit(frame, 3, key=f"readparquetfsspec-{i}") for i in range(3)]
    futures["gpu"] = [c.submit(len, "ab", key="on-gpu", resources={"GPU": 1})]
    await c.gather(futures["frames"] + futures["gpu"])
    path = str(await dump(c, tmp_path, "msgpack"))
    rules = tmp_path / "rules.yaml"
    rules.write_text(NAMED)
    status, output = run("validate", str(rules), "--dump", path)
    assert status == 0
    found = [line for line in output.splitlines() if ": warning[matches-no-key]: " in line]
    n = len(s.tasks)
    head = f"the match is false for every key in memory in the cluster of {path} ({n} keys)"
    assert found == [
        f"{rules}:4:12: warning[matches-no-key]: {head}; 3 keys of type pandas.DataFrame in memory "
        "(the rule says pandas.Dataframe) (in rule 'frames')",
        f"{rules}:7:12: warning[matches-no-key]: {head}; 1 key was made by tasks with resources="
        "{'GPU': 1} (the rule reads task.resources.gpu; use task.resources.GPU) (in rule 'gpu')",
        f"{rules}:10:12: warning[matches-no-key]: {head}; 3 keys of prefix readparquetfsspec in memory "
        "(the rule says read_parquet) (in rule 'reader')",
    ]
