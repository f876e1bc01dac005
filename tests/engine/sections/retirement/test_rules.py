"""Retirement that keeps the rules (docs/retirement.md): with RulesPolicy attached, the
keys of a retiring worker go where the rules allow, and nowhere else first.

Every test logs each copy the scheduler records during the retirement
(:class:`benchmarks.support.retire.ReplicaLog`) and checks every worker a key was ever on, not only
where it ends. Most tests run twice: with the rules' placement and with distributed's
own ``RetireWorker`` (``placement="stock"``), which must break the same check, so that
the test can fail.
"""

from __future__ import annotations

import re

import pytest
from distributed import Worker
from distributed.utils_test import gen_cluster
from tornado.httpclient import AsyncHTTPClient

from amm_rules.engine.sections.adaptive import AdaptiveSection
from benchmarks.support.retire import ReplicaLog, amm_measure
from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import amm_config, events, holders, no_errors, policy_of, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

GPU = {"resources": {"GPU": 1}}
SPOT = {"resources": {"SPOT": 1}}
POOLS = {"gpu": "worker.resources.GPU >= 1", "spot": "worker.resources.SPOT >= 1"}
PLACEMENTS = ["rules", "stock"]


def config(*entries, **top):
    return {**amm_config(rules(*entries, pools=POOLS, **top)), **amm_measure()}


def use(s, placement: str) -> None:
    """``stock``: distributed's retirement alone places the keys. The AMM is stopped, so
    that ``retire_workers`` runs ``RetireWorker`` in its own manager, without the rules
    (with them in the same manager, the outcome depends on the arbitrary order in which
    the AMM runs its policies: see benchmarks/retirement.py); :func:`resume` starts it
    again, and the rules then correct what the retirement did."""
    if placement == "stock":
        policy_of(s).retirements.detach()
        s.extensions["amm"].stop()


def resume(s) -> None:
    s.extensions["amm"].start()


async def load(c, worker, nbytes: int, key: str, kept: list) -> None:
    """Make ``worker`` hold more data (the AMM's measure is ``managed`` here); its
    future goes to ``kept``, which the test keeps (else the data is released)."""
    kept.append(await c.scatter({key: b"." * nbytes}, workers=[worker.address]))


def device(key: str) -> bytes:
    return key.encode() * 100


@pytest.mark.parametrize("placement", PLACEMENTS)
@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1), ("", 1)],
    config=config({"name": "device", "match": 'task.key matches "dev-*"', "pool": "gpu"}),
)
async def test_pool_a_retiring_workers_keys_stay_in_their_pool(
    c, s, gpu0, gpu1, cpu0, cpu1, placement
):
    """The case of the issue: gpu1 holds more memory than the CPU workers, so
    RetireWorker's choice (least memory) is a CPU worker."""
    use(s, placement)
    kept: list = []
    await load(c, gpu1, 2_000_000, "blob", kept)
    futures = [
        c.submit(device, f"dev-{i}", key=f"dev-{i}", workers=[gpu0.address]) for i in range(3)
    ]
    await c.gather(futures)
    log = ReplicaLog(s)
    retired = await c.retire_workers([gpu0.address])
    resume(s)
    assert gpu0.address in retired
    keys = [f.key for f in futures]
    await wait_for(
        lambda: all(holders(s, k) == {gpu1.address} for k in keys),
        "all(holders(s, k) == {gpu1.address} for k in keys)",
    )
    seen = set().union(*(log.seen(k) for k in keys))
    if placement == "rules":
        assert seen == {gpu1.address}
        (placed,) = [e for e in events(s, "retirement") if e["step"] == "placed"]
        assert placed["worker"] == gpu0.address and placed["keys"] == 3
        # (The copies are the retirement's or the policy's own, whichever ran first in
        # the AMM cycle: both place by the rules.)
        metrics = policy_of(s).retirements.metrics()
        assert metrics["placed"] == 1 and metrics["retiring"] == 0
    else:
        assert seen & {cpu0.address, cpu1.address}  # the transit the rules avoid
    assert await c.gather(futures) == [device(k) for k in keys]
    no_errors(s)


