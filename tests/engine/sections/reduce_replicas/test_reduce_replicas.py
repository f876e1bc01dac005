"""Keys no rule governs: RulesPolicy applies the stock ``ReduceReplicas`` arithmetic to
them (it replaces that policy, which would undo every replication target), or, with
``reduce-replicas: false``, leaves them alone.

Parity is checked on a real scheduler: the same cluster state (copies, dependents
processing on some holders, dependents not yet assigned, a key with many waiters, and
another policy's suggestions earlier in the same cycle) is handed to the stock policy
and to RulesPolicy in turn, with nothing sent to the workers, and the drops each asks
for are compared. (``tests/engine/decide/test_plan.py`` checks the arithmetic alone.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Hashable
from typing import Any

from distributed import Event
from distributed.active_memory_manager import (
    ActiveMemoryManagerExtension,
    ActiveMemoryManagerPolicy,
    ReduceReplicas,
    Suggestion,
)
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from amm_rules.engine.sections.reduce_replicas import _drop_suggestion
from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import Requests, amm_config, counts, keep
from tests.support.rulesets import X_THREE, rule, rules


def test_the_fast_drop_suggestion_is_the_stock_suggestion():
    ts = object()
    made = _drop_suggestion(ts)
    assert made == Suggestion("drop", ts) and type(made) is Suggestion
    assert (made.op, made.ts, made.candidates) == ("drop", ts, None)


NO_REDUCTION = rules(
    *X_THREE["rules"],
    rule("in-pool", "p-*", pool="all"),
    pools={"all": "true"},
    reduce_replicas=False,
    legacy_replicate="ignore",  # the broadcasts below make extra copies, as with stock Dask
)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(NO_REDUCTION), timeout=60)
async def test_reduce_replicas_false_leaves_keys_without_a_target_alone(c, s, *workers):
    """With ``reduce-replicas: false``, a key no rule governs keeps every copy, and so
    does a governed key without ``replicate``; a rule's target is still held."""
    free = await c.scatter({"y-1": 1}, broadcast=True)
    pooled = await c.scatter({"p-1": 1}, broadcast=True)
    governed = await c.scatter({"x-1": 1, "x-2": 2}, broadcast=True)
    await wait_for(lambda: counts(s, governed) == [3, 3], "x keys trimmed to their rule's 3")
    requests = Requests(s)
    await wait_cycles(s, 10)
    assert (requests.acquire, requests.remove) == ({}, {})
    assert counts(s, ["y-1", "p-1"]) == [4, 4]
    status = await c.scheduler.amm_rules_status()
    assert status["reduce_replicas"] is False
    assert "(reduce-replicas)" not in status["totals"]
    keep(free, pooled)


class InOrder(ActiveMemoryManagerPolicy):
    """Policies run one after the other, in the order given (the AMM's own policies
    are a set: their order is arbitrary)."""

    def __init__(self, *policies: ActiveMemoryManagerPolicy):
        self.policies = policies

    @property  # type: ignore[override]
    def manager(self) -> Any:
        return self._manager

    @manager.setter
    def manager(self, manager: Any) -> None:
        self._manager = manager
        for policy in self.policies:
            policy.manager = manager

    def run(self) -> Generator[Suggestion, Any, None]:
        for policy in self.policies:
            yield from policy.run()


class Other(ActiveMemoryManagerPolicy):
    """Another policy: a copy of one key to a worker, and a drop of another key."""

    def __init__(self, copy: tuple[str, str], drop: tuple[str, str]):
        self.copy, self.drop = copy, drop

    def run(self) -> Generator[Suggestion, Any, None]:
        scheduler = self.manager.scheduler
        for op, (key, addr) in (("replicate", self.copy), ("drop", self.drop)):
            answer = yield Suggestion(op, scheduler.tasks[key], {scheduler.workers[addr]})
            assert answer is not None, (op, key, addr)  # accepted: pending for the reducer


def gate(x: Any, name: str) -> Any:
    Event(name).wait()
    return x


def dropped(requests: Requests) -> Counter[Hashable]:
    return Counter(key for (_, key), n in requests.remove.items() for _ in range(n))


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 4,
    config={
        **amm_config(start=False),
        # Memory by managed bytes: both runs see the same loads.
        "distributed.scheduler.active-memory-manager.measure": "managed",
    },
    timeout=90,
)
async def test_parity_with_the_stock_reduce_replicas_on_a_real_scheduler(c, s, w0, w1, w2, w3):
    everywhere = [w.address for w in (w0, w1, w2, w3)]
    data = await c.scatter(
        {"plain-1": 1, "waited-1": 2, "unassigned-1": 3, "many-1": 4}, broadcast=True
    )
    for key, value, holders in (("pending-1", 5, 2), ("dropping-1", 6, 3)):
        data.update(await c.scatter({key: value}, workers=[w0.address]))
        await c.replicate([data[key]], n=holders, workers=everywhere[:holders])
    # Dependents processing on w0 and w1 (each holds a copy of waited-1) ...
    go = Event("go")
    processing = [
        c.submit(gate, data["waited-1"], "go", key=f"reader-{i}", workers=[addr], pure=False)
        for i, addr in enumerate(everywhere[:2])
    ]
    # ... and dependents waiting for an input that is not ready: no worker yet.
    later = c.submit(gate, 0, "go", key="later", workers=[w2.address])
    unassigned = [c.submit(sum, [data["unassigned-1"], later], key=f"u-{i}") for i in range(2)]
    many = [c.submit(sum, [data["many-1"], later], key=f"m-{i}") for i in range(25)]

    def ready() -> bool:
        return [len(s.tasks[k].waiters or ()) for k in ("waited-1", "unassigned-1", "many-1")] == [
            2,
            2,
            25,
        ] and all(s.tasks[f.key].state == "processing" for f in processing)

    await wait_for(ready, "dependents processing on w0, w1 and waiting")
    assert counts(s, data) == [4, 4, 4, 4, 2, 3]
    other = ("pending-1", w2.address), ("dropping-1", w0.address)

    requests = Requests(s, forward=False)  # nothing reaches the workers
    stock = ActiveMemoryManagerExtension(
        s, {InOrder(Other(*other), ReduceReplicas())}, register=False, start=False
    )
    stock.run_once()
    stock_drops, stock_copies = dropped(requests), Counter(requests.acquire)
    stock_removed = set(requests.remove)
    requests.clear()
    ours = RulesPolicy(rules())
    amm = ActiveMemoryManagerExtension(
        s, {InOrder(Other(*other), ours)}, register=False, start=False
    )
    amm.run_once()
    ours.detach()
    requests.stop()

    # The same drops per key as the stock policy, and the other policy's copy.
    assert dropped(requests) == stock_drops
    assert Counter(requests.acquire) == stock_copies == {(w2.address, "pending-1"): 1}
    assert stock_drops == {
        "plain-1": 3,  # no waiters: one copy
        "waited-1": 2,  # a copy for each of the two workers where its dependents run
        "unassigned-1": 2,  # two unassigned dependents count one each
        "pending-1": 1,  # a copy pending: one drop asked more, the AMM keeps two copies
        "dropping-1": 1 + 1,  # the other policy's drop, then one more
    }  # many-1: 25 waiters, the plain count: nothing dropped
    # Never where a dependent is processing.
    for removed in (stock_removed, set(requests.remove)):
        assert not {(w0.address, "waited-1"), (w1.address, "waited-1")} & removed
    await go.set()
    assert await c.gather(processing) == [2, 2]
    keep(unassigned, many)
