"""Runtime targets and introspection from a client: :func:`amm_rules.replicate`,
:func:`amm_rules.explain`, :func:`amm_rules.status`, on sync and async clients."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import dask
import pytest
from distributed import Client, LocalCluster
from distributed.utils_test import async_poll_for, div, gen_cluster, inc, poll_for

import amm_rules
from amm_rules.client import EngineNotFoundError
from amm_rules.language.fields import ActionError
from tests.support.cluster import amm_config, copies, more_cycles

#: Keys with the prefix "three" have 3 copies by rule.
THREE_RULES = {
    "version": 1,
    "rules": [{"name": "three", "match": 'task.prefix == "three"', "replicate": 3}],
}


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
    da = pytest.importorskip("dask.array")
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


def who_has(client: Client, future: Any) -> int:
    return len(client.who_has(future).get(future.key, ()))


def test_replicate_sync_sets_and_removes_a_target(sync_client):
    client = sync_client
    x = client.submit(inc, 1, key="x-1")
    # The call waits for the task, sets the target and returns the handler's answer.
    assert amm_rules.replicate(x, n=3) == {"set": 1, "missing": []}
    poll_for(lambda: who_has(client, x) == 3, timeout=10)

    # n=None removes the target: reduce-replicas trims the extra copies.
    assert amm_rules.replicate(x, n=None, client=client)["set"] == 1
    poll_for(lambda: who_has(client, x) == 1, timeout=10)


def test_replicate_sync_min_max_and_collections(sync_client):
    da = pytest.importorskip("dask.array")
    client = sync_client
    arr = client.persist(da.ones(40, chunks=10) + 1)
    answer = amm_rules.replicate(arr, n={"min": 2, "max": 3})
    assert answer == {"set": 4, "missing": []}
    futures = client.futures_of(arr)
    poll_for(lambda: all(who_has(client, f) == 2 for f in futures), timeout=10)
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
    assert answer["set"] == 1
    assert answer["missing"] == ["failed-1"]


def test_runtime_target_overrides_the_rules(sync_client):
    client = sync_client
    x = client.submit(inc, 1, key="three-1")
    x.result()
    poll_for(lambda: who_has(client, x) == 3, timeout=10)
    amm_rules.replicate({"a": x}, n=1)
    poll_for(lambda: who_has(client, x) == 1, timeout=10)
    # Removing the runtime target gives the key back to its rule.
    amm_rules.replicate(x, n=None)
    poll_for(lambda: who_has(client, x) == 3, timeout=10)


def test_explain_and_status_sync(sync_client):
    client = sync_client
    x = client.submit(inc, 1, key="three-1")
    poll_for(lambda: who_has(client, x) == 3, timeout=10)
    answer = amm_rules.explain([x])
    assert set(answer) == {"three-1"}
    assert "three" in str(answer["three-1"])  # the rule that decided the target

    status = amm_rules.status(client)
    assert isinstance(status, dict)
    assert "three" in str(status)


def test_helpers_use_the_default_client(sync_client):
    assert amm_rules.replicate([], n=2) == {"set": 0, "missing": []}
    assert isinstance(amm_rules.status(), dict)


# ----------------------------------------------------------------------------------
# Asynchronous client


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config())
async def test_replicate_async_returns_an_awaitable(c, s, *workers):
    x = c.submit(inc, 1, key="x-1")
    pending = amm_rules.replicate(x, n=3)
    assert inspect.isawaitable(pending)
    assert await pending == {"set": 1, "missing": []}
    await async_poll_for(lambda: copies(s, "x-1") == 3, timeout=10)

    answer = await amm_rules.replicate([x], n=None)
    assert answer["set"] == 1
    await async_poll_for(lambda: copies(s, "x-1") == 1, timeout=10)

    explained = await amm_rules.explain(x)
    assert set(explained) == {"x-1"}
    assert isinstance(await amm_rules.status(c), dict)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config())
async def test_a_runtime_target_lasts_until_the_key_is_released(c, s, *workers):
    x = c.submit(inc, 1, key="x-1")
    await amm_rules.replicate(x, n=2)
    await async_poll_for(lambda: copies(s, "x-1") == 2, timeout=10)
    del x
    await async_poll_for(lambda: "x-1" not in s.tasks, timeout=10)
    # Same key again: the old target went with the released key.
    x = c.submit(inc, 1, key="x-1")
    await x
    await more_cycles(s)
    assert copies(s, "x-1") == 1


@gen_cluster(client=True, nthreads=[("", 1)])
async def test_a_scheduler_without_the_engine_is_reported(c, s, a):
    # Without RulesPolicy the scheduler would never answer; the helpers say why instead.
    x = c.submit(inc, 1)
    with pytest.raises(EngineNotFoundError, match="amm_rules.RulesPolicy"):
        await amm_rules.replicate(x, n=2)
    with pytest.raises(EngineNotFoundError):
        await amm_rules.status(c)
