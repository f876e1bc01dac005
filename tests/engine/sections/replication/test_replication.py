"""RulesPolicy on a real scheduler and workers: replication targets.

Targets held, extra copies made by ``client.replicate`` and ``scatter(broadcast=True)``
trimmed under ``legacy-replicate: ignore`` (the stock behaviour; what these calls do
by default is in ``test_legacy_replicate.py``), lost copies re-created, ``retire_workers`` cooperation, ``move: never``, the
stock ReduceReplicas replaced, reduce-replicas for ungoverned keys, an invalid rules file
failing the scheduler start.
"""

from __future__ import annotations

import dask
import pytest
from distributed import Scheduler
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules import RulesError
from amm_rules.engine.policy import RulesPolicy
from benchmarks.support.retire import ReplicaLog
from benchmarks.support.waiting import cycle_until, wait_cycles, wait_for
from tests.support.cluster import Requests, amm_config, counts, events, holders, inc, policy_of
from tests.support.rulesets import X_THREE, rule, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

TWO = rules({"name": "two", "match": 'task.prefix == "inc"', "replicate": 2})
# The legacy calls as with the stock AMM: their copies are extra copies.
TWO_IGNORE = {**TWO, "legacy-replicate": "ignore"}
X_THREE_IGNORE = {**X_THREE, "legacy-replicate": "ignore"}


#: Cycles over which a held target is watched for anything asked.
STILL = 10


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(TWO_IGNORE), timeout=90)
async def test_target_is_held_and_others_reduced(c, s, *workers):
    futures = c.map(inc, range(6))
    other = c.submit(sum, [1, 2], key="other-1")
    await c.gather([*futures, other])
    await wait_for(lambda: counts(s, futures) == [2] * 6, "inc keys at 2 copies")
    # Ungoverned data keeps the stock behaviour: one copy.
    await c.replicate([other], n=3)
    await wait_for(lambda: counts(s, [other]) == [1], "other-1 trimmed to 1 copy")
    # Held, not just reached: more cycles ask for nothing.
    requests = Requests(s)
    await wait_cycles(s, STILL)
    assert (requests.acquire, requests.remove) == ({}, {})
    assert counts(s, futures) == [2] * 6
    status = s.handlers["amm_rules_status"]()
    assert status["last_cycle"]["two"]["governed"] == 6
    assert status["totals"]["two"]["requested"] == 6
    # (client.replicate may race the AMM and copy again: at least the two extras)
    assert status["totals"]["(reduce-replicas)"]["dropped"] >= 2


