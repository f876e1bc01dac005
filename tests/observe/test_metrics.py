"""Prometheus metrics, scraped as Prometheus does: the scheduler's own ``/metrics`` over
HTTP, on real schedulers and workers."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import dask
import prometheus_client
import pytest
from distributed import Scheduler, Worker
from distributed.utils_test import gen_cluster, gen_test, inc
from tornado.httpclient import AsyncHTTPClient

from amm_rules import RulesPolicy
from amm_rules.observe import metrics
from benchmarks.support.waiting import cycle_until, poll, wait_for
from tests.support.cluster import amm_config, copies, policy_of, rules
from tests.support.flow import graph
from tests.support.rules_files import write_atomically

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

TWO = rules(
    {"name": "two", "match": 'task.prefix == "two"', "replicate": 2},
    {"name": "many", "match": 'task.prefix == "many"', "replicate": 5},
)
HTTP = {"dashboard": True, "dashboard_address": "127.0.0.1:0"}
ROOT = Path(__file__).resolve().parent.parent.parent
SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


async def scrape(s: Scheduler) -> str:
    response = await AsyncHTTPClient().fetch(f"http://127.0.0.1:{s.http_server.port}/metrics")
    return response.body.decode()


def samples(text: str, name: str, **labels: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one metric whose labels include ``labels``: labels -> value."""
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or m["name"] != name:
            continue
        found = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m["labels"] or "")))
        if all((k, v) in found for k, v in labels.items()):
            out[found] = float(m["value"])
    return out


def value(text: str, name: str, **labels: str) -> float:
    (v,) = samples(text, name, **labels).values()
    return v


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    """docs/observe.md's table of metrics: name -> (type, labels besides ``scheduler``)."""
    text = (ROOT / "docs" / "observe.md").read_text()
    out = {}
    for m in re.finditer(r"^\| `(dask_amm_rules_\w+)` \| (\w+) \|([^|]*)\|", text, re.M):
        names = re.sub(r"\([^)]*\)", "", m[3])  # `result` (`ok`, `error`): the values aside
        out[m[1]] = (m[2], frozenset(re.findall(r"`(\w+)`", names)))
    return out


