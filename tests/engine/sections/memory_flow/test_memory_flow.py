"""Memory flow per task prefix (:mod:`amm_rules.engine.state.flow`) on a real scheduler:
bytes produced, freed (unique bytes), freed because a task finished, live, tasks, net
per task; the stimulus that ties a task's completion to the inputs it releases; the
bound on prefixes; the ``task.prefix_*`` attributes in rules, re-classified as the
figures move; ``amm_rules.memory_flow`` and the status."""

from __future__ import annotations

from typing import Any

import pytest
from distributed.diagnostics.plugin import SchedulerPlugin
from distributed.utils_test import gen_cluster

import amm_rules
from amm_rules.engine.state import flow as flow_module
from amm_rules.engine.state.flow import MemoryFlow, PrefixFacts
from amm_rules.engine.state.index import KeyIndex
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, no_errors, policy_of, rules
from tests.support.flow import graph as flow_graph
from tests.support.flow import make

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

SIZE = 200_000


def graph(n: int) -> Any:
    """n inputs of prefix ``inp`` consumed by one ``cons`` task (tests.support.flow)."""
    return flow_graph(n, size=SIZE, consumer="cons")


class Stimuli(SchedulerPlugin):
    """Every transition in or out of memory, with its stimulus."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, str, str, str]] = []

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if "memory" in (start, finish):
            self.seen.append((key, start, finish, kwargs["stimulus_id"]))


@gen_cluster(client=True, config=amm_config())
async def test_a_finished_task_releases_its_inputs_in_its_own_stimulus(c, s, a, b):
    """What freed_by rests on, checked on the installed distributed."""
    stimuli = Stimuli()
    s.add_plugin(stimuli, name="stimuli")
    assert await c.compute(graph(4)) == 4 * SIZE
    (finished,) = [x for x in stimuli.seen if x[0] == "cons" and x[1] == "processing"]
    released = [x for x in stimuli.seen if x[0][0] == "inp" and x[1] == "memory"]
    assert len(released) == 4
    assert {x[3] for x in released} == {finished[3]}
    # ... and after the task entered memory.
    assert stimuli.seen.index(finished) < min(stimuli.seen.index(x) for x in released)


@gen_cluster(client=True, config=amm_config())
async def test_produced_freed_freed_by_live_tasks_and_net(c, s, a, b):
    assert await c.compute(graph(4)) == 4 * SIZE
    table = await amm_rules.memory_flow(c)
    inp, cons = table["inp"], table["cons"]
    assert inp["tasks"] == 4 and cons["tasks"] == 1
    assert inp["produced"] >= 4 * SIZE
    # Every input left memory once, because the consumer finished.
    assert inp["freed"] == inp["produced"] == cons["freed_by"]
    assert inp["freed_by"] == 0 and inp["live"] == 0
    assert inp["net_per_task"] == pytest.approx(inp["produced"] / 4)
    # The consumer freed far more than it made.
    assert cons["net_per_task"] == pytest.approx(cons["produced"] - cons["freed_by"])
    assert cons["net_per_task"] < -3 * SIZE
    no_errors(s)


@gen_cluster(client=True, config=amm_config())
async def test_live_bytes_and_freed_by_a_client_are_not_freed_by_a_task(c, s, a, b):
    futures = c.map(make, range(3), n=SIZE, key=[f"held-{i}" for i in range(3)])
    await c.gather(futures)
    table = await amm_rules.memory_flow(c)
    assert table["held"]["live"] == table["held"]["produced"] >= 3 * SIZE
    assert table["held"]["freed"] == 0
    del futures
    await wait_for(lambda: not s.tasks, "not s.tasks")
    table = await amm_rules.memory_flow(c)
    assert table["held"]["live"] == 0
    assert table["held"]["freed"] == table["held"]["produced"]
    # Released by the client: nobody's freed_by.
    assert sum(row["freed_by"] for row in table.values()) == 0


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config())
async def test_replicas_and_scattered_data_count_once(c, s, *workers):
    (x,) = await c.scatter([make(1)], broadcast=True)
    scattered = s.tasks[x.key].prefix.name
    future = c.submit(make, 2, key="copied-1")
    await future
    await c.replicate([future], n=3)
    table = await amm_rules.memory_flow(c)
    nbytes = s.tasks["copied-1"].nbytes
    assert table["copied"]["live"] == table["copied"]["produced"] == nbytes
    assert table[scattered]["live"] == s.tasks[x.key].nbytes
    assert table[scattered]["tasks"] == 0 and table[scattered]["net_per_task"] is None
    del x, future
    await wait_for(lambda: not s.tasks, "not s.tasks")
    table = await amm_rules.memory_flow(c)
    assert table["copied"]["freed"] == nbytes  # unique bytes, not three replicas
    assert table[scattered]["live"] == 0


@gen_cluster(client=True, config=amm_config())
async def test_status_names_top_producers_and_freers(c, s, a, b):
    await c.compute(graph(3))
    status = s.handlers["amm_rules_status"]()["memory_flow"]
    producers = [row["prefix"] for row in status["top_producers"]]
    assert producers == ["inp"]  # cons frees more than it makes
    (freer,) = status["top_freers"]
    assert freer["prefix"] == "cons" and freer["freed_by"] >= 3 * SIZE
    assert status["prefixes"] == 2 and status["evicted"] == 0
    assert status["totals"]["tasks"] == 4
    assert status["totals"]["produced"] == sum(row["produced"] for row in policy_rows(s))


@gen_cluster(client=True, config=amm_config())
async def test_the_engine_counts_as_the_flow_would_as_a_plugin_of_its_own(c, s, a, b):
    """The engine's index feeds its flow (one scheduler plugin, not two): on the
    scheduler's real transitions, the same figures as a MemoryFlow plugin."""
    policy = policy_of(s)
    assert [p for p in s.plugins.values() if p is policy.flow] == []
    assert policy.index.flow is policy.flow
    alone = MemoryFlow(s.tasks)
    s.add_plugin(alone, name="flow-alone")
    assert await c.compute(graph(4)) == 4 * SIZE
    held = c.map(make, range(3), n=SIZE, key=[f"held-{i}" for i in range(3)])
    await c.gather(held)
    del held[1:]
    await wait_for(lambda: len(s.tasks) == 1, "len(s.tasks) == 1")
    assert policy.flow.table() == alone.table()
    assert policy.flow.table()["cons"]["freed_by"] >= 4 * SIZE
    assert policy.flow.table()["held"]["live"] > 0