@gen_cluster(client=True, nthreads=[("", 1)] * 5, config=amm_config(TWO_IGNORE), timeout=60)
async def test_extra_copies_from_replicate_are_trimmed_to_target(c, s, *workers):
    futures = c.map(inc, range(3))
    await c.gather(futures)
    await wait_for(lambda: counts(s, futures) == [2] * 3, "inc keys at 2 copies")
    await c.replicate(futures, n=5)
    await wait_for(lambda: counts(s, futures) == [2] * 3, "inc keys trimmed back to 2")
    assert policy_of(s).totals["two"]["dropped"] >= 9


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(X_THREE_IGNORE))
async def test_scatter_broadcast_is_trimmed_to_target(c, s, *workers):
    log = ReplicaLog(s)
    futures = await c.scatter({"x-1": 1, "x-2": 2}, broadcast=True)
    # A copy landed on every worker (the AMM may already have trimmed some).
    assert [len(log.seen(k)) for k in futures] == [4, 4]
    await wait_for(lambda: counts(s, futures) == [3, 3], "x keys trimmed to 3 copies")


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(X_THREE), timeout=90)
async def test_lost_copies_are_recreated_after_a_worker_dies(c, s, *workers):
    futures = await c.scatter({"x-1": 1, "x-2": 2})
    await wait_for(lambda: counts(s, futures) == [3, 3], "x keys at 3 copies")
    victim = next(w for w in workers if w.address in holders(s, "x-1"))
    await victim.close()  # no retirement: the scheduler just loses its copies
    await wait_for(lambda: len(s.workers) == 3, "the victim gone")
    await wait_for(lambda: counts(s, futures) == [3, 3], "x keys back at 3 copies")
    assert victim.address not in holders(s, "x-1")
    # Scattered data cannot be recomputed: it survived because copies were held.
    assert await c.gather(futures) == {"x-1": 1, "x-2": 2}


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(X_THREE), timeout=60)
async def test_retire_workers_holding_copies(c, s, *workers):
    futures = await c.scatter({"x-1": 1, "x-2": 2})
    await wait_for(lambda: counts(s, futures) == [3, 3], "x keys at 3 copies")
    leaving = next(w for w in workers if w.address in holders(s, "x-1"))
    await c.retire_workers([leaving.address])
    assert leaving.address not in s.workers
    await wait_for(lambda: counts(s, futures) == [3, 3], "x keys back at 3 copies")
    assert await c.gather(futures) == {"x-1": 1, "x-2": 2}


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(rules(rule("frozen", "x-*", move="never"), legacy_replicate="ignore")),
    timeout=60,
)
async def test_move_never_is_neither_copied_nor_reduced(c, s, *workers):
    futures = await c.scatter({"x-1": 1, "x-2": 2}, broadcast=True)
    other = await c.scatter({"y-1": 1}, broadcast=True)
    await wait_for(lambda: counts(s, other) == [1], "the ungoverned key reduced")
    requests = Requests(s)
    await wait_cycles(s, STILL)
    assert (requests.acquire, requests.remove) == ({}, {})  # exempt from reduce-replicas
    assert counts(s, futures) == [3, 3]
    assert policy_of(s).last_cycle["frozen"]["governed"] == 2


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(rules(rule("five", "x-*", replicate=5))),
    timeout=90,
)
async def test_unmet_target_is_held_reported_and_not_retried(c, s, *workers):
    futures = await c.scatter({"x-1": 1})
    await wait_for(lambda: counts(s, futures) == [3], "x-1 on every worker")
    policy = policy_of(s)
    await wait_for(lambda: policy.last_cycle.get("five", {}).get("unmet") == 1, "unmet reported")
    requests = Requests(s)
    await wait_cycles(s, STILL)
    assert (requests.acquire, requests.remove) == ({}, {})  # no storm
    assert policy.totals["five"]["requested"] == 2
    assert policy.ctx.ledger.copies == {}


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
    timeout=90,
)
async def test_stock_reduce_replicas_is_removed_with_a_warning(c, s, *workers):
    # The AMM adds configured policies in set order: if ReduceReplicas came after
    # RulesPolicy, it is removed at the first cycle rather than at attach.
    await wait_for(
        lambda: s.extensions["amm"].policies == {policy_of(s)}, "ReduceReplicas removed"
    )
    (event,) = events(s, "reduce-replicas-removed")
    assert event["reason"].startswith(
        "amm-rules removed the stock ReduceReplicas policy from the Active Memory Manager: "
        "it drops every extra copy each cycle and would undo every replication target."
    )
    futures = await c.scatter({"x-1": 1})
    await wait_for(lambda: counts(s, futures) == [3], "x-1 at 3 copies")
    requests = Requests(s)
    await wait_cycles(s, STILL)
    assert requests.remove == {}
    assert counts(s, futures) == [3]


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(X_THREE, start=False))
async def test_attached_to_a_scheduler_already_holding_data(c, s, *workers):
    futures = await c.scatter({"x-1": 1, "x-2": 2}, broadcast=True)
    more = await c.scatter({"y-1": 1}, broadcast=True)
    amm = ActiveMemoryManagerExtension(s, {RulesPolicy(X_THREE)}, register=False, start=False)
    requests = Requests(s)
    await cycle_until(amm, lambda: counts(s, more) == [1], "y-1 reduced to 1 copy")
    assert counts(s, futures) == [3, 3]
    assert {key for _, key in requests.remove} == {"y-1"}
    assert requests.acquire == {}


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
    assert str(info.value).splitlines()[0] == (
        f"{path}:4:17: error: match: task has no attribute 'prefx'; "
        "did you mean 'task.prefix'? (in rule 'bad')"
    )