def served(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """The same, from a scrape: every family's type and the labels of its samples."""
    types = dict(re.findall(r"^# TYPE (dask_amm_rules_\w+) (\w+)$", text, re.M))
    out = {}
    for name, kind in types.items():
        members = {name, f"{name}_count", f"{name}_sum"}
        labels: set[str] = set()
        for line in text.splitlines():
            m = SAMPLE.match(line)
            if m and m["name"] in members:
                labels |= set(re.findall(r'(\w+)="', m["labels"] or ""))
        kind = "info" if name.endswith("_info") else kind  # an info is a gauge of 1
        out[name] = (kind, frozenset(labels - {"scheduler"}))
    return out


async def scrape_until(s: Scheduler, name: str, expected: float, **labels: str) -> str:
    """Scrape until one sample has the expected value (a cycle may be needed to see a
    change); fail after a generous deadline. Returns the last scrape."""
    return await poll(
        lambda: scrape(s),
        lambda text: list(samples(text, name, **labels).values()) == [expected],
        f"{name}{labels} == {expected}",
    )


@gen_cluster(
    client=True, nthreads=[("", 1)] * 3, scheduler_kwargs=HTTP, config=amm_config(TWO), timeout=150
)
async def test_metrics_follow_the_cluster(c, s, a, b, w3):
    here = {"scheduler": s.address}
    text = await scrape(s)
    assert value(text, "dask_amm_rules_governed_keys", rule="two", **here) == 0
    assert value(text, "dask_amm_rules_rule_state", rule="two", state="satisfied", **here) == 1
    assert value(text, "dask_amm_rules_keys_met_ratio", **here) == 1.0
    info = samples(text, "dask_amm_rules_rules_info", **here)
    (labels,) = info
    assert (
        dict(labels)["sha256"] == policy_of(s).ruleset.sha256 and len(dict(labels)["sha256"]) == 64
    )

    # Two keys of rule "two": governed, copied, then satisfied.
    keys = ["two-1", "two-2"]
    futures = c.map(inc, range(2), key=keys)
    await c.gather(futures)
    text = await scrape_until(s, "dask_amm_rules_keys_met", 2, rule="two", **here)
    assert [copies(s, k) for k in keys] == [2, 2]
    assert value(text, "dask_amm_rules_governed_keys", rule="two", **here) == 2
    assert value(text, "dask_amm_rules_governed_bytes", rule="two", **here) == sum(
        s.tasks[k].nbytes for k in keys
    )
    assert value(text, "dask_amm_rules_copies_requested_total", rule="two", **here) == 2
    assert value(text, "dask_amm_rules_cycle_duration_seconds_count", **here) > 0

    # Five copies wanted, three workers: unsatisfiable, with its reason.
    many = c.submit(inc, 10, key="many-1")
    await many
    text = await scrape_until(
        s, "dask_amm_rules_rule_state", 1, rule="many", state="unsatisfiable", **here
    )
    unmet = samples(text, "dask_amm_rules_keys_unmet", rule="many", **here)
    assert {dict(k)["reason"]: v for k, v in unmet.items() if v} == {"too-few-workers": 1}
    assert value(text, "dask_amm_rules_keys_met_ratio", **here) == 2 / 3
    assert value(text, "dask_amm_rules_rule_state", rule="two", state="satisfied", **here) == 1
    assert documented() == served(text)
    await wait_for(lambda: copies(s, "many-1") == 3, "copies(s, 'many-1') == 3")
    text = await scrape_until(s, "dask_amm_rules_copies_requested_total", 2, rule="many", **here)

    # Keys released: counted no more; counters keep their totals.
    del futures, many
    await wait_for(lambda: not s.tasks, "not s.tasks")
    text = await scrape(s)
    assert value(text, "dask_amm_rules_governed_keys", rule="two", **here) == 0
    assert value(text, "dask_amm_rules_governed_bytes", rule="many", **here) == 0
    assert value(text, "dask_amm_rules_copies_requested_total", rule="many", **here) == 2


@gen_cluster(client=True, nthreads=[("", 1)], scheduler_kwargs=HTTP, timeout=60)
async def test_reloads_are_counted_and_detach_unregisters(c, s, a):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "rules.yaml"
        path.write_text("version: 1\n")
        policy = RulesPolicy(path)
        s.extensions["amm"].add_policy(policy)
        try:
            reloads = policy.journal.reloads
            # (Each read in a thread: counted by the cycle that finds it read.)
            write_atomically(path, "version: 1\nrules: [\n")  # broken
            await cycle_until(s.extensions["amm"], lambda: reloads["error"] == 1, "the error")
            write_atomically(path, "version: 1\nrules: []\n")
            await cycle_until(s.extensions["amm"], lambda: reloads["ok"] == 1, "the reload")
            text = await scrape(s)
            here = {"scheduler": s.address}
            assert value(text, "dask_amm_rules_reloads_total", result="ok", **here) == 1
            assert value(text, "dask_amm_rules_reloads_total", result="error", **here) == 1
            (labels,) = samples(text, "dask_amm_rules_rules_info", **here)
            assert dict(labels)["source"] == str(path)
        finally:
            policy.detach()
        # Detached: its series are gone, and so is the collector (no other policy here).
        assert "dask_amm_rules_" not in await scrape(s)
        assert metrics.registered() is None


@gen_test()
async def test_two_schedulers_in_one_process():
    """Each scheduler's series carry its address; closing one leaves the other's."""
    config = amm_config(TWO)
    with dask.config.set(config):
        async with (
            Scheduler(**HTTP) as s1,
            Scheduler(**HTTP) as s2,
            Worker(s1.address, nthreads=1),
            Worker(s2.address, nthreads=1),
        ):
            assert policy_of(s1) is not policy_of(s2)
            text = await scrape(s1)
            both = samples(text, "dask_amm_rules_keys_met_ratio")
            assert {dict(k)["scheduler"] for k in both} == {s1.address, s2.address}
            await s2.close()
            text = await scrape(s1)
            assert set(samples(text, "dask_amm_rules_keys_met_ratio")) == {
                (("scheduler", s1.address),)
            }
    # Both closed: nothing of amm-rules is left in the process-wide registry.
    assert metrics.registered() is None
    assert "dask_amm_rules_" not in prometheus_client.generate_latest().decode()


@gen_cluster(client=True, nthreads=[("", 1)], scheduler_kwargs=HTTP, config=amm_config())
async def test_metrics_have_top_prefixes_only_and_totals_over_all(c, s, a):
    here = {"scheduler": s.address}
    # 20 kinds of task: more prefixes than the metrics show.
    for n in range(20):
        await c.compute(graph(1 + n % 3, name=f"k{n}"))
    policy = policy_of(s)
    text = await scrape(s)
    shown = samples(text, "dask_amm_rules_memory_flow_produced_bytes_total", **here)
    limit = metrics.FLOW_PREFIXES_BY_PRODUCED + metrics.FLOW_PREFIXES_BY_LIVE
    assert 0 < len(shown) <= limit < len(policy.flow.prefixes)
    # The prefixes shown are those that produced the most.
    produced = {p: e.produced for p, e in policy.flow.prefixes.items()}
    top = sorted(produced.values(), reverse=True)[: metrics.FLOW_PREFIXES_BY_PRODUCED]
    assert sorted((v for v in shown.values()), reverse=True)[: len(top)] == top
    totals = policy.flow.totals()
    assert value(text, "dask_amm_rules_memory_produced_bytes_total", **here) == totals["produced"]
    assert value(text, "dask_amm_rules_memory_tasks_total", **here) == totals["tasks"]
    assert value(text, "dask_amm_rules_memory_flow_prefixes", **here) == len(policy.flow.prefixes)
    assert value(text, "dask_amm_rules_memory_pressure_holding", **here) == 0
    # (tests/observe/test_metrics.py compares every family with docs/observe.md)
    documented_flow = {k: v for k, v in documented().items() if "_memory_" in k}
    assert documented_flow == {k: v for k, v in served(text).items() if "_memory_" in k}