def policy_rows(s: Any) -> list[dict[str, Any]]:
    return list(policy_of(s).flow.table().values())


class _Task:
    def __init__(self, key: str, prefix: str, nbytes: int, state: str = "memory"):
        self.key = key
        self.prefix = type("P", (), {"name": prefix})()
        self.nbytes = nbytes
        self.state = state


def test_prefixes_are_bounded(monkeypatch):
    monkeypatch.setattr(flow_module, "MAX_PREFIXES", 50)
    tasks: dict[str, _Task] = {}
    flow = MemoryFlow(tasks)
    for i in range(200):
        key = f"p{i}-1"
        tasks[key] = _Task(key, f"p{i}", 10)
        flow.transition(key, "processing", "memory", stimulus_id=f"s{i}")
        if i % 2:
            flow.transition(key, "memory", "released", stimulus_id="client")
    assert len(flow.prefixes) <= 50
    assert flow.evicted == 200 - len(flow.prefixes)
    # Prefixes holding memory were kept before those with nothing in memory.
    assert sum(e.live > 0 for e in flow.prefixes.values()) > 25
    assert "p199" in flow.prefixes


def test_figures_are_republished_when_they_moved_by_more_than_the_tolerance():
    tasks: dict[str, _Task] = {}
    flow = MemoryFlow(tasks)

    def finish(i: int, nbytes: int) -> None:
        key = f"x-{i}"
        tasks[key] = _Task(key, "x", nbytes)
        flow.transition(key, "processing", "memory", stimulus_id=f"s{i}")

    assert flow.publish() == []  # nothing finished
    finish(0, 1000)
    assert flow.publish() == ["x"]
    assert flow.facts("x") == PrefixFacts(1, 1000.0, 0.0, 1000.0)
    finish(1, 1050)  # the average moves by 2.5%, the task count doubles
    assert flow.publish() == ["x"]
    for i in range(2, 20):
        finish(i, 1000)
    flow.publish()
    published = flow.facts("x")
    finish(20, 1000)  # one task in 20: within the tolerance everywhere
    assert flow.publish() == []
    assert flow.facts("x") is published


