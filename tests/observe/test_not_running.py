"""Status while the Active Memory Manager runs no cycle (``client.amm.stop()``, or
``start: false`` with the policy configured): the text, ``status.json``, the page's
header and ``/metrics`` say so first, with since when, and no rule claims a state that
only a running cycle could earn (``satisfied``, ``in-progress``, ``idle``).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from distributed import wait
from distributed.utils_test import gen_cluster
from tornado.httpclient import AsyncHTTPClient

from amm_rules.observe.conformance import NOT_RUNNING, SATISFIED
from amm_rules.observe.dashboard import header_html
from amm_rules.observe.text import render_status
from benchmarks.support.waiting import poll, wait_for
from tests.observe.test_metrics import samples, scrape, value
from tests.support.cluster import amm_config, copies, inc, policy_of, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

TWO = rules(
    {"name": "two", "match": 'task.prefix == "two"', "replicate": 2},
    {"name": "nothing", "match": 'task.prefix == "nothing"', "replicate": 2},
)
#: A scheduler with its dashboard and the page, as ``--preload amm_rules.preload``.
HTTP = {"dashboard": True, "dashboard_address": "127.0.0.1:0", "preload": ["amm_rules.preload"]}
NOT_STARTED = {**amm_config(TWO), "distributed.scheduler.active-memory-manager.start": False}


def states(report: dict[str, Any]) -> set[str]:
    return {r["state"] for r in report["conformance"]["rules"]}


async def status_json(s: Any) -> dict[str, Any]:
    url = f"http://127.0.0.1:{s.http_server.port}/amm-rules/status.json"
    return json.loads((await AsyncHTTPClient().fetch(url)).body)


async def says_not_running(c: Any, s: Any, since: tuple[float, float]) -> None:
    """Every reader says first that no cycle runs, since a time within ``since``."""
    report = await c.scheduler.amm_rules_status()
    assert next(iter(report)) == "amm"
    assert report["amm"]["running"] is False
    assert since[0] <= report["amm"]["since"] <= since[1]
    assert states(report) == {NOT_RUNNING}
    assert report["conformance"]["running"] is False
    lines = render_status(report).splitlines()
    assert lines[1].startswith("not running  the Active Memory Manager runs no cycle since ")
    assert "conformance  not enforced: the Active Memory Manager runs no cycle" in lines
    assert "0 keys since the rules were loaded" not in render_status(report)  # no idle
    header = header_html(report)
    assert header.index("<b>not running</b>") < header.index("<b>rules</b>")
    page = await poll(lambda: status_json(s), lambda r: r["amm"]["running"] is False, "json")
    assert states(page) == {NOT_RUNNING}
    text = await scrape(s)
    assert value(text, "dask_amm_rules_amm_running") == 0
    assert since[0] <= value(text, "dask_amm_rules_amm_running_changed_timestamp_seconds")
    assert set(samples(text, "dask_amm_rules_rule_state", state=NOT_RUNNING).values()) == {1.0}
    assert set(samples(text, "dask_amm_rules_rule_state", state=SATISFIED).values()) == {0.0}


@gen_cluster(
    client=True, nthreads=[("", 1)] * 3, scheduler_kwargs=HTTP, config=amm_config(TWO), timeout=90
)
async def test_a_stopped_amm_is_said_first_and_no_rule_claims_a_state(c, s, a, b, w3):
    futures = c.map(inc, range(3), key=[f"two-{i}" for i in range(3)])
    await wait(futures)
    await wait_for(lambda: all(copies(s, f.key) == 2 for f in futures), "two copies each")
    report = await poll(
        lambda: c.scheduler.amm_rules_status(),
        lambda r: r["states"]["two"] == SATISFIED and r["states"]["nothing"] == "idle",
        "two satisfied, nothing idle",
    )
    assert report["amm"]["running"] is True
    assert "not running" not in render_status(report)
    assert value(await scrape(s), "dask_amm_rules_amm_running") == 1
    before = time.time()
    await c.amm.stop()
    # A copy in flight when the AMM stopped stays "in flight" for ever: not a claim.
    policy_of(s).ctx.ledger.record("two-0", w3.address, "replication", time.monotonic())
    await says_not_running(c, s, (before, time.time()))
    report = await c.scheduler.amm_rules_status()
    assert "in flight    1 copy of 1 key (asked by an earlier cycle)" in render_status(report)
    policy_of(s).ctx.ledger.forget("two-0")

    before = time.time()
    await c.amm.start()
    report = await poll(
        lambda: c.scheduler.amm_rules_status(),
        lambda r: r["states"]["two"] == SATISFIED,
        "two satisfied again",
    )
    assert report["amm"]["running"] is True and before <= report["amm"]["since"]


@gen_cluster(
    client=True, nthreads=[("", 1)] * 2, scheduler_kwargs=HTTP, config=NOT_STARTED, timeout=60
)
async def test_an_amm_never_started_is_said_first(c, s, a, b):
    futures = c.map(inc, range(3), key=[f"two-{i}" for i in range(3)])
    await wait(futures)
    # since: the policy's attach, when the scheduler was made
    await says_not_running(c, s, (0.0, time.time()))
