"""What ``amm-rules simulate`` does not run is said: the sections of the engine that a
recorded cluster cannot run (paused workers, memory pressure, ...), when the rules use
them, are named with why in the result, and in the report's text and JSON."""

from __future__ import annotations

import yaml

from amm_rules.language.loader import load_ruleset
from amm_rules.offline.dump import ClusterState, TaskRecord, WorkerRecord
from amm_rules.offline.report import render_text, simulation_report
from amm_rules.offline.sim_cluster import SimCluster
from amm_rules.offline.simulate import Simulation

RULES = """
version: 1
rules:
  - name: twice
    match: task.prefix == "x"
    replicate: 2
"""
SECTIONS = """
paused-workers:
  after: 30s
  action: report
memory-pressure:
  threshold: 60%
"""


def state() -> ClusterState:
    workers = {
        a: WorkerRecord(
            address=a,
            name=a,
            host="h1",
            status="running",
            memory_limit=10**9,
            memory={"managed": 100, "process": 100},
            has_what=["x-1"] if a == "a" else [],
        )
        for a in ("a", "b")
    }
    task = TaskRecord(key="x-1", state="memory", prefix="x", group="x", nbytes=100, who_has=("a",))
    return ClusterState("test", workers, {"x-1": task})


def simulate(rules: str) -> Simulation:
    return Simulation(load_ruleset(yaml.safe_load(rules)), SimCluster(state()), measure="managed")


def test_sections_the_rules_use_and_a_simulation_cannot_run_are_named() -> None:
    sim = simulate(RULES + SECTIONS)
    result = sim.run()
    assert [why.split(":")[0] for why in result.not_simulated] == [
        "memory-pressure",
        "paused-workers",
    ]
    assert all("not simulated: " in why for why in result.not_simulated)
    # The sections it runs did their work: the key got its second copy.
    assert [(a.op, a.key, a.worker) for a in result.actions] == [("replicate", "x-1", "b")]
    report = simulation_report(sim, result)
    assert report["not_simulated"] == result.not_simulated
    text = render_text(report)
    assert "note: paused-workers: not simulated: the workers of a recorded cluster" in text


def test_nothing_is_said_when_the_rules_use_only_what_it_runs() -> None:
    sim = simulate(RULES)
    result = sim.run()
    assert result.not_simulated == []
    assert "note:" not in render_text(simulation_report(sim, result))