FLOW_RULE = rules(
    {"name": "producers", "match": "task.prefix_net_per_task > 100 kB", "replicate": 2},
    {"name": "counted", "match": "task.prefix_tasks >= 1", "avoid": "none"},
    pools={"none": "false"},
)


@gen_cluster(client=True, config=amm_config(FLOW_RULE), timeout=60)
async def test_rules_read_the_flow_and_keys_are_classified_again_as_it_moves(c, s, a, b):
    policy = policy_of(s)
    assert policy.flow.track_keys
    big = c.map(make, range(4), n=SIZE, key=[f"big-{i}" for i in range(4)])
    small = c.map(make, range(4), n=10, key=[f"small-{i}" for i in range(4)])
    await c.gather(big + small)
    # Every big key, those classified before their prefix had figures included,
    # ends up governed by the rule reading the flow.
    await wait_for(
        lambda: all(len(s.tasks[f.key].who_has) == 2 for f in big),
        "all(len(s.tasks[f.key].who_has) == 2 for f in big)",
    )
    assert all(len(s.tasks[f.key].who_has) == 1 for f in small)
    # The small keys' figures are published at the first cycle after they finished,
    # which may come after the big keys got their copies.
    await wait_for(lambda: "small" in policy.flow.published, "'small' in policy.flow.published")
    explained = await amm_rules.explain(big[:1] + small[:1], client=c)
    assert explained["big-0"]["desired"].startswith("replicate=2 from rule producers")
    assert "replicate" not in explained["small-0"]["fields"]
    assert list(explained["small-0"]["fields"]["avoid"]) == ["none"]
    no_errors(s)


@gen_cluster(
    client=True,
    config=amm_config(rules({"name": "n", "match": 'task.prefix == "x"', "replicate": 2})),
)
async def test_keys_are_not_tracked_when_no_rule_reads_the_flow(c, s, a, b):
    await c.gather(c.map(make, range(3)))
    policy = policy_of(s)
    assert not policy.flow.track_keys
    assert all(e.keys is None for e in policy.flow.prefixes.values())


def fed(way: str, tasks: dict[str, _Task]) -> tuple[MemoryFlow, Any]:
    """A memory flow and the transition hook that feeds it: the flow as a scheduler
    plugin of its own, or the engine's index handing it what enters and leaves memory."""
    flow = MemoryFlow(tasks)
    if way == "plugin":
        return flow, flow.transition
    index = KeyIndex()
    index.attach(tasks)
    index.follow_flow(flow)
    return flow, index.transition


@pytest.mark.parametrize("way", ["plugin", "index"])
def test_freed_by_counts_other_keys_of_the_same_stimulus_only(way):
    tasks = {
        "a-1": _Task("a-1", "a", 100),
        "a-2": _Task("a-2", "a", 100),
        "b-1": _Task("b-1", "b", 10),
        "c-1": _Task("c-1", "c", 1),
    }
    flow, transition = fed(way, tasks)
    for key in ("a-1", "a-2"):
        transition(key, "released", "waiting", stimulus_id="graph")  # seen by neither
        transition(key, "waiting", "processing", stimulus_id="graph")
        transition(key, "processing", "memory", stimulus_id=f"done-{key}")
    transition("b-1", "processing", "memory", stimulus_id="done-b")
    transition("a-1", "memory", "released", stimulus_id="done-b")  # b's last input
    transition("a-1", "released", "forgotten", stimulus_id="done-b")
    transition("b-1", "memory", "forgotten", stimulus_id="done-b")  # b itself
    transition("a-2", "memory", "released", stimulus_id="client-releases")
    transition("c-1", "waiting", "memory", stimulus_id="add-keys")  # not computed here
    table = flow.table()
    assert table["b"]["freed_by"] == 100  # a-1 only: not a-2, not b's own result
    assert table["a"]["freed"] == 200 and table["a"]["freed_by"] == 0
    assert table["b"]["net_per_task"] == -90.0
    assert table["c"] == {
        "produced": 0,
        "freed": 0,
        "freed_by": 0,
        "live": 1,
        "tasks": 0,
        "net_per_task": None,
    }
    assert flow.totals() == {"produced": 210, "freed": 210, "freed_by": 100, "tasks": 3, "live": 1}
