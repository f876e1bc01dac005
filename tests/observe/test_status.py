"""The status report's workers, pools and rebalancing, and its text, on a real cluster
that rebalances (workers in one process: the rules measure ``managed`` memory against a
small limit, and the workers' own memory monitor is off); the last reload error, every
line of it."""

from __future__ import annotations

import json
import math

import numpy as np
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from amm_rules.observe.status import status_report
from amm_rules.observe.text import RELOAD_ERROR_LINES, render_status
from benchmarks.support.waiting import cycle_until, wait_for
from tests.support.cluster import amm_config, events, policy_of, rules
from tests.support.rules_files import write_atomically
from tests.support.rulesets import RELOADABLE

MiB = 2**20
LIMIT = 10 * MiB
GPU = {"resources": {"GPU": 1}}


def config() -> dict:
    out = amm_config(
        rules(
            {"name": "pinned", "match": 'task.prefix == "pinned"', "pool": "gpu"},
            pools={"gpu": "worker.resources.GPU >= 1"},
            rebalance={"measure": "managed", "sender-min": "10%", "gap": "10%"},
        )
    )
    for name in ("target", "spill", "pause", "terminate"):
        out[f"distributed.worker.memory.{name}"] = False
    return out


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1), ("", 1)],
    worker_kwargs={"memory_limit": LIMIT},
    config=config(),
)
async def test_workers_by_pool_and_rebalancing(c, s, gpu, b, w):
    data = await c.scatter(
        {f"x-{i}": np.full(100_000 // 8, float(i)) for i in range(40)}, workers=[gpu.address]
    )
    policy = policy_of(s)
    await wait_for(
        lambda: policy.rebalancer.totals["done"] > 0, "policy.rebalancer.totals['done'] > 0"
    )
    report = status_report(policy)

    assert report["memory_measure"] == "managed"
    columns = report["workers"]
    assert {len(column) for column in columns.values()} == {len(s.workers)}
    by_address = {
        address: {name: column[i] for name, column in columns.items()}
        for i, address in enumerate(columns["address"])
    }
    assert set(by_address) == set(s.workers)
    row = by_address[gpu.address]
    assert row["pools"] == ["gpu"] and row["memory_limit"] == LIMIT
    assert row["memory"] == s.workers[gpu.address].memory.managed
    assert math.isclose(row["fraction"], row["memory"] / LIMIT)
    assert by_address[b.address]["pools"] == []
    # The roles of the last rebalancing plan.
    assert set(columns["role"]) <= set(policy.rebalancer.last_plan.roles.values())
    pools = report["memory_by_pool"]
    assert pools["gpu"]["workers"] == [gpu.address]
    assert sorted(pools["(no pool)"]["workers"]) == sorted([b.address, w.address])
    assert pools["gpu"]["memory"] + pools["(no pool)"]["memory"] == sum(columns["memory"])
    rebalance = report["rebalance"]
    assert rebalance["enabled"] and rebalance["sender_min"] == 0.10
    # Strict JSON (a dashboard route serves it as is): no NaN anywhere.
    json.dumps(report, allow_nan=False)

    text = render_status(report)
    assert "rebalance    on (managed, sender-min 10%, recipient-max 60%, gap 10%)" in text
    assert "moves, " in text and "since start" in text
    # Decisions of rebalancing moves are journaled with their source.
    assert any(d["source"] == "(rebalance)" for d in report["decisions"])
    assert len(data) == 40


#: A rules file with an error in each of its two rules.
TWO_ERRORS = """\
version: 1
rules:
  - name: keep
    match: task.key matchs "x-*"
    replicate: 2
  - name: also
    match: task.prefix == "y"
    replicate: lots
"""


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(None, start=False))
async def test_status_shows_every_line_of_the_last_reload_error(c, s, a, tmp_path):
    """Both errors of a reload (not the first and "+1 more lines"); past
    :data:`RELOAD_ERROR_LINES` lines, how many more and where to see them."""
    path = tmp_path / "rules.yaml"
    path.write_text(RELOADABLE.format(n=1))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    write_atomically(path, TWO_ERRORS)
    await cycle_until(amm, lambda: events(s, "reload-error"), "a reload-error event")
    report = status_report(policy)
    lines = render_status(report).splitlines()
    (first,) = [i for i, line in enumerate(lines) if line.startswith("  last reload error at ")]
    assert lines[first].endswith(
        f"{path}:4:21: error: match: unexpected 'matchs'; expected "
        "an operator (== != < <= > >= in, not in, matches), 'and', 'or' or the end of the "
        "expression (in rule 'keep')"
    )
    assert lines[first + 1].startswith(f"    {path}:8:16: error: replicate: ")
    assert not any("more line" in line for line in lines)

    many = "\n".join(f"{path}:{n}:1: error: something" for n in range(1, 31))
    report["last_reload_error"] = {**report["last_reload_error"], "error": many}
    lines = render_status(report).splitlines()
    (first,) = [i for i, line in enumerate(lines) if line.startswith("  last reload error at ")]
    shown = lines[first + 1 : first + 1 + RELOAD_ERROR_LINES]
    assert shown == [f"    {path}:{n}:1: error: something" for n in range(2, 22)]
    assert lines[first + 1 + RELOAD_ERROR_LINES] == (
        "    (+9 more lines: amm-rules validate shows them all)"
    )