@pytest.mark.parametrize("placement", PLACEMENTS)
@gen_cluster(
    client=True,
    nthreads=[("", 1), ("", 1), ("", 1, SPOT), ("", 1, SPOT)],
    config=config({"name": "safe", "match": 'task.key matches "x-*"', "avoid": "spot"}),
)
async def test_avoid_a_retiring_workers_keys_never_touch_the_avoided_pool(
    c, s, a, b, spot0, spot1, placement
):
    use(s, placement)
    kept: list = []
    await load(c, b, 2_000_000, "blob", kept)  # the spot workers are the emptiest
    futures = await c.scatter({f"x-{i}": i for i in range(3)}, workers=[a.address])
    log = ReplicaLog(s)
    assert a.address in await c.retire_workers([a.address])
    resume(s)
    await wait_for(
        lambda: all(holders(s, k) == {b.address} for k in futures),
        "all(holders(s, k) == {b.address} for k in futures)",
    )
    seen = set().union(*(log.seen(k) for k in futures))
    if placement == "rules":
        assert seen == {b.address}
    else:
        assert seen & {spot0.address, spot1.address}
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[
        ("127.0.0.1", 1),
        ("127.0.0.1", 1),
        ("127.0.0.2", 1),
        ("127.0.0.3", 1),
        ("127.0.0.4", 1),
    ],
    config=config(
        {"name": "spread", "match": 'task.key matches "x-*"', "replicate": 2, "spread": "host"}
    ),
)
async def test_spread_several_workers_retiring_at_once_keep_copies_on_distinct_hosts(
    c, s, a1, a2, b, c3, d
):
    """Both holders of each key retire at once: each key needs two new copies, on two
    distinct hosts among the workers that stay (two of them share a host)."""
    kept: list = []
    await load(c, a1, 1_000_000, "blob-a1", kept)
    await load(c, a2, 1_000_000, "blob-a2", kept)
    await load(c, d, 3_000_000, "blob-d", kept)
    futures = await c.scatter({f"x-{i}": i for i in range(4)}, workers=[b.address])
    await wait_for(
        lambda: all(holders(s, k) == {b.address, c3.address} for k in futures),
        "all(holders(s, k) == {b.address, c3.address} for k in futures)",
    )
    log = ReplicaLog(s)
    retired = await c.retire_workers([b.address, c3.address])
    assert set(retired) == {b.address, c3.address}
    for k in futures:
        new = log.seen(k)
        # Two copies, on the two hosts that stay; never both on the shared one.
        assert len(new) == 2 and {s.workers[w].host for w in new} == {"127.0.0.1", "127.0.0.4"}
        assert holders(s, k) == new
    assert await c.gather(futures) == {f"x-{i}": i for i in range(4)}
    no_errors(s)


@pytest.mark.parametrize("placement", PLACEMENTS)
@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=config({"name": "frozen", "match": 'task.key matches "x-*"', "move": "never"}),
)
async def test_move_never_key_alone_fails_the_retirement(c, s, a, b, w3, placement):
    """``move: never`` data is not copied: the worker holding it alone is not retired
    (as distributed refuses a retirement when no worker can receive a key)."""
    use(s, placement)
    futures = await c.scatter({"x-1": 1, "x-2": 2}, workers=[a.address])
    log = ReplicaLog(s)
    retired = await c.retire_workers([a.address])
    if placement == "stock":
        assert a.address in retired and log.seen("x-1")  # moved, against the rule
        return
    assert retired == {}
    await wait_for(
        lambda: s.workers[a.address].status.name == "running",
        "s.workers[a.address].status.name == 'running'",
    )
    assert log.seen("x-1") == log.seen("x-2") == set()
    (blocked,) = [e for e in events(s, "retirement") if e["step"] == "blocked"]
    assert blocked["worker"] == a.address
    assert sorted(blocked["keys"]) == ["x-1", "x-2"] and blocked["rules"] == ["frozen"]
    assert blocked["why"] == ["move: never"]
    # A copy elsewhere is enough: the worker may go then (its copy just vanishes). Made
    # by tasks reading the keys on b (client.replicate copies no move: never key).
    readers = [c.submit(len, [f], workers=[b.address], pure=False) for f in futures.values()]
    await c.gather(readers)
    assert all(b.address in holders(s, k) for k in futures)
    assert a.address in await c.retire_workers([a.address])
    assert await c.gather(futures) == {"x-1": 1, "x-2": 2}
    no_errors(s)


