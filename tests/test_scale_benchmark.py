"""Smoke test of the scale benchmark's state builder (:mod:`benchmarks.support.scheduler_state`).

The benchmark's numbers mean something only if the state it builds is a consistent
scheduler state in which the rules are already met. This builds a small one (2,000
keys, 10 workers) and checks the scheduler's own bookkeeping, then runs one RulesPolicy
cycle and one stock ReduceReplicas cycle on it. No timing is asserted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension, ReduceReplicas

from amm_rules import load_ruleset
from amm_rules.engine.adapters import TaskFactsAdapter
from amm_rules.engine.policy import RulesPolicy
from amm_rules.language.ruleset import CLASS_ATTRIBUTES, UNGOVERNED
from benchmarks.support import scheduler_state

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
RULES = BENCHMARKS / "rules" / "scale.yaml"
N_KEYS = 2_000
N_WORKERS = 10


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture
def state(loop: asyncio.AbstractEventLoop) -> Iterator[Any]:
    built = loop.run_until_complete(
        scheduler_state.build_state(N_KEYS, N_WORKERS, load_ruleset(RULES))
    )
    yield built
    loop.run_until_complete(built.scheduler.close())


# The policies below classify every key in their first cycle (``classify_seconds=None``):
# these tests check the steady state, and the time budget, which spreads classification
# over cycles on a slow machine, is tested in tests/engine/sections/replication/test_classification_budget.py.


def manager(scheduler: Any, policy: Any) -> ActiveMemoryManagerExtension:
    return ActiveMemoryManagerExtension(scheduler, {policy}, register=False, start=False)


def run_cycle(state: Any, amm: ActiveMemoryManagerExtension) -> tuple[list, list]:
    """One AMM cycle; the copies and drops it asked for, as sorted (key, address) pairs."""
    state.transfers.clear()
    amm.run_once()
    asked = state.transfers.take()
    copies = sorted((k, a) for a, keys in asked.acquire for k in keys)
    drops = sorted((k, a) for a, keys in asked.remove for k in keys)
    return copies, drops


def test_state_is_consistent(state: Any) -> None:
    s = state.scheduler
    in_memory = [ts for ts in s.tasks.values() if ts.state == "memory"]
    assert len(in_memory) == N_KEYS == len(state.keys)
    assert len(s.workers) == N_WORKERS == len(s.running)
    assert len(s.task_prefixes) == len(scheduler_state.PREFIXES)
    # 2 of every 10 workers declare a GPU, through the scheduler's resource bookkeeping.
    assert len(s.resources["GPU"]) == 2 * N_WORKERS // 10
    assert sum(len(dh["addresses"]) for dh in s.host_info.values()) == N_WORKERS

    # who_has and has_what are two views of the same relation; nbytes add up.
    for ts in in_memory:
        assert ts.who_has
        assert ts.nbytes > 0
        for ws in ts.who_has:
            assert ts in ws.has_what
    for ws in s.workers.values():
        for ts in ws.has_what:
            assert ws in ts.who_has
        assert ws.nbytes == sum(ts.nbytes for ts in ws.has_what)
    assert s.replicated_tasks == {ts for ts in in_memory if len(ts.who_has) > 1}

    # 10% of the keys are under a replication target, and hold it.
    assert state.census["under a replication target"] == N_KEYS // 10
    assert {len(ts.who_has) for ts in s.replicated_tasks} == {2, 3}
    assert all(ts.type for ts in in_memory)


def test_rules_met_and_extra_copies_dropped(state: Any) -> None:
    s = state.scheduler
    policy = RulesPolicy(rules=RULES, classify_seconds=None)
    rules_amm = manager(s, policy)
    stock_amm = manager(s, ReduceReplicas())

    # The steady state: the rules want exactly what the cluster holds.
    assert run_cycle(state, rules_amm) == ([], [])
    assert len(policy.index) == state.census["governed"]
    assert run_cycle(state, rules_amm) == ([], [])
    # An audit sweep of this state finds nothing the hooks missed, and asks for nothing.
    policy.auditor.next_sweep = 0.0
    sweeps = policy.auditor.sweeps
    while policy.auditor.sweeps == sweeps:
        assert run_cycle(state, rules_amm) == ([], [])
    assert policy.auditor.last == {"governed_gone": 0, "replicated_unknown": 0}

    # The stock policy, which knows no rules, drops every extra copy.
    copies, drops = run_cycle(state, stock_amm)
    assert copies == []
    assert len(drops) == sum(len(ts.who_has) - 1 for ts in s.replicated_tasks)

    # One extra copy of a key with `replicate: 2` and of a key no rule governs.
    two = next(ts.key for ts in s.replicated_tasks if ts.prefix.name == "read_parquet_0")
    free = next(
        ts.key
        for ts in s.tasks.values()
        if ts.prefix.name == "mul_0" and ts.key not in policy.index
    )
    scheduler_state.add_copies(state, [two, free])
    copies, drops = run_cycle(state, rules_amm)
    assert copies == []
    assert sorted(k for k, _ in drops) == sorted([two, free])


def test_lost_copies_and_new_keys(state: Any) -> None:
    s = state.scheduler
    policy = RulesPolicy(rules=RULES, classify_seconds=None)
    rules_amm = manager(s, policy)
    assert run_cycle(state, rules_amm) == ([], [])

    # A replicated key that lost a copy gets it back.
    (lost,) = scheduler_state.lose_copies(state, 1)
    copies, drops = run_cycle(state, rules_amm)
    assert [k for k, _ in copies] == [lost] and drops == []

    # New keys go through the scheduler's transitions into memory and out again.
    keys = scheduler_state.new_key_names(state, 100)
    transitions = scheduler_state.compute_keys(state, keys)
    assert transitions >= 3 * len(keys)  # released -> waiting -> processing -> memory
    assert all(s.tasks[k].state == "memory" for k in keys)
    assert not state.outbox
    scheduler_state.release_keys(state, keys)
    assert not any(k in s.tasks for k in keys)


@pytest.mark.parametrize("name", ["scale.yaml", "scale-groups.yaml"])
def test_keys_entering_memory_at_once_are_classified_by_the_cascade(state: Any, name: str) -> None:
    """What the benchmark's time-to-govern rows measure, on real scheduler tasks and
    groups: every key is handed to the transition hook as it enters memory, the cycles
    classify them by task group, and each ends up filed as Ruleset.resolve says."""
    s = state.scheduler
    ruleset = load_ruleset(BENCHMARKS / "rules" / name)
    policy = RulesPolicy(rules=ruleset, classify_keys=700)
    amm = manager(s, policy)
    run_cycle(state, amm)
    keys = [k for k, ts in s.tasks.items() if ts.state == "memory"]
    for key in keys:
        policy.index.forget(key)
        policy.index.transition(key, "processing", "memory")
    cycles = 0
    while policy.index.unclassified:
        run_cycle(state, amm)
        cycles += 1
    assert cycles == -(-len(keys) // 700)
    for key in keys:
        ts = s.tasks[key]
        expected = ruleset.resolve(
            TaskFactsAdapter(ts), annotation=policy.classifier.annotation(ts)
        )
        assert policy.index.desired.get(key, UNGOVERNED) == expected, key


def test_the_group_level_rules_read_only_group_level_attributes() -> None:
    """The benchmark's two rules files differ in what they read, and only there."""
    per_key = load_ruleset(BENCHMARKS / "rules" / "scale.yaml")
    groups = load_ruleset(BENCHMARKS / "rules" / "scale-groups.yaml")
    assert groups.depends <= CLASS_ATTRIBUTES
    assert per_key.depends - CLASS_ATTRIBUTES == {"key", "nbytes"}
    assert [r.name for r in groups.rules] == [r.name for r in per_key.rules]
    assert [r.actions for r in groups.rules] == [r.actions for r in per_key.rules]


