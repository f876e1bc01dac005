"""The memory flow and the memory-pressure section as operators see them: the status
report and its text, ``status --memory-flow``'s tables, ``explain`` of a task held back
and of a key whose kind is known, the dashboard page's table and line. (The command line and the Prometheus series are tested
with the others, in test_cli.py and test_metrics.py.)"""

from __future__ import annotations

import json

import pytest
from dask.utils import format_bytes
from distributed.utils_test import gen_cluster

from amm_rules.engine.decide.view import key_string
from amm_rules.engine.words import signed_size
from amm_rules.observe.explain import explain_keys
from amm_rules.observe.status import status_report
from amm_rules.observe.text import render_explain, render_memory_flow, render_status
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, policy_of
from tests.support.flow import SIZE, graph
from tests.support.pressure import WORKERS, pressure_on, section, slow
from tests.support.pressure import config as pressure_config

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

PRESSURE = {"version": 1, "memory-pressure": {"threshold": "90%", "release": "80%"}}


def test_render_memory_flow_lists_the_top_prefixes_only():
    table = {
        f"p{i}": {
            "produced": 1000 * i,
            "freed": 0,
            "freed_by": 10 * i,
            "live": 0,
            "tasks": 1,
            "net_per_task": 990.0 * i,
        }
        for i in range(1, 8)
    }
    text = render_memory_flow(table, top=3).splitlines()
    rows = [line.split()[0] for line in text if line.startswith("  p") and "prefix" not in line]
    assert rows == ["p7", "p6", "p5", "p7", "p6", "p5"]


@gen_cluster(client=True, config=amm_config(PRESSURE))
async def test_the_status_report_carries_the_section(c, s, a, b):
    report = status_report(policy_of(s))
    pressure = report["memory_pressure"]
    assert pressure["settings"]["threshold"] == 0.9 and pressure["state"] == "idle"
    assert pressure["totals"]["holds"] == 0
    text = render_status(json.loads(json.dumps(report)))
    assert "pressure     idle; 0 holds, 0.0s held since start" in text


@gen_cluster(client=True, config=pressure_config(section()), **WORKERS)
async def test_explain_says_a_queued_task_is_held_back_and_what_a_kind_makes(c, s, a, b):
    policy = policy_of(s)
    held = await pressure_on(c, s, a)
    work = c.map(slow, range(40), key=[f"work-{i}" for i in range(40)])
    await wait_for(
        lambda: policy.pressure.state == "holding" and s.queued,
        "policy.pressure.state == 'holding' and s.queued",
    )
    queued = next(iter(s.queued)).key
    answer = explain_keys(policy, [queued])[key_string(queued)]
    assert answer["summary"].startswith("not in memory (queued): held back:")
    assert answer["memory_pressure"]["held"] and answer["memory_pressure"]["producer"]
    text = render_explain(json.loads(json.dumps({key_string(queued): answer})))
    assert "  pressure  " in text
    # A key in memory: what tasks of its kind produce.
    in_memory = explain_keys(policy, ["held-0"])["held-0"]
    assert in_memory["facts"]["memory_flow"]["tasks"] == 1
    assert "  kind     +" in render_explain({"held-0": in_memory})
    await c.gather(work)
    del held


@gen_cluster(client=True, config=pressure_config(section()), **WORKERS)
async def test_the_dashboard_page_shows_the_flow_and_the_pressure(c, s, a, b):
    from bokeh.document import Document

    from amm_rules.observe.dashboard import RulesPage

    policy = policy_of(s)
    page = RulesPage(s)
    Document().add_root(page.root)
    page.update()
    assert page.flow.source.data["prefix"] == []
    assert "<b>memory pressure</b> idle" in page.flow.pressure.text
    assert await c.compute(graph(4, "inp")) == 4 * SIZE
    held = await pressure_on(c, s, a)
    work = c.map(slow, range(40), key=[f"work-{i}" for i in range(40)])

    def producers() -> list[str]:
        page.update()
        rows = page.flow.source.data
        return [
            p for p, role in zip(rows["prefix"], rows["role"], strict=True) if role == "producer"
        ]

    # Holding, and the page shows the producers: the hold can begin before the page's
    # flow figures show them (seen on a loaded machine), so the wait is on both.
    await wait_for(
        lambda: policy.pressure.state == "holding" and producers()[:2] == ["held", "inp"],
        "holding, and the page showing held then inp as producers (80 MiB, then SIZE, per task)",
        show=lambda: (policy.pressure.state, producers()),
    )
    rows = page.flow.source.data
    at = rows["prefix"].index("cons-inp")
    assert rows["role"][at] == "freer" and rows["freed_by"][at] == format_bytes(4 * SIZE)
    net = policy.flow.table()["cons-inp"]["net_per_task"]
    assert net < 0 and rows["net"][at] == signed_size(net)
    assert "holding for" in page.flow.pressure.text
    assert "worker-saturation 0.5" in page.flow.pressure.text
    await c.gather(work)
    del held
