"""Per-rule conformance (satisfied / in-progress / unsatisfiable) and the fraction of
governed keys meeting their target, on real schedulers and workers, as
``status_report`` (hence ``amm-rules status`` and ``amm_rules.status()``) reports them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from distributed import wait
from distributed.core import Status
from distributed.utils_test import BlockedGetData, gen_cluster, inc

from amm_rules.observe.metrics import RulesCollector
from amm_rules.observe.status import all_satisfied, status_report
from benchmarks.support.waiting import WAIT, poll, wait_for
from tests.support.cluster import CountingDict, amm_config, copies, policy_of, rules

CLASSES = rules(
    {"name": "two", "match": 'task.prefix == "two"', "replicate": 2},
    {"name": "five", "match": 'task.prefix == "five"', "replicate": 5},
    {"name": "hosts", "match": 'task.prefix == "hosts"', "replicate": 2, "spread": "host"},
    {"name": "frozen", "match": 'task.prefix == "frozen"', "replicate": 2, "move": "never"},
    {"name": "left-alone", "match": 'task.prefix == "alone"', "move": "never"},
    {"name": "gpu-only", "match": 'task.prefix == "gpu"', "pool": "gpu"},
    pools={"gpu": "worker.resources.GPU >= 1"},
)


def rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in report["conformance"]["rules"]}


async def report_until(
    s: Any, check: Callable[[dict[str, Any]], bool], timeout: float = WAIT
) -> dict[str, Any]:
    """The status report, once ``check`` holds for it (fails after ``timeout``)."""
    return await poll(lambda: status_report(policy_of(s)), check, "the report", timeout)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(CLASSES), timeout=60)
async def test_states_with_reasons_and_the_fraction(c, s, *workers):
    keys = ["two-1", "five-1", "hosts-1", "frozen-1", "alone-1", "gpu-1", "free-1"]
    futures = c.map(inc, range(len(keys)), key=keys)
    await c.gather(futures)
    await wait_for(
        lambda: copies(s, "two-1") == 2 and copies(s, "five-1") == 3,
        "copies(s, 'two-1') == 2 and copies(s, 'five-1') == 3",
    )
    report = await report_until(s, lambda r: rows(r)["two"]["state"] == "satisfied")
    by = rows(report)

    assert by["two"]["sentence"] == "its one key holds its target and placement"
    assert (by["two"]["keys"], by["two"]["met"], by["two"]["unmet"]) == (1, 1, 0)
    assert by["two"]["bytes"] == s.tasks["two-1"].nbytes > 0

    five = by["five"]
    assert five["state"] == "unsatisfiable"
    assert five["unmet_by_reason"] == {"too-few-workers": 1}
    assert five["sentence"] == (
        "1 key of 1 cannot be satisfied now: wants 5 copies, only 3 workers in the cluster"
    )
    # All workers of a gen_cluster share one host.
    assert by["hosts"]["state"] == "unsatisfiable"
    assert by["hosts"]["unmet_by_reason"] == {"too-few-hosts": 1}
    assert "spread: host wants 2 hosts, eligible workers are on 1 host" in by["hosts"]["sentence"]
    # replicate with move: never: move: never wins, the target is never held.
    assert by["frozen"]["unmet_by_reason"] == {"move-never": 1}
    assert "move: never leaves them alone" in by["frozen"]["sentence"]
    # move: never alone asks for nothing: satisfied.
    assert by["left-alone"]["state"] == "satisfied" and by["left-alone"]["keys"] == 1
    # A pool without workers.
    assert by["gpu-only"]["unmet_by_reason"] == {"too-few-workers": 1}
    assert "no worker in pool gpu is running" in by["gpu-only"]["sentence"]
    assert by["(annotation)"]["state"] == by["(runtime)"]["state"] == "satisfied"

    c_ = report["conformance"]
    # free-1 is governed by nothing; of six governed keys, two meet (two-1, alone-1).
    assert (c_["governed"], c_["met"]) == (6, 2)
    assert c_["fraction"] == 2 / 6
    assert report["states"]["five"] == "unsatisfiable"
    assert not all_satisfied(report)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    Worker=BlockedGetData,
    config=amm_config(rules({"name": "two", "match": 'task.prefix == "two"', "replicate": 2})),
    timeout=60,
)
async def test_a_copy_in_flight_is_in_progress(c, s, a, b):
    x = c.submit(inc, 1, key="two-1", workers=[a.address])
    await wait(x)  # (not `await x`: that would fetch the result from a, which is blocked)
    await a.in_get_data.wait()  # b asked a for the copy; a does not answer yet
    report = await report_until(s, lambda r: rows(r)["two"]["state"] == "in-progress")
    two = rows(report)["two"]
    assert two["unmet_by_reason"] == {"in-flight": 1}
    assert two["sentence"] == "1 key with copies or drops in flight (e.g. 1 copy in flight)"
    assert report["in_flight"] == 1 and report["conformance"]["met"] == 0

    a.block_get_data.set()
    await report_until(s, lambda r: rows(r)["two"]["state"] == "satisfied")
    assert copies(s, "two-1") == 2


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    config={
        **amm_config(rules({"name": "two", "match": 'task.prefix == "two"', "replicate": 2})),
        # The memory monitor would resume the worker paused by hand.
        "distributed.worker.memory.pause": False,
    },
    timeout=90,
)
async def test_waiting_for_a_paused_worker_is_in_progress(c, s, a, b):
    b.status = Status.paused
    await wait_for(
        lambda: s.workers[b.address].status == Status.paused,
        "s.workers[b.address].status == Status.paused",
    )
    x = c.submit(inc, 1, key="two-1", workers=[a.address])
    await x
    report = await report_until(s, lambda r: rows(r)["two"]["state"] == "in-progress")
    two = rows(report)["two"]
    assert two["unmet_by_reason"] == {"waiting": 1}
    assert "1 paused" in two["why"]["waiting"]

    b.status = Status.running
    await report_until(s, lambda r: rows(r)["two"]["state"] == "satisfied")
    assert copies(s, "two-1") == 2


@gen_cluster(
    client=True,
    nthreads=[("", 1)],
    config=amm_config(
        rules({"name": "data", "match": 'task.prefix == "data"', "replicate": 1}),
        classify_keys=5,
    ),
    timeout=60,
)
async def test_keys_waiting_for_classification_make_rules_in_progress(c, s, a):
    data = await c.scatter({f"data-{i}": i for i in range(50)})
    report = await report_until(s, lambda r: r["classification_backlog"] > 0)
    row = rows(report)["data"]
    assert row["state"] == "in-progress"
    assert "not classified yet (classification budget)" in row["sentence"]
    assert row["unmet"] == 0  # nothing is known to be short: the keys are not read yet
    report = await report_until(s, lambda r: rows(r)["data"]["keys"] == len(data))
    assert rows(report)["data"]["state"] == "satisfied"


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    config=amm_config(rules({"name": "data", "match": 'task.prefix == "data"', "replicate": 1})),
    timeout=60,
)
async def test_bytes_follow_keys_scattered_again(c, s, a, b):
    small_data = await c.scatter({"data-1": b"x" * 1000})
    report = await report_until(s, lambda r: rows(r)["data"]["keys"] == 1)
    small = rows(report)["data"]["bytes"]
    assert small == s.tasks["data-1"].nbytes
    # The same key scattered again, ten times larger: counted once, at its new size.
    large_data = await c.scatter({"data-1": b"x" * 10_000})
    report = await report_until(s, lambda r: rows(r)["data"]["bytes"] > small)
    assert rows(report)["data"]["bytes"] == s.tasks["data-1"].nbytes
    assert rows(report)["data"]["keys"] == 1
    del small_data, large_data


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(CLASSES))
async def test_status_and_metrics_never_walk_the_scheduler_tasks(c, s, *workers):
    futures = c.map(inc, range(20), key=[f"{p}-{i}" for p in ("two", "five") for i in range(10)])
    await c.gather(futures)
    await report_until(s, lambda r: rows(r)["two"]["met"] == 10)
    s.tasks = CountingDict(s.tasks)
    CountingDict.walks = 0
    status_report(policy_of(s))
    collector = RulesCollector()
    collector.policies.append(policy_of(s))
    families = list(collector.collect())
    assert families
    assert CountingDict.walks == 0


def copies_by_rule(s: Any) -> dict[str, int]:
    """Copies of the governed keys per rule, counted key by key (what the index's
    counters must always equal)."""
    from amm_rules.engine.state.governed import labels_of

    index = policy_of(s).index
    out: dict[str, int] = {}
    for key, d in index.desired.items():
        held = len(s.tasks[key].who_has or ())
        for label in labels_of(d):
            out[label] = out.get(label, 0) + held
    return {k: v for k, v in out.items() if v}


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    config=amm_config(
        rules(
            {"name": "two", "match": 'task.prefix == "two"', "replicate": 2},
            {"name": "kept", "match": 'task.prefix == "kept"', "move": "never"},
            {"name": "every", "match": 'task.prefix == "every"', "replicate": "all"},
        )
    ),
    timeout=150,
)
async def test_copies_held_and_wanted_follow_every_change(c, s, a, b, w):
    def held() -> dict[str, int]:
        counted = {k: v for k, v in policy_of(s).index.governed.copies_by.items() if v}
        assert counted == copies_by_rule(s)
        return counted

    two = c.map(inc, range(5), key=[f"two-{i}" for i in range(5)])
    kept = c.map(inc, range(2), key=[f"kept-{i}" for i in range(2)])
    every = c.submit(inc, 1, key="every-1")
    await c.gather([*two, *kept, every])
    report = await report_until(
        s, lambda r: rows(r)["two"]["met"] == 5 and rows(r)["every"]["met"] == 1
    )
    assert (rows(report)["two"]["copies_held"], rows(report)["two"]["copies_wanted"]) == (10, 10)
    assert (rows(report)["kept"]["copies_held"], rows(report)["kept"]["copies_wanted"]) == (2, 2)
    # replicate: all wants a copy per eligible worker, as many as there are now.
    assert (rows(report)["every"]["copies_held"], rows(report)["every"]["copies_wanted"]) == (3, 3)
    assert held() == {"two": 10, "kept": 2, "every": 3}

    # A copy too many (a dependency fetched by a third worker), trimmed again once the
    # dependent is gone.
    holders = s.tasks["two-0"].who_has
    (third,) = [ws.address for ws in s.workers.values() if ws not in holders]
    dependent = c.submit(inc, two[0], key="dependent-1", workers=[third])
    await dependent
    assert held()["two"] in (10, 11)
    del dependent
    await wait_for(lambda: copies(s, "two-0") == 2, "two-0 trimmed back to 2 copies")
    assert held()["two"] == 10
    # A copy made by a dependency transfer of a key nobody copies.
    total = c.submit(sum, kept, key="free-sum", workers=[w.address])
    await total
    assert held()["kept"] == sum(copies(s, k.key) for k in kept)

    # A worker leaves with its copies; keys released.
    await w.close()
    await wait_for(lambda: w.address not in s.workers, "the third worker gone")
    held()
    del two[3:], total
    await wait_for(lambda: "two-4" not in s.tasks, "two-3 and two-4 released")
    # A key that lost a copy with the worker is short only once a cycle plans it: wait for
    # the copies too.
    report = await report_until(
        s, lambda r: rows(r)["two"]["met"] == 3 and rows(r)["two"]["copies_held"] == 6
    )
    assert held()["two"] == 6 == rows(report)["two"]["copies_held"]
    assert rows(report)["two"]["copies_wanted"] == 6
    assert rows(report)["every"]["copies_wanted"] == 2 == held()["every"]


TWO_CAUSES = rules(
    {"name": "four", "match": 'task.prefix == "x"', "replicate": 4},
    pools={"gpu": "worker.resources.GPU >= 1"},  # amm-rules: disable=unused-pool
)


@gen_cluster(
    client=True,
    nthreads=[("", 1, {"resources": {"GPU": 1}}), ("", 1), ("", 1)],
    config=amm_config(TWO_CAUSES),
    timeout=60,
)
async def test_one_reason_per_cause(c, s, gpu, a, b):
    """Two keys of one rule, short of their four copies for two causes: one because the
    cluster has only two workers, the other because its pool has no running worker
    (annotated pool="gpu", the GPU worker lost). Each is told with its own cause."""
    import amm_rules

    with amm_rules.annotate(pool="gpu"):
        in_pool = c.submit(inc, 1, key="x-2", workers=[a.address])
    plain = c.submit(inc, 2, key="x-1", workers=[a.address])
    await c.gather([in_pool, plain])
    await gpu.close()
    sentence = (
        "2 keys of 2 cannot be satisfied now: 1 key: no worker in pool gpu is running; "
        "1 key: wants 4 copies, only 2 workers in the cluster"
    )
    report = await report_until(s, lambda r: rows(r)["four"]["sentence"] == sentence)
    four = rows(report)["four"]
    assert four["state"] == "unsatisfiable"
    assert four["unmet_by_reason"] == {"too-few-workers": 2}
    assert sorted((x["why"], x["keys"]) for x in four["causes"]) == [
        ("no worker in pool gpu is running", 1),
        ("wants 4 copies, only 2 workers in the cluster", 1),
    ]
    assert rows(report)["(annotation)"]["sentence"] == (
        "1 key of 1 cannot be satisfied now: no worker in pool gpu is running"
    )