def test_time_to_govern_benchmark_runs_on_a_small_state() -> None:
    """``python -m benchmarks.govern`` at 2,000 keys: every run governs what the rules
    file governs (no timing asserted)."""
    from benchmarks import govern

    runs = govern.run(N_KEYS, N_WORKERS, 1, ["groups", "per-key"])
    steady, *rounds = runs
    assert steady["file"] == "steady"
    assert [r["file"] for r in rounds] == ["groups", "per-key"]
    for row in rounds:
        assert row["cycles"] >= 1 and row["governed_keys"] > 0
        assert len(row["cycles_s"]) == row["cycles"]
        assert row["p95_cycle_s"] <= row["max_cycle_s"]
    assert set(govern.medians(runs)) == {"groups", "per-key"}


def test_the_protect_measurement_protects_within_its_budget_and_cleans_up(state: Any) -> None:
    """The benchmark's ``protect`` rows at 2,000 keys: the section protects keys (the
    groups were given compute times), their copies land, the budget holds, and the
    state is left as it was found: no extra copy, no plugin (no timing asserted)."""
    from benchmarks import scale

    scheduler = state.scheduler
    replicas = sum(len(ts.who_has or ()) for ts in scheduler.tasks.values())
    plugins = set(scheduler.plugins)
    out = scale.measure_protect(state, n=2, rounds=1)
    assert out["protected_keys"] > 0
    assert 0 < out["protected_bytes"] <= 2 * 2**30
    assert out["seconds_protected"] > 0 and out["groups_known"] > 0
    assert out["landed_after_cycles"] >= 2 and out["choice_cycles"] >= 1
    assert out["steady"]["copies"] == out["steady"]["drops"] == 0  # nothing left to do
    assert sum(len(ts.who_has or ()) for ts in scheduler.tasks.values()) == replicas
    assert set(scheduler.plugins) == plugins


def test_the_adaptive_measurement_asks_both_and_cleans_up(state: Any) -> None:
    """The benchmark's ``adaptive`` rows at 2,000 keys: distributed's answers, then the
    section's (the guard keeps the workers the rules need: none is asked to close more
    than the rules allow), and the scheduler's methods and plugins as they were found
    (no timing asserted)."""
    from benchmarks import scale

    scheduler = state.scheduler
    plugins = set(scheduler.plugins)
    methods = {name: vars(scheduler).get(name) for name in ("adaptive_target", "workers_to_close")}
    out = scale.measure_adaptive(state, n=2)
    assert {"stock_target", "stock_close", "target", "close"} <= set(out)
    assert out["half"] >= 1 and out["kept"] >= 0
    assert set(scheduler.plugins) == plugins
    assert {name: vars(scheduler).get(name) for name in methods} == methods
