"""``amm-rules simulate`` says how many workers the rules need for a dump: memory under
the adaptive section's headroom (with the tasks still to run), and the workers the
rules keep through a scale-down, with why (docs/adaptive.md)."""

from __future__ import annotations

import json
import math
from typing import Any

from distributed import Event
from distributed.utils_test import gen_cluster

from benchmarks.support.waiting import wait_for
from tests.offline.test_simulate import cli
from tests.support.dumps import CONFIG, NTHREADS, array, dump, populate
from tests.support.dumps import RULES as DUMP_RULES

MiB = 2**20
#: The offline tests' rules (tests/support/dumps.py), with an adaptive section.
RULES = DUMP_RULES + "adaptive:\n  headroom: 90%\n"


def wait_on(event: Event) -> None:
    event.wait()


def part(i: int, gate: Any) -> Any:
    return array(200_000, i)


@gen_cluster(
    client=True, nthreads=NTHREADS, config=CONFIG, worker_kwargs={"memory_limit": 10 * MiB}
)
async def test_simulate_says_how_many_workers_the_rules_need(c, s, *workers, tmp_path):
    futures = await populate(c, s)
    event = Event()
    gate = c.submit(wait_on, event, key="gate")
    waiting = [c.submit(part, i, gate, key=("part", 10 + i)) for i in range(5)]
    await wait_for(
        lambda: all(s.tasks.get(f.key) and s.tasks[f.key].state == "waiting" for f in waiting),
        "five parts waiting",
    )
    try:
        path = await dump(c, tmp_path, "msgpack")
    finally:
        await event.set()
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    status, output = cli("simulate", str(rules), "--dump", str(path), "--format", "json")
    assert status == 0
    answer = json.loads(output)["workers_needed"]
    # precious keeps three copies on both hosts: three of the four workers stay, the GPU
    # worker among them (device's pool).
    rules_part = answer["rules"]
    assert rules_part["workers"] == 3 and rules_part["may_leave"] == 1
    assert "3 keys of rule precious would fall below min 3" in rules_part["why"]
    memory = answer["memory"]
    assert memory["per_worker"] == MiB  # 10% of 10 MiB
    # The five parts still to run are expected to hold what a part in memory does.
    parts = [s.tasks[("part", i)].nbytes for i in range(4)]
    assert memory["expected"] == int(5 * sum(parts) / len(parts))
    assert memory["workers"] == math.ceil(memory["needed"] / MiB)
    assert answer["workers"] == max(memory["workers"], 3) and answer["running"] == 4

    status, text = cli("simulate", str(rules), "--dump", str(path))
    assert status == 0
    assert f"workers needed: {answer['workers']} (4 running)" in text
    assert "rules: 3: the others could leave; kept: " in text
    assert "1.00 MiB each under the headroom of 90%" in text
    await c.gather(waiting)
    del futures
