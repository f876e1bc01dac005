"""RulesPolicy on a real scheduler and workers: replication targets.

Targets held, extra copies made by ``client.replicate`` and ``scatter(broadcast=True)``
trimmed under ``legacy-replicate: ignore`` (the stock behaviour; what these calls do
by default is in ``test_legacy_replicate.py``), lost copies re-created, ``retire_workers`` cooperation, ``move: never``, the
stock ReduceReplicas replaced, reduce-replicas for ungoverned keys, an invalid rules file
failing the scheduler start.
"""

from __future__ import annotations

import asyncio

import dask
import pytest
from distributed import Scheduler
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import async_poll_for, gen_cluster

from amm_rules import RulesError
from amm_rules.engine.policy import RulesPolicy
from tests.support.cluster import amm_config, events, holders, inc, no_errors, policy_of, rules

TWO = rules({"name": "two", "match": 'task.prefix == "inc"', "replicate": 2})
X_THREE = rules({"name": "three", "match": 'task.key matches "x-*"', "replicate": 3})
# The legacy calls as with the stock AMM: their copies are extra copies.
TWO_IGNORE = {**TWO, "legacy-replicate": "ignore"}
X_THREE_IGNORE = {**X_THREE, "legacy-replicate": "ignore"}


def counts(s, futures):
    return [len(s.tasks[f.key].who_has or ()) for f in futures]


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(TWO_IGNORE))
async def test_target_is_held_and_others_reduced(c, s, *workers):
    futures = c.map(inc, range(6))
    other = c.submit(sum, [1, 2], key="other-1")
    await c.gather([*futures, other])
    await async_poll_for(lambda: counts(s, futures) == [2] * 6, timeout=5)
    # Ungoverned data keeps the stock behaviour: one copy.
    await c.replicate([other], n=3)
    await async_poll_for(lambda: len(holders(s, "other-1")) == 1, timeout=5)
    await asyncio.sleep(0.3)  # several cycles: the target holds still
    assert counts(s, futures) == [2] * 6
    status = s.handlers["amm_rules_status"]()
    assert status["last_cycle"]["two"]["governed"] == 6
    assert status["totals"]["two"]["requested"] == 6
    # (client.replicate may race the AMM and copy again: at least the two extras)
    assert status["totals"]["(reduce-replicas)"]["dropped"] >= 2
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 5, config=amm_config(TWO_IGNORE))
async def test_extra_copies_from_replicate_are_trimmed_to_target(c, s, *workers):
    futures = c.map(inc, range(3))
    await c.gather(futures)
    await async_poll_for(lambda: counts(s, futures) == [2] * 3, timeout=5)
    await c.replicate(futures, n=5)
    await async_poll_for(lambda: counts(s, futures) == [2] * 3, timeout=5)
    assert events(s, "cycle")
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(X_THREE_IGNORE))
async def test_scatter_broadcast_is_trimmed_to_target(c, s, *workers):
    futures = await c.scatter({"x-1": 1, "x-2": 2}, broadcast=True)
    assert len(holders(s, "x-1")) == 4
    await async_poll_for(lambda: counts(s, futures.values()) == [3, 3], timeout=5)
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(X_THREE))
async def test_lost_copies_are_recreated_after_a_worker_dies(c, s, *workers):
    futures = await c.scatter({"x-1": 1, "x-2": 2})
    await async_poll_for(lambda: counts(s, futures.values()) == [3, 3], timeout=5)
    victim = next(w for w in workers if w.address in holders(s, "x-1"))
    await victim.close()  # no retirement: the scheduler just loses its copies
    await async_poll_for(lambda: len(s.workers) == 3, timeout=5)
    await async_poll_for(lambda: counts(s, futures.values()) == [3, 3], timeout=5)
    assert victim.address not in holders(s, "x-1")
    # Scattered data cannot be recomputed: it survived because copies were held.
    assert await c.gather(futures) == {"x-1": 1, "x-2": 2}
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(X_THREE))
async def test_retire_workers_holding_copies(c, s, *workers):
    futures = await c.scatter({"x-1": 1, "x-2": 2})
    await async_poll_for(lambda: counts(s, futures.values()) == [3, 3], timeout=5)
    leaving = next(w for w in workers if w.address in holders(s, "x-1"))
    await c.retire_workers([leaving.address])
    assert leaving.address not in s.workers
    await async_poll_for(lambda: counts(s, futures.values()) == [3, 3], timeout=5)
    assert await c.gather(futures) == {"x-1": 1, "x-2": 2}
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(
        rules(
            {"name": "frozen", "match": 'task.key matches "x-*"', "move": "never"},
            legacy_replicate="ignore",
        )
    ),
)
async def test_move_never_is_neither_copied_nor_reduced(c, s, *workers):
    futures = await c.scatter({"x-1": 1, "x-2": 2}, broadcast=True)
    other = await c.scatter({"y-1": 1}, broadcast=True)
    await async_poll_for(lambda: counts(s, other.values()) == [1], timeout=5)  # reduced
    await asyncio.sleep(0.3)
    assert counts(s, futures.values()) == [3, 3]  # exempt from reduce-replicas
    assert policy_of(s).last_cycle["frozen"]["governed"] == 2
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(rules({"name": "five", "match": 'task.key matches "x-*"', "replicate": 5})),
)
async def test_unmet_target_is_held_reported_and_not_retried(c, s, *workers):
    futures = await c.scatter({"x-1": 1})
    await async_poll_for(lambda: counts(s, futures.values()) == [3], timeout=5)
    policy = policy_of(s)
    await async_poll_for(lambda: policy.last_cycle.get("five", {}).get("unmet") == 1, timeout=5)
    requested = policy.totals["five"]["requested"]
    await asyncio.sleep(0.3)
    assert policy.totals["five"]["requested"] == requested == 2  # no storm
    assert policy.index.inflight == {}
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config={
        **amm_config(X_THREE),
        "distributed.scheduler.active-memory-manager.policies": [
            {"class": "distributed.active_memory_manager.ReduceReplicas"},
            {"class": "amm_rules.RulesPolicy", "rules": X_THREE},
        ],
    },
)
async def test_stock_reduce_replicas_is_removed_with_a_warning(c, s, *workers):
    # The AMM adds configured policies in set order: if ReduceReplicas came after
    # RulesPolicy, it is removed at the first cycle rather than at attach.
    await async_poll_for(lambda: s.extensions["amm"].policies == {policy_of(s)}, timeout=5)
    (event,) = events(s, "reduce-replicas-removed")
    assert "would undo every replication target" in event["reason"]
    futures = await c.scatter({"x-1": 1})
    await async_poll_for(lambda: counts(s, futures.values()) == [3], timeout=5)
    await asyncio.sleep(0.2)
    assert counts(s, futures.values()) == [3]
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(X_THREE, start=False))
async def test_attached_to_a_scheduler_already_holding_data(c, s, *workers):
    futures = await c.scatter({"x-1": 1, "x-2": 2}, broadcast=True)
    more = await c.scatter({"y-1": 1}, broadcast=True)
    amm = ActiveMemoryManagerExtension(s, {RulesPolicy(X_THREE)}, register=False, start=False)
    amm.run_once()
    await asyncio.sleep(0.1)
    assert counts(s, futures.values()) == [3, 3]
    assert counts(s, more.values()) == [1]
    no_errors(s)


def test_invalid_rules_fail_the_scheduler_start(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "version: 1\nrules:\n  - name: bad\n    match: task.prefx == 'a'\n    replicate: 2\n"
    )
    policies = [{"class": "amm_rules.RulesPolicy", "rules": str(path)}]
    with (
        dask.config.set({"distributed.scheduler.active-memory-manager.policies": policies}),
        pytest.raises(RulesError) as info,
    ):
        Scheduler(dashboard_address=":0", validate=True)
    assert str(info.value).startswith(f"{path}:4:")
    assert "prefx" in str(info.value)


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(X_THREE, start=False))
async def test_detach_stops_listening(c, s, a, b):
    policy = RulesPolicy(X_THREE)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    assert "amm_rules_status" in s.handlers
    policy.detach()
    assert policy not in amm.policies
    assert "amm_rules_status" not in s.handlers
    assert policy.index not in s.plugins.values()
    futures = await c.scatter({"x-1": 1}, broadcast=True)
    assert not policy.index.dirty and not policy.index.touched
    assert list(futures) == ["x-1"]