@pytest.mark.parametrize("placement", PLACEMENTS)
@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1), ("", 1)],
    config=config({"name": "device", "match": 'task.key matches "dev-*"', "pool": "gpu"}),
)
async def test_no_eligible_recipient_fails_the_retirement_and_names_key_and_rule(
    c, s, gpu0, cpu0, cpu1, placement
):
    use(s, placement)
    future = c.submit(device, "dev-1", key="dev-1", workers=[gpu0.address])
    await future
    log = ReplicaLog(s)
    retired = await c.retire_workers([gpu0.address])
    if placement == "stock":
        assert gpu0.address in retired and log.seen("dev-1") <= {cpu0.address, cpu1.address}
        return
    assert retired == {} and log.seen("dev-1") == set()
    assert holders(s, "dev-1") == {gpu0.address}
    (blocked,) = [e for e in events(s, "retirement") if e["step"] == "blocked"]
    assert blocked["keys"] == ["dev-1"] and blocked["rules"] == ["device"]
    assert blocked["why"] == ["no eligible worker: pool gpu has no running worker that stays"]
    # The worker runs again, and the retirement is over (nothing left in the AMM).
    await wait_for(
        lambda: s.workers[gpu0.address].status.name == "running",
        "s.workers[gpu0.address].status.name == 'running'",
    )
    assert not [
        p for p in s.extensions["amm"].policies if type(p).__name__.endswith("RetireWorker")
    ]
    metrics = policy_of(s).retirements.metrics()
    assert metrics["blocked"] == 1 and metrics["copies"] == 0 and metrics["retiring"] == 0
    no_errors(s)


