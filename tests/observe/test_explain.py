"""``explain``: the summary line, the cascade, per-worker decisions and the history of a
key, on real schedulers and workers; and the keys the client helpers accept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from distributed import wait
from distributed.core import Status
from distributed.utils_test import BlockedGetData, gen_cluster, inc

import amm_rules
from amm_rules.observe.status import status_report
from benchmarks.support.waiting import poll, wait_for
from tests.support.cluster import amm_config, copies, policy_of, rules

GPU = {"resources": {"GPU": 1}}
CASCADE = rules(
    {"name": "early", "match": 'task.prefix == "feat"', "replicate": 3},
    {"name": "gpu-data", "match": 'task.prefix == "feat"', "pool": "gpu", "replicate": 4},
    {"name": "other", "match": 'task.prefix == "nope"', "move": "never"},
    pools={"gpu": "worker.resources.GPU >= 1"},
)


@gen_cluster(
    client=True, nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1)], config=amm_config(CASCADE)
)
async def test_the_cascade_decisions_and_history_of_a_key(c, s, a, b, cpu):
    with amm_rules.annotate(replicate=1, spread="none"):
        x = c.submit(inc, 1, key="feat-0", workers=[a.address])
    await x
    # A runtime target overrides the annotation, which overrides the rules.
    await amm_rules.replicate(x, n=2)
    await wait_for(lambda: copies(s, "feat-0") == 2, "copies(s, 'feat-0') == 2")
    answer = (await amm_rules.explain(x))["feat-0"]

    assert answer["summary"] == (
        "holds its target: 2 copies (replicate=2 from runtime target, "
        "pool=gpu from rule gpu-data, spread=none from amm annotation)"
    )
    runtime, annotation, early, gpu_data, other = answer["cascade"]
    # (lists come back as tuples over the comm)
    assert (runtime["source"], list(runtime["decided"])) == ("runtime target", ["replicate"])
    assert annotation["sets"] == {"replicate": "1", "spread": "none"}
    assert list(annotation["decided"]) == ["spread"]
    assert annotation["overridden"] == {"replicate": "runtime target"}
    assert (early["rule"], early["matched"], list(early["decided"])) == ("early", True, [])
    assert early["overridden"] == {"replicate": "runtime target"}
    assert (gpu_data["matched"], list(gpu_data["decided"])) == (True, ["pool"])
    assert gpu_data["overridden"] == {"replicate": "runtime target"}
    assert (other["rule"], other["matched"], list(other["decided"])) == ("other", False, [])

    facts = answer["facts"]
    assert facts["prefix"] == "feat" and facts["type"] == "int"
    assert {h["address"]: list(h["pools"]) for h in facts["holders"]} == {
        a.address: ["gpu"],
        b.address: ["gpu"],
    }
    decisions = answer["decisions"]
    assert decisions[a.address]["decision"] == decisions[b.address]["decision"] == "holds"
    assert decisions[cpu.address]["decision"] == "no"
    assert [d["decider"] for d in decisions[cpu.address]["deciders"]] == ["pool"]

    (copied,) = [h for h in answer["history"] if h["op"] == "replicate"]
    assert (copied["worker"], copied["outcome"], copied["source"]) == (
        b.address,
        "accepted",
        "(runtime)",
    )


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    config=amm_config(
        rules(
            {"name": "frozen", "match": 'task.prefix == "frozen"', "replicate": 2},
            {"name": "big", "match": 'task.prefix == "frozen"', "move": "never"},
        )
    ),
)
async def test_replicate_with_move_never_is_explained(c, s, a, b):
    x = c.submit(inc, 1, key="frozen-0", workers=[a.address])
    await x
    await wait_for(
        lambda: "frozen-0" in policy_of(s).index, "'frozen-0' in policy_of(s).index"
    )  # classified
    answer = (await amm_rules.explain(x))["frozen-0"]
    assert answer["summary"] == (
        "wants 2 copies, holds 1: move: never from rule big forbids new copies"
    )
    other = answer["decisions"][b.address]
    assert other["decision"] == "no"
    assert [d["decider"] for d in other["deciders"]] == ["move: never"]
    assert answer["problem"]["reason"] == "move-never"
    # The engine's own fields agree: no worker is a candidate, none is eligible.
    assert answer["workers"][b.address] == "move: never from rule big: no copy is made"
    assert answer["eligible"] == 0
    assert not answer["would"]


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    Worker=BlockedGetData,
    config={
        **amm_config(rules({"name": "three", "match": 'task.prefix == "three"', "replicate": 3})),
        "distributed.worker.memory.pause": False,
    },
    timeout=60,
)
async def test_paused_and_in_flight_workers_are_throttled(c, s, a, b, w3):
    w3.status = Status.paused
    await wait_for(
        lambda: s.workers[w3.address].status == Status.paused,
        "s.workers[w3.address].status == Status.paused",
    )
    x = c.submit(inc, 1, key="three-0", workers=[a.address])
    await wait(x)
    await a.in_get_data.wait()  # b fetches its copy from a, which does not answer yet
    answer = (await amm_rules.explain(["three-0"]))["three-0"]
    decisions = answer["decisions"]
    assert decisions[a.address]["decision"] == "holds"
    assert decisions[b.address]["decision"] == "throttled"
    assert [d["decider"] for d in decisions[b.address]["deciders"]] == ["in flight"]
    assert decisions[w3.address]["decision"] == "throttled"
    assert [d["decider"] for d in decisions[w3.address]["deciders"]] == ["paused"]
    assert answer["summary"].startswith("wants 3 copies, holds or awaits 2")
    assert "1 paused" in answer["summary"]
    for w in (a, b, w3):  # every worker here blocks its first fetch
        w.block_get_data.set()
    w3.status = Status.running
    await wait_for(lambda: copies(s, "three-0") == 3, "copies(s, 'three-0') == 3")


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    config=amm_config(
        rules(
            {"name": "five", "match": 'task.prefix == "five"', "replicate": 5},
            {"name": "two", "match": 'task.prefix == "two"', "replicate": 2},
        )
    ),
    timeout=60,
)
async def test_unmet_keys_are_picked_by_rule_and_limit(c, s, a, b):
    futures = c.map(inc, range(6), key=[f"{p}-{i}" for p in ("five", "two") for i in range(3)])
    await c.gather(futures)
    await wait_for(
        lambda: all(copies(s, f.key) == 2 for f in futures),
        "all(copies(s, f.key) == 2 for f in futures)",
    )
    # ... and a cycle has seen the last copies land.
    await wait_for(
        lambda: status_report(policy_of(s))["states"]["two"] == "satisfied",
        "status_report(policy_of(s))['states']['two'] == 'satisfied'",
    )
    picked = await c.scheduler.amm_rules_explain(unmet=True, limit=2)
    assert len(picked) == 2 and all(k.startswith("five-") for k in picked)
    assert all("only 2 workers in the cluster" in a["summary"] for a in picked.values())
    assert await c.scheduler.amm_rules_explain(unmet=True, rule="two") == {}
    assert len(await c.scheduler.amm_rules_explain(unmet=True, rule="five", limit=10)) == 3


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config())
async def test_explain_and_replicate_take_keys(c, s, a, b):
    x = c.submit(inc, 1, key="x-1")
    t = c.submit(inc, 2, key=("t-1a2b", 0))
    await wait([x, t])
    by_string = await amm_rules.explain("x-1")
    assert set(by_string) == {"x-1"} and by_string["x-1"]["state"] == "memory"
    assert "no rule governs it" in by_string["x-1"]["summary"]
    by_tuple = await amm_rules.explain(("t-1a2b", 0))
    assert by_tuple["('t-1a2b', 0)"]["holders"]
    mixed = await amm_rules.explain(["x-1", t, "unknown-key"])
    assert set(mixed) == {"x-1", "('t-1a2b', 0)", "unknown-key"}
    assert mixed["unknown-key"]["state"] == "unknown"

    assert await amm_rules.replicate("x-1", n=2, client=c) == {"set": 1, "missing": []}
    await wait_for(lambda: copies(s, "x-1") == 2, "copies(s, 'x-1') == 2")
    answer = await amm_rules.replicate([("t-1a2b", 0), "gone"], n=2, client=c)
    assert answer == {"set": 1, "missing": ["gone"]}


@pytest.mark.parametrize("bad", [object(), 3, None, 2.5, {"a": object()}, [b"bytes"]])
def test_anything_else_is_a_type_error(bad):
    # Checked on the client before any client is looked for.
    with pytest.raises(TypeError, match="expected a Future, a persisted dask collection, a key"):
        amm_rules.explain(bad)
    with pytest.raises(TypeError, match="got "):
        amm_rules.replicate(bad, n=2)


LOST_POOL = rules(
    {"name": "four", "match": 'task.prefix == "x"', "replicate": 4},
    pools={"gpu": "worker.resources.GPU >= 1"},  # amm-rules: disable=unused-pool
)


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1), ("", 1)],
    config=amm_config(LOST_POOL),
    timeout=60,
)
async def test_the_summary_counts_the_copies_the_holders_list_shows(c, s, gpu, a, b):
    """The only GPU worker is lost while a key annotated pool="gpu" is held on a CPU
    worker: the summary says it holds one copy, outside its pool, and why no copy
    can go where it should; the holders list shows the same copy."""
    with amm_rules.annotate(pool="gpu"):
        y = c.submit(inc, 1, key="y-1", workers=[a.address])
    await y
    await gpu.close()
    await wait_for(lambda: len(s.workers) == 2, "len(s.workers) == 2")
    summary = (
        "wants a copy in pool gpu: holds 1 copy, on a worker outside its pool; "
        "no worker in pool gpu is running"
    )
    answer = await poll_summary(c, "y-1", lambda t: t == summary)
    assert [h["address"] for h in answer["facts"]["holders"]] == [a.address]
    assert answer["decisions"][a.address]["decision"] == "holds"
    assert copies(s, "y-1") == 1  # the last copy stays, outside its pool


async def poll_summary(c: Any, key: str, check: Callable[[str], bool]) -> dict[str, Any]:
    async def answer() -> dict[str, Any]:
        return (await amm_rules.explain(key, client=c))[key]

    return await poll(answer, lambda a: check(a["summary"]), f"the summary of {key}")
