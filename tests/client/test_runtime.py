"""Runtime targets and introspection from a client: :func:`amm_rules.replicate`,
:func:`amm_rules.explain`, :func:`amm_rules.status`, on sync and async clients."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator

import dask
import dask.array as da
import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import div, gen_cluster, inc

import amm_rules
from amm_rules.client import EngineNotFoundError
from amm_rules.engine import handlers
from amm_rules.language.fields import ActionError
from benchmarks.support.waiting import wait_cycles, wait_for, wait_for_sync
from tests.support.cluster import (
    Requests,
    amm_config,
    copies,
    holders,
    keep,
    policy_of,
    who_has,
)
from tests.support.rulesets import GPU, GPU_POOL, SPOT_POOL, rules

#: Keys with the prefix "three" have 3 copies by rule.
THREE_RULES = rules({"name": "three", "match": 'task.prefix == "three"', "replicate": 3})


# ----------------------------------------------------------------------------------
# Arguments checked on the client, before anything is sent


@pytest.mark.parametrize(
    ("n", "message"),
    [
        (0, r"^n: must be at least 1"),
        (2.5, r"^n: expected a whole number"),
        ("3", r"^n: expected a whole number"),
        (True, r"^n: expected a whole number"),
        ({"min": 3, "max": 2}, r"^n: max \(2\) is below min \(3\)"),
        ({"least": 2}, r"^n: unknown key 'least'"),
    ],
)
def test_bad_n_raises_on_the_client(n, message):
    # No client exists in this test: the check happens before one is looked for.
    with pytest.raises(ActionError, match=message):
        amm_rules.replicate([], n=n)


def test_a_collection_that_was_not_persisted_is_refused():
    with pytest.raises(ValueError, match="persist it first"):
        amm_rules.replicate(da.ones(10, chunks=5), n=2)


# ----------------------------------------------------------------------------------
# Synchronous client


@pytest.fixture
def sync_client() -> Iterator[Client]:
    with (
        dask.config.set(amm_config(THREE_RULES)),
        LocalCluster(
            n_workers=4, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def test_replicate_sync_sets_and_removes_a_target(sync_client):
    client = sync_client
    x = client.submit(inc, 1, key="x-1")
    # The call waits for the task, sets the target and returns the handler's answer.
    assert amm_rules.replicate(x, n=3) == {"set": 1, "missing": []}
    wait_for_sync(lambda: who_has(client, x) == 3, "x-1 at its runtime target of 3")

    # n=None removes the target: reduce-replicas trims the extra copies.
    assert amm_rules.replicate(x, n=None, client=client) == {"set": 1, "missing": []}
    wait_for_sync(lambda: who_has(client, x) == 1, "x-1 trimmed to 1 copy")


def test_replicate_sync_min_max_and_collections(sync_client):
    client = sync_client
    arr = client.persist(da.ones(40, chunks=10) + 1)
    answer = amm_rules.replicate(arr, n={"min": 2, "max": 3})
    assert answer == {"set": 4, "missing": []}
    futures = client.futures_of(arr)
    wait_for_sync(lambda: all(who_has(client, f) == 2 for f in futures), "every chunk at 2")
    # distributed's own Client.replicate sets a target too (legacy-replicate: honour),
    # which replaces this one: its four copies stay.
    client.replicate(futures, n=4)
    assert all(who_has(client, f) == 4 for f in futures)
    explained = amm_rules.explain(futures)
    assert {e["target"]["source"] for e in explained.values()} == {"(client.replicate)"}


def test_replicate_reports_keys_not_in_memory(sync_client):
    client = sync_client
    ok = client.submit(inc, 1, key="ok-1")
    failed = client.submit(div, 1, 0, key="failed-1")
    answer = amm_rules.replicate([ok, failed], n=2)
    assert answer == {"set": 1, "missing": ["failed-1"]}


def test_runtime_target_overrides_the_rules(sync_client):
    client = sync_client
    x = client.submit(inc, 1, key="three-1")
    x.result()
    wait_for_sync(lambda: who_has(client, x) == 3, "three-1 at its rule's 3 copies")
    amm_rules.replicate({"a": x}, n=1)
    wait_for_sync(lambda: who_has(client, x) == 1, "three-1 at its runtime target of 1")
    # Removing the runtime target gives the key back to its rule.
    amm_rules.replicate(x, n=None)
    wait_for_sync(lambda: who_has(client, x) == 3, "three-1 back at its rule's 3 copies")


def test_explain_and_status_sync(sync_client):
    client = sync_client
    x = client.submit(inc, 1, key="three-1")
    wait_for_sync(lambda: who_has(client, x) == 3, "three-1 at its rule's 3 copies")
    answer = amm_rules.explain([x])
    assert set(answer) == {"three-1"}
    explained = answer["three-1"]
    # The rule that decided the target, and where the copies are.
    assert explained["desired"] == "replicate=3 from rule three"
    assert explained["target"] == {"min": 3, "max": 3, "source": "three", "follows_cluster": False}
    assert len(explained["holders"]) == 3 and explained["eligible"] == 4
    assert explained["unmet"] is None and explained["would"] == []

    status = amm_rules.status(client)
    assert (status["source"], status["rules"], status["governed"]) == ("<rules>", ["three"], 1)
    assert status["totals"]["three"] == {"requested": 2, "dropped": 0}


def test_helpers_use_the_default_client(sync_client):
    assert amm_rules.replicate([], n=2) == {"set": 0, "missing": []}
    status = amm_rules.status()
    assert (status["rules"], status["governed"], status["runtime_targets"]) == (["three"], 0, 0)


# ----------------------------------------------------------------------------------
# Asynchronous client


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(), timeout=60)
async def test_replicate_async_returns_an_awaitable(c, s, *workers):
    x = c.submit(inc, 1, key="x-1")
    pending = amm_rules.replicate(x, n=3)
    assert inspect.isawaitable(pending)
    assert await pending == {"set": 1, "missing": []}
    await wait_for(lambda: copies(s, "x-1") == 3, "x-1 at its runtime target of 3")
    status = await amm_rules.status(c)
    assert (status["governed"], status["runtime_targets"]) == (1, 1)

    answer = await amm_rules.replicate([x], n=None)
    assert answer == {"set": 1, "missing": []}
    await wait_for(lambda: copies(s, "x-1") == 1, "x-1 trimmed to 1 copy")

    explained = await amm_rules.explain(x)
    assert set(explained) == {"x-1"}
    assert explained["x-1"]["desired"] == "no rule applies"
    assert list(explained["x-1"]["holders"]) == sorted(holders(s, "x-1"))  # (msgpack: a tuple)
    status = await amm_rules.status(c)
    assert (status["governed"], status["runtime_targets"]) == (0, 0)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(), timeout=90)
async def test_a_runtime_target_lasts_until_the_key_is_released(c, s, *workers):
    x = c.submit(inc, 1, key="x-1")
    await amm_rules.replicate(x, n=2)
    await wait_for(lambda: copies(s, "x-1") == 2, "x-1 at its runtime target of 2")
    del x
    await wait_for(lambda: "x-1" not in s.tasks, "x-1 released")
    # Same key again: the old target went with the released key.
    requests = Requests(s)
    x = c.submit(inc, 1, key="x-1")
    await x
    await wait_cycles(s, 10)
    assert requests.of("x-1") == ({}, {})
    assert copies(s, "x-1") == 1


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(), timeout=60)
async def test_explain_of_more_keys_than_one_call_explains_warns(c, s, a, monkeypatch):
    """The scheduler explains at most EXPLAIN_KEYS keys in one call (here 3): the
    first are explained, and a warning says how many of how many."""
    monkeypatch.setattr(handlers, "EXPLAIN_KEYS", 3)
    keys = [f"x-{i}" for i in range(5)]
    with pytest.warns(
        UserWarning, match=r"explained 3 of 5 keys \(the scheduler explains at most 3"
    ):
        explained = await amm_rules.explain(keys)
    assert list(explained) == keys[:3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(await amm_rules.explain(keys[3:])) == keys[3:]


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_a_scheduler_without_the_engine_is_reported(c, s, a):
    # Without RulesPolicy the scheduler would never answer; the helpers say why instead.
    x = c.submit(inc, 1)
    with pytest.raises(EngineNotFoundError, match="amm_rules.RulesPolicy"):
        await amm_rules.replicate(x, n=2)
    with pytest.raises(EngineNotFoundError):
        await amm_rules.status(c)


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(), timeout=30)
async def test_a_policy_that_detached_is_reported_to_a_client_that_saw_it(c, s, a):
    # A detached policy takes its handlers with it; a client that found the engine
    # before asks again rather than sending a call nobody answers.
    assert "rules" in await amm_rules.status(c)
    policy_of(s).detach()
    with pytest.raises(EngineNotFoundError, match="amm_rules.RulesPolicy"):
        await amm_rules.status(c)


# ----------------------------------------------------------------------------------
# What a runtime target changes, and keys that are not in memory

POOLS = rules(
    {"name": "device", "match": 'task.key matches "x-*"', "pool": "gpu", "avoid": "spot"},
    pools={**GPU_POOL, **SPOT_POOL},
)


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, {"resources": {"GPU": 1, "SPOT": 1}}), ("", 1, GPU), ("", 1)],
    config=amm_config(POOLS),
    timeout=90,
)
async def test_a_runtime_target_changes_only_how_many_copies(c, s, g1, spot, g3, cpu):
    x = c.submit(inc, 1, key="x-1", workers=[cpu.address])
    await x
    await wait_for(lambda: len(holders(s, "x-1") & {g1.address, g3.address}) == 1, "in the pool")
    await wait_for(lambda: copies(s, "x-1") == 1, "the copy outside the pool dropped")
    # Four copies wanted: only g1 and g3 are in the pool and outside the avoided one.
    assert await amm_rules.replicate(x, n=4) == {"set": 1, "missing": []}
    await wait_for(lambda: holders(s, "x-1") == {g1.address, g3.address}, "x-1 on g1 and g3")
    requests = Requests(s)
    await wait_cycles(s, 10)
    assert requests.acquire == {}  # neither the spot GPU worker nor the CPU one
    explained = (await amm_rules.explain(x))["x-1"]
    assert explained["desired"] == (
        "replicate=4 from runtime target, pool=gpu from rule device, avoid=spot from rule device"
    )
    assert explained["eligible"] == 2 and explained["unmet"] is not None
    assert explained["workers"][spot.address] == "in avoided pool spot"
    assert explained["workers"][cpu.address] == "outside pool gpu"


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(THREE_RULES), timeout=60)
async def test_explain_on_keys_not_in_memory_says_so(c, s, a, b):
    erred = c.submit(div, 1, 0, key="three-erred")
    released = c.submit(inc, 1, key="three-released")
    await released
    del released
    await wait_for(lambda: "three-released" not in s.tasks, "three-released forgotten")
    await wait_for(lambda: s.tasks["three-erred"].state == "erred", "three-erred erred")
    explained = await c.scheduler.amm_rules_explain(keys=["three-erred", "three-released"])
    fields = ("state", "holders", "governed", "desired")
    assert {key: {f: e[f] for f in fields} for key, e in explained.items()} == {
        "three-erred": {
            "state": "erred",
            "holders": (),  # (msgpack: a tuple)
            "governed": False,
            "desired": "not in memory",
        },
        "three-released": {
            "state": "unknown",
            "holders": (),
            "governed": False,
            "desired": "not in memory",
        },
    }
    keep(erred)