@pytest.mark.parametrize("placement", PLACEMENTS)
@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 5,
    config=config({"name": "three", "match": 'task.key matches "x-*"', "replicate": 3}),
    timeout=60,
)
async def test_targets_are_recreated_before_the_worker_leaves(c, s, *workers, placement):
    leaving = workers[0]
    futures = await c.scatter({f"x-{i}": i for i in range(4)}, workers=[leaving.address])
    await wait_for(
        lambda: all(len(holders(s, k)) == 3 for k in futures),
        "all(len(holders(s, k)) == 3 for k in futures)",
    )
    use(s, placement)
    log = ReplicaLog(s)
    assert leaving.address in await c.retire_workers([leaving.address])
    staying = {k: holders(s, k) - {leaving.address} for k in futures}
    resume(s)
    counts = {k: len(v) for k, v in staying.items()}
    if placement == "rules":
        # When retire_workers returns, every key already holds its target elsewhere.
        assert counts == dict.fromkeys(futures, 3)
        assert all(log.seen(k) <= staying[k] for k in futures)
    else:
        assert counts == dict.fromkeys(futures, 2)  # re-created only afterwards
    await wait_for(
        lambda: all(len(holders(s, k)) == 3 for k in futures),
        "all(len(holders(s, k)) == 3 for k in futures)",
    )
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1), ("", 1)],
    config=config(
        {"name": "device", "match": 'task.key matches "dev-*"', "pool": "gpu"},
        {"name": "host", "match": 'task.key matches "cpu-*"', "avoid": "gpu", "replicate": 2},
    ),
    timeout=60,
)
async def test_a_gpu_and_a_cpu_worker_retiring_at_once(c, s, gpu0, gpu1, cpu0, cpu1):
    kept: list = []
    await load(c, gpu1, 2_000_000, "blob", kept)
    dev = await c.scatter({f"dev-{i}": i for i in range(3)}, workers=[gpu0.address])
    host = await c.scatter({f"cpu-{i}": i for i in range(3)}, workers=[cpu0.address])
    await wait_for(
        lambda: all(holders(s, k) == {cpu0.address, cpu1.address} for k in host),
        "all(holders(s, k) == {cpu0.address, cpu1.address} for k in host)",
    )
    log = ReplicaLog(s)
    retired = await c.retire_workers([gpu0.address, cpu0.address])
    assert set(retired) == {gpu0.address, cpu0.address}
    assert all(log.seen(k) == {gpu1.address} for k in dev)
    # The CPU keys keep a copy on cpu1; their second copy has nowhere to go (gpu is
    # avoided, cpu0 left): nothing is made outside the rules to meet it.
    assert all(log.seen(k) == set() and holders(s, k) == {cpu1.address} for k in host)
    await wait_cycles(s, 10)
    assert all(log.seen(k) == set() and holders(s, k) == {cpu1.address} for k in host)
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1), ("", 1)],
    config=config(
        {"name": "device", "match": 'task.key matches "dev-*"', "pool": "gpu"},
        {"name": "frozen", "match": 'task.key matches "frozen-*"', "move": "never"},
    ),
)
async def test_workers_to_close_leaves_out_the_workers_the_rules_keep(
    c, s, gpu0, gpu1, cpu0, cpu1
):
    """Adaptive scale-down closes the workers it chose even when their retirement fails:
    the rules keep the holders of data that could not leave out of its choice."""
    kept: list = []
    await load(c, gpu1, 2_000_000, "blob", kept)
    dev = await c.scatter({"dev-1": 1}, workers=[gpu0.address])
    frozen = await c.scatter({"frozen-1": 1}, workers=[cpu0.address])
    policy = policy_of(s)
    await wait_for(
        lambda: {"dev-1", "frozen-1"} <= policy.index.desired.keys(),
        "{'dev-1', 'frozen-1'} <= policy.index.desired.keys()",
    )
    chosen = s.workers_to_close(n=4)
    # The gpu pool keeps one worker (the one with most data: gpu1); cpu0 holds the only
    # copy of a move: never key.
    assert set(chosen) == {gpu0.address, cpu1.address}
    # A choice is not an action until a retirement follows it.
    assert not [e for e in events(s, "retirement") if e["step"] == "kept"]
    log = ReplicaLog(s)
    assert set(await c.retire_workers(chosen)) == set(chosen)
    kept = {e["worker"]: e["why"] for e in events(s, "retirement") if e["step"] == "kept"}
    assert kept == {
        gpu1.address: f"kept {gpu1.address}: 1 key of rule device would have no worker in "
        "pool gpu",
        cpu0.address: f"kept {cpu0.address}: 1 key of rule frozen (move: never) would have "
        "no copy left",
    }
    assert policy.section(AdaptiveSection).counters["downscaling_kept"] == 2
    assert log.seen("dev-1") == {gpu1.address} and log.seen("frozen-1") == set()
    assert await c.gather([dev["dev-1"], frozen["frozen-1"]]) == [1, 1]
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1), ("", 1)],
    config={
        **config({"name": "safe", "match": 'task.key matches "x-*"', "avoid": "spot"}),
        "distributed.scheduler.active-memory-manager.interval": 3600,
    },
)
async def test_a_worker_that_joined_since_the_last_cycle_is_in_its_pools(c, s, a, b):
    """The retirement's own AMM cycle may run before the policy has seen the new worker:
    the new spot worker, the emptiest, is still known to be in pool spot."""
    kept: list = []
    await load(c, b, 2_000_000, "blob", kept)
    futures = await c.scatter({f"x-{i}": i for i in range(3)}, workers=[a.address])
    async with Worker(s.address, nthreads=1, resources={"SPOT": 1}) as spot:
        log = ReplicaLog(s)
        assert a.address in await c.retire_workers([a.address])
        assert all(log.seen(k) == {b.address} for k in futures)
        assert spot.address in s.workers
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1)],
    scheduler_kwargs={"dashboard": True, "dashboard_address": "127.0.0.1:0"},
    config=config({"name": "device", "match": 'task.key matches "dev-*"', "pool": "gpu"}),
)
async def test_a_metrics_scrape_is_not_a_retirement(c, s, gpu, cpu):
    """``/metrics`` serves ``adaptive_target``, which asks ``workers_to_close``: the guard
    filters that answer, but a read counts nothing and logs nothing; the same decision
    counts once adaptive (here ``retire_workers(n=...)``, which chooses as it does)
    acts on it."""
    dev = await c.scatter({"dev-1": 1}, workers=[gpu.address])
    policy = policy_of(s)
    await wait_for(lambda: "dev-1" in policy.index.desired, "'dev-1' in policy.index.desired")
    url = f"http://127.0.0.1:{s.http_server.port}/metrics"

    async def kept() -> float:
        text = (await AsyncHTTPClient().fetch(url)).body.decode()
        # This scheduler's line (the process's other schedulers have their own).
        (line,) = re.findall(
            r"^dask_amm_rules_retirement_downscaling_kept_total\{[^}]*"
            + re.escape(f'scheduler="{s.address}"')
            + r"[^}]*\} .*$",
            text,
            re.M,
        )
        return float(line.split()[-1])

    for _ in range(3):
        assert await kept() == 0
    assert s.workers_to_close(n=2) == [cpu.address]  # the guard kept the pool's worker
    adaptive = policy.section(AdaptiveSection)
    assert adaptive.counters["downscaling_kept"] == 0
    assert not [e for e in events(s, "retirement") if e["step"] == "kept"]
    assert adaptive.status()["totals"].get("downscaling_kept", 0) == 0
    assert set(await s.retire_workers(n=2)) == {cpu.address}
    assert adaptive.counters["downscaling_kept"] == 1
    (guard,) = [e for e in events(s, "retirement") if e["step"] == "kept"]
    assert guard["worker"] == gpu.address
    assert await kept() == 1
    assert await c.gather(dev["dev-1"]) == 1
    no_errors(s)


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1), ("", 1)],
    config=config(
        {
            "name": "device",
            "match": 'task.key matches "dev-*"',
            "pool": "gpu",
            "enforcement": "dry-run",
        },
        {
            "name": "frozen",
            "match": 'task.key matches "frozen-*"',
            "move": "never",
            "enforcement": "dry-run",
        },
    ),
)
async def test_rules_in_dry_run_do_not_act_in_a_retirement(c, s, gpu, cpu0, cpu1):
    """A rule in dry-run does not place a retiring worker's keys: they go as if no rule
    governed them (one copy on a worker that stays), the retirement is not refused
    because of it (no other GPU worker; move: never), and adaptive scale-down keeps no
    worker for it. What it would have done is counted."""
    dev = await c.scatter({"dev-1": 1, "dev-2": 2}, workers=[gpu.address])
    frozen = await c.scatter({"frozen-1": 3}, workers=[cpu0.address])
    policy = policy_of(s)
    await wait_for(
        lambda: {"dev-1", "dev-2", "frozen-1"} <= policy.index.desired.keys(),
        "the keys classified",
    )
    # Scale-down keeps no worker for rules in dry-run.
    assert set(s.workers_to_close(n=2)) <= {gpu.address, cpu0.address, cpu1.address}
    assert gpu.address in s.workers_to_close(n=3) and cpu0.address in s.workers_to_close(n=3)
    retired = await c.retire_workers([gpu.address, cpu0.address])
    assert set(retired) == {gpu.address, cpu0.address}
    assert all(holders(s, k) == {cpu1.address} for k in ("dev-1", "dev-2", "frozen-1"))
    assert await c.gather([dev["dev-1"], dev["dev-2"], frozen["frozen-1"]]) == [1, 2, 3]
    steps = [e for e in events(s, "retirement")]
    assert not [e for e in steps if e["step"] in ("blocked", "kept")]
    placing = {e["worker"]: e for e in steps if e["step"] == "placing"}
    assert placing[gpu.address]["dry_run"] == 2 and placing[cpu0.address]["dry_run"] == 1
    assert policy.retirements.counters["dry_run_keys"] == 3
    no_errors(s)
