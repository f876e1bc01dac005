"""``amm-rules validate RULES --dump FILE``: the warnings that need a cluster, on a real
dump, positioned in the rules file."""

from __future__ import annotations

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
    match: task.prefix == "a"
    replicate: 5
  - name: on-gpu
    match: task.prefix == "b"
    pool: gpu
    replicate: {min: 2, max: 3}
  - name: spread-on-one-host
    match: task.prefix == "c"
    pool: spare
    spread: host
  - name: fine
    match: task.prefix == "d"
    replicate: 3
    spread: host
    avoid: gpu
  - name: on-every-worker
    match: task.prefix == "e"
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
    ]
    assert output.endswith("1 file checked: 4 warnings\n")
    status, _ = run("validate", str(rules), "--dump", path, "--strict")
    assert status == 1

    status, output = run("validate", str(rules), "--dump", str(tmp_path / "missing.msgpack.gz"))
    assert status == 1 and output.strip().endswith("missing.msgpack.gz: no such file")
