"""The recompute cost model (:mod:`amm_rules.engine.state.costs`) on stand-ins for the
scheduler's task groups, tasks and workers: the formula, its fallbacks, the group
graph walked once per refresh, and the work at risk kept by the sole copies."""

from __future__ import annotations

from amm_rules.engine.state.costs import (
    MEASURED,
    PREFIX_AVERAGE,
    UNKNOWN,
    RecomputeCosts,
)


class Prefix:
    def __init__(self, average: float = -1) -> None:
        self.duration_average = average


class Group:
    """A TaskGroup stand-in: states, dependencies, compute seconds."""

    def __init__(self, name: str, size: int, compute: float = 0.0, average: float = -1):
        self.name = name
        self.size = size
        self.states = {"memory": 0, "released": 0, "forgotten": 0, "waiting": size}
        self.dependencies: set[Group] = set()
        self.all_durations = {"compute": compute} if compute else {}
        self.prefix = Prefix(average)

    def __len__(self) -> int:
        return self.size

    def set(self, **states: int) -> None:
        self.states = {"memory": 0, "released": 0, "forgotten": 0, **states}


class Worker:
    def __init__(self, address: str, host: str = "h") -> None:
        self.address = address
        self.host = host


class Task:
    def __init__(self, key: str, group: Group, deps: tuple[Task, ...] = ()) -> None:
        self.key = key
        self.group = group
        self.dependencies = set(deps)
        self.who_has: set[Worker] = set()


def finish(costs: RecomputeCosts, ts: Task, ws: Worker) -> None:
    """What the hooks see of a task finishing on ``ws``."""
    ts.who_has = {ws}
    costs.copy_added(ts, ws, 1)
    costs.finished(ts)


def test_own_time_is_the_groups_measured_mean() -> None:
    g = Group("load", 4, compute=8.0)
    costs = RecomputeCosts()
    w = Worker("w1")
    for i in range(4):
        finish(costs, Task(f"load-{i}", g), w)
    g.set(memory=4)
    assert costs.refresh() == [g]
    assert costs.estimate(g) == 2.0
    assert costs.groups[g].source == MEASURED
    assert costs.at_risk == {"w1": 8.0}
    assert costs.refresh() == []  # nothing entered or left memory: not recomputed


def test_released_ancestors_make_a_key_dearer() -> None:
    load = Group("load", 8, compute=16.0)  # 2 s each
    agg = Group("agg", 1, compute=0.5)
    agg.dependencies = {load}
    costs = RecomputeCosts()
    w = Worker("w")
    loads = [Task(f"load-{i}", load) for i in range(8)]
    for ts in loads:
        finish(costs, ts, w)
    finish(costs, Task("agg", agg, tuple(loads)), w)
    assert costs.groups[agg].fanin == {load: 8}
    load.set(memory=8)
    agg.set(memory=1)
    costs.refresh()
    assert costs.estimate(agg) == 0.5  # its inputs are all in memory
    load.set(released=8)
    costs.changed = True
    costs.refresh()
    assert costs.estimate(agg) == 0.5 + 8 * 2.0
    assert costs.groups[agg].ancestors == 8.0
    # Half of them released: half the lineage (a share, not the exact tasks).
    load.set(memory=4, released=4)
    costs.changed = True
    costs.refresh()
    assert costs.estimate(agg) == 0.5 + 4 * 2.0


def test_fallbacks_chains_and_cycles_of_groups() -> None:
    costs = RecomputeCosts()
    # A chain of 3,000 groups, all released but the last: no recursion limit, each once.
    groups = [Group(f"g{i}", 1, compute=1.0) for i in range(3000)]
    for before, after in zip(groups, groups[1:], strict=False):
        after.dependencies = {before}
        before.set(released=1)
    last = groups[-1]
    last.set(memory=1)
    finish(costs, Task("last", last), Worker("w"))
    costs.refresh()
    assert costs.estimate(last) == 3000.0  # its own and 2,999 ancestors' (size ratio 1)
    # A group that depends on itself through another counts the loop once, not forever.
    a, b = Group("a", 1, compute=1.0), Group("b", 1, compute=1.0)
    a.dependencies, b.dependencies = {b}, {a}
    a.set(memory=1)
    b.set(released=1)
    finish(costs, Task("a", a), Worker("w"))
    costs.refresh()
    assert costs.estimate(a) == 2.0
    # No duration at all: the prefix's average, else unknown.
    p = Group("p", 1, average=3.0)
    u = Group("u", 1)
    assert costs.own(p) == (3.0, PREFIX_AVERAGE)
    assert costs.own(u) == (None, UNKNOWN)


def test_work_at_risk_follows_sole_copies_and_republished_estimates() -> None:
    g = Group("g", 2, compute=20.0)
    costs = RecomputeCosts()
    w1, w2 = Worker("w1"), Worker("w2")
    t1, t2 = Task("t1", g), Task("t2", g)
    finish(costs, t1, w1)
    finish(costs, t2, w1)
    g.set(memory=2)
    costs.refresh()
    assert costs.at_risk["w1"] == 20.0
    # A second copy of t1 on w2: t1 is no longer at risk anywhere.
    t1.who_has.add(w2)
    costs.copy_added(t1, w2, 2)
    assert costs.at_risk["w1"] == 10.0 and costs.at_risk.get("w2", 0) == 0
    # w1 drops its copy: w2 holds t1 alone.
    t1.who_has.discard(w1)
    costs.copy_removed(t1, w1, 1)
    assert costs.at_risk == {"w1": 10.0, "w2": 10.0}
    # The estimate doubles (more compute measured): every holder's risk follows.
    g.all_durations["compute"] = 40.0
    costs.changed = True
    costs.refresh()
    assert costs.at_risk == {"w1": 20.0, "w2": 20.0}
    assert costs.top_at_risk(1) == [("w1", 20.0)]
    assert costs.sole_keys("w2") == 1
    # t2 leaves memory: its only copy goes.
    costs.all_removed(t2)
    assert costs.at_risk["w1"] == 0.0
    assert costs.total_at_risk() == 20.0


def test_small_moves_are_not_republished() -> None:
    g = Group("g", 1, compute=100.0)
    costs = RecomputeCosts()
    finish(costs, Task("t", g), Worker("w"))
    g.set(memory=1)
    assert costs.refresh() == [g]
    g.all_durations["compute"] = 102.0  # 2%: below the tolerance
    costs.changed = True
    assert costs.refresh() == []
    assert costs.estimate(g) == 100.0
    g.all_durations["compute"] = 120.0
    costs.changed = True
    assert costs.refresh() == [g] and costs.estimate(g) == 120.0


def test_keys_are_kept_per_group_only_while_tracked() -> None:
    g = Group("g", 2, compute=2.0)
    costs = RecomputeCosts()
    t = Task("t", g)
    finish(costs, t, Worker("w"))
    assert costs.keys_of(g) == {}
    costs.start_tracking([t])
    assert dict(costs.keys_of(g)) == {"t": t}
    costs.left(t)
    assert costs.keys_of(g) == {}
    costs.stop_tracking()
    assert costs.groups[g].keys is None
