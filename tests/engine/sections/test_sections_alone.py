"""Sections unit-tested alone, on a small engine context with no cluster behind it
(``tests.support.fake_context``): the replication section's plan for a few keys, the
rebalance section's deferral of a key mid-move, reduce-replicas sparing keys mid-move,
and the status of the sections that only report."""

from __future__ import annotations

from amm_rules.engine.rebalance.plan import Move
from amm_rules.engine.sections.demand import DemandSection
from amm_rules.engine.sections.memory_flow import MemoryFlowSection
from amm_rules.engine.sections.rebalance import RebalanceSection
from amm_rules.engine.sections.reduce_replicas import ReduceReplicasSection
from amm_rules.engine.sections.replication import Replication
from tests.support.fake_context import engine

RULES = """
version: 1
pools:
  gpu: worker.resources.GPU >= 1
rules:
  - name: twice
    match: task.prefix == "x"
    replicate: 2
    spread: host
  - name: device
    match: task.prefix == "d"
    pool: gpu
"""
WORKERS = {
    "a": {"host": "h1", "resources": {"GPU": 1}},
    "b": {"host": "h1"},
    "c": {"host": "h2"},
}


def test_replication_plans_each_key_by_its_rule() -> None:
    # (Sizes unequal: the AMM breaks ties between workers of equal memory by set order.)
    keys = {"x-1": ["a"], "d-1": {"holders": ["b"], "nbytes": 1500}, "z-1": ["b", "c"]}
    e = engine(RULES, WORKERS, keys)
    asked = e.cycle(Replication(e.ctx), ReduceReplicasSection(e.ctx))
    assert asked == [
        ("drop", "b", "z-1"),  # no rule: reduce-replicas keeps one copy (off the fuller b)
        ("replicate", "a", "d-1"),  # into its pool
        ("replicate", "c", "x-1"),  # its second copy, on the other host
    ]
    index = e.ctx.index
    assert set(index.desired) == {"x-1", "d-1"}
    ledger = e.ctx.ledger
    assert ledger.in_flight("x-1").keys() == {"c"} and ledger.in_flight("d-1").keys() == {"a"}
    assert {c.by for key in ("x-1", "d-1") for c in ledger.in_flight(key).values()} == {
        "replication"
    }
    # The next cycle waits for the copies in flight: nothing new is asked.
    assert [op for op in e.cycle(Replication(e.ctx), now=1.0)] == []


def test_a_key_mid_move_is_not_trimmed_by_replication_nor_reduce_replicas() -> None:
    workers = {**WORKERS, "d": {"host": "h3"}}
    e = engine(RULES, workers, {"x-1": ["a", "b", "c"], "z-1": ["b", "c"]})
    rebalance = RebalanceSection(e.ctx)
    e.attach(rebalance)
    # Moves in flight to d, their copies not landed yet: the extra copies are the moves'
    # to drop once they land, not replication's nor reduce-replicas'.
    for key, sender in (("x-1", "a"), ("z-1", "b")):
        rebalance.rebalancer.book.start(Move(key, sender, "d", 1000), 0.0)
    assert e.cycle(rebalance) == []  # (a cycle holds the keys of the moves in flight)
    assert set(e.ctx.claims.of("rebalance")) == {"x-1", "z-1"}
    assert e.ctx.ledger.moves.keys() == {"x-1", "z-1"}
    sections = (Replication(e.ctx), rebalance, ReduceReplicasSection(e.ctx))
    assert e.cycle(*sections) == []
    # Without the moves, both are trimmed in the same cycle.
    e = engine(RULES, workers, {"x-1": ["a", "b", "c"], "z-1": ["b", "c"]})
    asked = e.cycle(Replication(e.ctx), RebalanceSection(e.ctx), ReduceReplicasSection(e.ctx))
    assert {(op, key) for op, _, key in asked} == {("drop", "x-1"), ("drop", "z-1")}


def test_sections_that_only_report() -> None:
    e = engine(RULES, WORKERS, {"x-1": ["a"]})
    demand, flow = DemandSection(e.ctx), MemoryFlowSection(e.ctx)
    e.attach(demand, flow)
    assert demand.status() == {
        "following": False,
        "hold": 0.0,
        "match": None,
        "keys_read": 0,
        "seeded": 0,
    }
    assert flow.status()["prefixes"] == 0
    assert list(demand.run(None)) == []  # type: ignore[arg-type]
