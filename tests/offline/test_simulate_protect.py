"""``amm-rules simulate`` with the recompute estimates and the ``protect:`` section, on
a recorded cluster whose dump has task groups: the estimate from the groups' compute
seconds and released ancestors, ``--kill`` saying what losing a worker costs, and the
copies protection would make, within its budget."""

from __future__ import annotations

from amm_rules.language.loader import load_ruleset
from amm_rules.offline.commands import run_simulation
from amm_rules.offline.dump import ClusterState, GroupRecord, TaskRecord, WorkerRecord
from amm_rules.offline.report import render_text

MiB = 2**20


def state() -> ClusterState:
    """Three workers on two hosts; ``load`` released (8 tasks of 600 s each), ``agg``
    (2 keys, 60 s each, reading 4 loads each) on w1 alone; ``small`` (cheap) on w2."""
    workers = {
        f"w{i}": WorkerRecord(f"w{i}", f"w{i}", host, "running", memory_limit=1024 * MiB)
        for i, host in ((1, "h1"), (2, "h1"), (3, "h2"))
    }
    tasks = {}
    for i in range(8):
        tasks[f"load-{i}"] = TaskRecord(f"load-{i}", "released", "load", "load")
    for i in range(2):
        tasks[f"agg-{i}"] = TaskRecord(
            f"agg-{i}", "memory", "agg", "agg", nbytes=MiB, who_has=("w1",)
        )
    tasks["small-0"] = TaskRecord(
        "small-0", "memory", "small", "small", nbytes=MiB, who_has=("w2",)
    )
    workers["w1"].has_what = ["agg-0", "agg-1"]
    workers["w2"].has_what = ["small-0"]
    groups = {
        "load": GroupRecord("load", 8 * 600.0, {"released": 8}),
        "agg": GroupRecord("agg", 2 * 60.0, {"memory": 2}, ("load",)),
        "small": GroupRecord("small", 0.5, {"memory": 1}),
    }
    return ClusterState("test", workers, tasks, groups=groups)


def simulate(rules: dict, kill: tuple[str, ...] = ()) -> dict:
    return run_simulation(
        load_ruleset(rules),
        state(),
        measure="managed",
        interval=2.0,
        kill=(kill, (), ()),
    )


def test_kill_says_what_losing_a_worker_costs() -> None:
    report = simulate({"version": 1}, kill=("w1",))
    # Each agg key: its own 60 s and 4 of the released loads' 600 s (groups of 8 and 2).
    assert report["recompute_lost"] == {"w1": 2 * (60.0 + 4 * 600.0)}
    text = render_text(report)
    assert "losing w1 costs ≈ 82m 0s of recompute" in text


def test_protect_is_simulated_within_its_budget() -> None:
    report = simulate({"version": 1, "protect": {"budget": "1.5 MiB", "min-recompute": "1 min"}})
    added = [(a["key"], a["worker"]) for a in report["actions"] if a["op"] == "replicate"]
    # Room for one extra copy: one agg key, on the other host (spread: host); small-0
    # is below min-recompute.
    assert len(added) == 1
    key, worker = added[0]
    assert key.startswith("agg-") and worker == "w3"
    assert all(a["rule"] == "(protect)" for a in report["actions"])
