"""distributed's own ``Client.replicate`` and ``Client.scatter(..., broadcast=...)`` under
RulesPolicy, on real clusters: lasting targets by default (``legacy-replicate: honour``),
the stock behaviour with ``legacy-replicate: ignore``.

What is checked: the copies survive ten cycles; a broadcast follows the cluster (a worker
that joins gets a copy, one that leaves does not leave the key unmet); pools and
``move: never`` apply to these copies; ``explain`` names the call; the legacy call's own
deletion is replaced by the engine's trimming, and the engine does not copy a key while
the call is copying it; the switch (in the file, and by a reload) restores the stock
behaviour; errors of the stock call reach the client unchanged; detaching puts the
scheduler's own handlers back.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from distributed import Worker, wait
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import BlockedGetData, gen_cluster

from amm_rules.engine.policy import RulesPolicy
from amm_rules.observe.conformance import conformance
from benchmarks.support.waiting import cycle_until, wait_cycles, wait_for
from tests.support.cluster import amm_config, events, holders, inc, no_errors, policy_of, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

GPU = {"resources": {"GPU": 1}}
POOLS = {"gpu": "worker.resources.GPU >= 1"}
EMPTY = rules()
IGNORE = rules(legacy_replicate="ignore")


async def survive(s: Any, n: int = 10) -> None:
    """Wait for ``n`` more AMM cycles of the policy."""
    await wait_cycles(s, n)


async def explain(c: Any, key: str) -> dict[str, Any]:
    return (await c.scheduler.amm_rules_explain(keys=[key]))[key]


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(EMPTY), timeout=60)
async def test_replicate_and_broadcast_survive_ten_cycles(c, s, *workers):
    x = c.submit(inc, 1, key="x-1")
    await x
    await c.replicate([x], n=3)
    assert len(holders(s, "x-1")) == 3  # made by the call, as with stock Dask
    (y,) = await c.scatter([10], broadcast=True)
    assert len(holders(s, y.key)) == 4
    await survive(s)
    assert len(holders(s, "x-1")) == 3 and len(holders(s, y.key)) == 4
    policy = policy_of(s)
    assert policy.totals["(client.replicate)"]["dropped"] == 0
    assert policy.totals["(scatter broadcast)"]["dropped"] == 0

    x_why, y_why = await explain(c, "x-1"), await explain(c, y.key)
    assert x_why["desired"] == "replicate=3 from client.replicate"
    assert x_why["target"]["source"] == "(client.replicate)"
    assert y_why["desired"] == "replicate=all from scatter broadcast"
    assert y_why["target"] == {
        "min": 4,
        "max": 4,
        "source": "(scatter broadcast)",
        "follows_cluster": True,
    }
    # What operators read: the cascade names the call, and the calls' targets have
    # their own rows in the conformance (kind "runtime"), met.
    assert y_why["cascade"][0]["source"] == "scatter broadcast"
    assert y_why["cascade"][0]["sets"] == {"replicate": "all"}
    assert "holds its target: 4 copies" in y_why["summary"]
    rows = {r.name: r for r in conformance(policy_of(s)).rules}
    assert rows["(scatter broadcast)"].kind == "runtime"
    assert rows["(scatter broadcast)"].keys == 1 and rows["(scatter broadcast)"].met == 1
    assert rows["(client.replicate)"].keys == 1 and rows["(client.replicate)"].met == 1
    status = await c.scheduler.amm_rules_status()
    assert status["legacy_replicate"]["mode"] == "honour"
    assert status["legacy_replicate"]["calls"] == {"client.replicate": 1, "scatter broadcast": 1}
    assert status["legacy_replicate"]["targets"] == 2
    # Released keys take their targets with them.
    del x, y
    await wait_for(lambda: not policy.index.runtime, "no runtime target left")
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(EMPTY))
async def test_broadcast_n_and_replicate_with_workers(c, s, a, b, w3, w4):
    (y,) = await c.scatter([20], broadcast=2)
    assert len(holders(s, y.key)) == 2
    x = c.submit(inc, 2, key="x-2", workers=[a.address])
    await x
    # n=None with workers: every one of those workers, and no more.
    await c.replicate([x], workers=[a.address, b.address, w3.address])
    assert holders(s, "x-2") == {a.address, b.address, w3.address}
    await survive(s)
    assert len(holders(s, y.key)) == 2
    assert holders(s, "x-2") == {a.address, b.address, w3.address}
    assert (await explain(c, y.key))["desired"] == "replicate=2 from scatter broadcast"
    assert (await explain(c, "x-2"))["desired"] == "replicate=3 from client.replicate"
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(EMPTY), timeout=60)
async def test_a_joining_worker_receives_the_broadcast_key(c, s, a, b):
    (y,) = await c.scatter([30], broadcast=True)
    assert holders(s, y.key) == {a.address, b.address}
    async with Worker(s.address, nthreads=1) as newcomer:
        await wait_for(lambda: newcomer.address in holders(s, y.key), "a copy on the newcomer")
        assert newcomer.data[y.key] == 30
        await survive(s, 5)
        assert len(holders(s, y.key)) == 3
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(EMPTY), timeout=90)
async def test_a_leaving_worker_does_not_leave_the_key_unmet(c, s, a, b, w3):
    (y,) = await c.scatter([40], broadcast=True)
    assert len(holders(s, y.key)) == 3
    await w3.close()
    await wait_for(lambda: len(s.workers) == 2, "the third worker gone")
    policy = policy_of(s)
    await survive(s, 3)
    assert holders(s, y.key) == {a.address, b.address}
    assert policy.last_cycle.get("(scatter broadcast)", {}).get("unmet", 0) == 0
    why = await explain(c, y.key)
    assert why["unmet"] is None and why["target"]["min"] == 2
    # A fixed number from a call is held as the cluster allows, and said to be unmet.
    x = c.submit(inc, 3, key="x-3")
    await x
    await c.replicate([x], n=3)  # three asked, two workers
    await wait_for(lambda: len(holders(s, "x-3")) == 2, "x-3 on both workers")
    assert "wants 3 copies" in (await explain(c, "x-3"))["unmet"]
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1), ("", 1)],
    config=amm_config(
        rules({"name": "device", "match": 'task.key matches "dev-*"', "pool": "gpu"}, pools=POOLS)
    ),
    timeout=60,
)
async def test_pools_apply_to_broadcast_copies(c, s, g1, g2, w1, w2):
    gpus = {g1.address, g2.address}
    futures = await c.scatter({"dev-1": 1, "dev-2": 2}, broadcast=True)
    # The call copies only inside the pool: a copy outside it is the one scatter made
    # first (before the key had a target), which the engine moves into the pool.
    for key in futures:
        assert gpus <= holders(s, key)
        assert len(holders(s, key) - gpus) <= 1
    await wait_for(
        lambda: all(holders(s, k) == gpus for k in futures), "both keys on the GPUs only"
    )
    await survive(s)
    assert all(holders(s, k) == gpus for k in futures)
    why = await explain(c, "dev-1")
    assert why["desired"] == "replicate=all from scatter broadcast, pool=gpu from rule device"
    assert why["target"]["min"] == 2 and why["eligible"] == 2
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(
        rules({"name": "frozen", "match": 'task.key matches "x-*"', "move": "never"})
    ),
)
async def test_move_never_still_wins(c, s, a, b, w3):
    x = c.submit(inc, 1, key="x-1", workers=[a.address])
    await x
    await c.replicate([x], n=3)
    held = await c.scatter({"x-y": 1}, broadcast=True)  # noqa: F841 - keeps the key
    await survive(s, 3)
    assert holders(s, "x-1") == {a.address}  # neither copied by the call nor the engine
    assert len(holders(s, "x-y")) == 1
    why = await explain(c, "x-1")
    assert why["desired"] == "replicate=3 from client.replicate, move=never from rule frozen"
    assert not why["would"]
    assert "wants 3 copies, holds 1" in why["summary"] and "forbids new copies" in why["summary"]
    broadcast = await explain(c, "x-y")
    assert (
        broadcast["desired"] == "replicate=all from scatter broadcast, move=never from rule frozen"
    )
    assert "wants 3 copies, holds 1" in broadcast["summary"]
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(EMPTY))
async def test_the_engine_trims_instead_of_the_legacy_deletion(c, s, *workers):
    deletions: list[Any] = []
    delete_worker_data = s.delete_worker_data

    async def counted(*args: Any, **kwargs: Any) -> Any:
        deletions.append(args)
        return await delete_worker_data(*args, **kwargs)

    s.delete_worker_data = counted
    x = c.submit(inc, 1, key="x-1")
    await x
    await c.replicate([x], n=4)
    assert len(holders(s, "x-1")) == 4
    await c.replicate([x], n=2)  # stock Dask deletes two copies itself, at random
    assert deletions == []
    await wait_for(lambda: len(holders(s, "x-1")) == 2, "x-1 trimmed to 2 copies")
    assert policy_of(s).totals["(client.replicate)"]["dropped"] == 2
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    Worker=BlockedGetData,
    config=amm_config(EMPTY),
    timeout=90,
)
async def test_the_engine_leaves_a_key_alone_while_the_call_copies_it(c, s, a, b, w3):
    for worker in (b, w3):
        worker.block_get_data.set()
    x = c.submit(inc, 1, key="x-1", workers=[a.address])
    await wait(x)  # (not its value: the holder serves no data until told to)
    call = asyncio.ensure_future(c.replicate([x], n=3))
    await a.in_get_data.wait()  # the call's copies are stuck on the holder
    policy = policy_of(s)
    await wait_for(lambda: "x-1" in policy.index.desired, "x-1 governed by the call's target")
    await survive(s, 5)
    assert policy.legacy.copying["x-1"] == 1
    assert (await explain(c, "x-1"))["copying"] is True
    assert policy.totals["(client.replicate)"]["requested"] == 0  # no second copy asked
    a.block_get_data.set()
    await call
    assert len(holders(s, "x-1")) == 3
    assert not policy.legacy.copying
    await survive(s, 5)
    assert len(holders(s, "x-1")) == 3
    assert policy.totals["(client.replicate)"]["requested"] == 0
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(start=False))
async def test_ignore_restores_the_stock_behaviour(c, s, a, b, w3):
    # Cycles run by hand: the calls' copies are seen before any cycle trims them.
    policy = RulesPolicy(IGNORE)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    deletions: list[Any] = []
    delete_worker_data = s.delete_worker_data

    async def counted(*args: Any, **kwargs: Any) -> Any:
        deletions.append(args)
        return await delete_worker_data(*args, **kwargs)

    s.delete_worker_data = counted
    x = c.submit(inc, 1, key="x-1")
    await x
    await c.replicate([x], n=3)
    assert len(holders(s, "x-1")) == 3
    (y,) = await c.scatter([50], broadcast=True)
    assert len(holders(s, y.key)) == 3
    assert not policy.index.runtime
    await cycle_until(
        amm,
        lambda: len(holders(s, "x-1")) == len(holders(s, y.key)) == 1,
        "x-1 and the broadcast key trimmed to 1 copy each",
    )
    status = await c.scheduler.amm_rules_status()
    assert status["legacy_replicate"] == {
        "mode": "ignore",
        "calls": {},
        "copying": 0,
        "targets": 0,
    }
    # Stock replicate deletes above n itself.
    await c.replicate([x], n=3)
    assert deletions == []
    await c.replicate([x], n=1)
    assert len(deletions) == 2 and len(holders(s, "x-1")) == 1
    no_errors(s)


def write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(start=False), timeout=60)
async def test_a_reload_to_ignore_removes_the_calls_targets(c, s, a, b, w3, tmp_path):
    path = tmp_path / "rules.yaml"
    write(path, "version: 1\n")
    policy = RulesPolicy(str(path))
    # Running (the calls are honoured only then), its cycles driven by hand.
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=True, interval=3600)
    (y,) = await c.scatter([60], broadcast=True)
    x = c.submit(inc, 1, key="x-1")
    await x
    assert (await c.scheduler.amm_rules_set_target(keys=["x-1"], target=2))["set"] == 1
    await cycle_until(
        amm,
        lambda: len(holders(s, y.key)) == 3 and len(holders(s, "x-1")) == 2,
        "the broadcast key on 3 workers and x-1 at its target of 2",
    )

    write(path, "version: 1\nlegacy-replicate: ignore\n")
    await cycle_until(amm, lambda: len(holders(s, y.key)) == 1, "the broadcast key trimmed to 1")
    assert events(s, "reload")
    # A target set with amm_rules.replicate is not a legacy call's: it stays.
    assert len(holders(s, "x-1")) == 2
    assert set(policy.index.runtime) == {"x-1"}
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(EMPTY))
async def test_the_stock_answers_and_errors_are_unchanged(c, s, a, b):
    x = c.submit(inc, 1, key="x-1")
    await x
    with pytest.raises(ValueError, match="Can not use replicate to delete data"):
        await c.replicate([x], n=0)
    with pytest.raises(KeyError):
        await c.scheduler.replicate(keys=["no-such-key"], n=2)
    answer = await s.replicate(keys=["x-1"], n=2)
    assert answer is None and len(holders(s, "x-1")) == 2
    assert not policy_of(s).index.runtime.get("no-such-key")
    assert await c.submit(inc, 1) == 2  # the scheduler carries on
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(start=False))
async def test_detach_puts_the_scheduler_handlers_back(c, s, a, b):
    stock = {name: s.handlers[name] for name in ("replicate", "scatter")}
    policy = RulesPolicy(EMPTY)
    ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    assert s.handlers["replicate"] is not stock["replicate"]
    assert s.handlers["scatter"] is not stock["scatter"]
    policy.detach()
    assert s.handlers["replicate"] is stock["replicate"]
    assert s.handlers["scatter"] is stock["scatter"]
    assert "replicate" not in vars(s) and "scatter" not in vars(s)
    (y,) = await c.scatter([70], broadcast=True)
    assert len(holders(s, y.key)) == 2
    assert not policy.index.runtime


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(rules(enforcement="dry-run")))
async def test_in_dry_run_the_calls_do_what_stock_dask_does(c, s, a, b, w3):
    """A file in dry-run changes nothing: the call copies and deletes as the stock one
    does; its target is recorded, so that explain and status say what honouring it
    would do."""
    x = c.submit(inc, 1, key="x-1", workers=[a.address])
    await x
    await c.replicate([x], n=3)
    assert len(holders(s, "x-1")) == 3
    await c.replicate([x], n=1)  # the stock call deletes two copies itself
    assert len(holders(s, "x-1")) == 1
    why = await explain(c, "x-1")
    assert why["desired"] == "replicate=1 from client.replicate"
    assert policy_of(s).legacy.calls == {"client.replicate": 2}
    no_errors(s)


SPREAD = rules({"name": "spread", "match": 'task.prefix == "x"', "spread": "host"})


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1)] * 3 + [("127.0.0.2", 1)],
    config=amm_config(SPREAD),
)
async def test_replicate_places_its_own_copies_by_spread_host(c, s, a1, a2, a3, b):
    """``client.replicate(n=2)`` of keys held on host 127.0.0.1: the call's own copy of
    each goes to the other host, from the start (the stock call picks among the three
    other workers at random, two of them on the same host; the engine then made one
    more copy and dropped one)."""
    from benchmarks.support.retire import ReplicaLog

    futures = [c.submit(inc, i, key=f"x-{i}", workers=[a1.address]) for i in range(10)]
    await wait(futures)
    log = ReplicaLog(s)
    await c.replicate(futures, n=2)
    assert all(holders(s, f.key) == {a1.address, b.address} for f in futures)
    await survive(s)
    # No copy was ever made on host 127.0.0.1 beside the first, none dropped.
    assert all(log.seen(f.key) == {b.address} for f in futures)
    assert all(holders(s, f.key) == {a1.address, b.address} for f in futures)
    no_errors(s)
