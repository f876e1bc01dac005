"""The spill section's cycle on a recorded cluster (no workers): the values it sends,
the copies it drops and those it leaves (claims, copies in flight, workers leaving, a
rule's min, spread), the drops in the ledger, and what explain says of them."""

from __future__ import annotations

from typing import Any

from amm_rules.engine.decide.deciders import Question, decide
from amm_rules.engine.sections.spill import BACK_OFF, SpillSection
from amm_rules.engine.state.leaving import Departure
from tests.support.fake_context import Engine, engine

MB = 10**6
TARGET = 100 * MB
RULES = """
version: 1
spill: {order: value, drop-copies: true}
rules:
  - {name: copies, match: "task.prefix == 'copy'", replicate: {min: 1, max: 3}}
  - {name: pinned, match: "task.prefix == 'pinned'", replicate: 2}
  - {name: table, match: "task.prefix == 'lookup'", spill: last}
"""


def cluster(copies: int = 6) -> Engine:
    keys: dict[str, Any] = {
        f"copy-{i}": {"holders": ["a", "b"], "nbytes": 10 * MB} for i in range(copies)
    }
    keys |= {
        "pinned-0": {"holders": ["a", "b"], "nbytes": 10 * MB},
        "sole-0": {"holders": ["a"], "nbytes": 10 * MB},
        "lookup-0": {"holders": ["a"], "nbytes": MB},
    }
    return engine(RULES, {"a": {}, "b": {}, "c": {"host": "h2"}}, keys)


def report(section: SpillSection, worker: str, fullness: float) -> None:
    """What the worker plugin would report: its buffer ``fullness`` of its target."""
    section.on_report(worker=worker, fast=fullness * TARGET, target=TARGET, order="value")


def test_values_are_sent_only_for_what_the_worker_does_not_know():
    e = cluster()
    section = SpillSection(e.ctx)
    e.attach(section)
    report(section, "a", 0.6)
    assert e.cycle(section) == []
    (message,) = e.cluster.stream_comms["a"]
    values = dict(message["values"])
    assert values["lookup-0"] == float("inf"), "the rule's spill: last"
    assert values["copy-0"] == 0.0, "held elsewhere too, may be dropped: nothing to write"
    assert values["pinned-0"] > 0.0, "held elsewhere, but the rule's min keeps it: a write"
    assert "sole-0" not in values, "a sole copy nobody else reads: the worker knows it all"
    assert e.cluster.stream_comms["b"] == [], "b is not near its target"
    e.cycle(section)
    assert e.cluster.stream_comms["a"] == [message], "nothing changed: nothing sent again"


def test_copies_held_elsewhere_are_dropped_from_a_worker_near_its_target():
    e = cluster(copies=5)
    ctx = e.ctx
    section = SpillSection(ctx)
    e.attach(section)
    ctx.claims.hold("copy-0", "rebalance", "moving it")  # held whole
    ctx.claims.hold("copy-1", "protect", "dear", alone=False, keeps=2)
    ctx.ledger.record("copy-2", "c", "replication", 100.0)
    report(section, "a", 0.95)
    assert e.cycle(section, now=1.0) == [], "the first cycle finds the candidates"
    dropped = e.cycle(section, now=2.0)
    # 25 MB to give up (95% -> 70% of 100 MB), three copies of 10 MB would do; two may go.
    assert dropped == [("drop", "a", "copy-3"), ("drop", "a", "copy-4")], (
        "never a key held whole, a kept copy, one in flight, or below a rule's min"
    )
    e.cluster.enact()
    assert section.drops["a"] == 2 and e.cycle(section, now=3.0) == []

    key = "copy-3"
    drop = ctx.ledger.drops_of(key)["a"]
    assert drop.by == "spill" and drop.until == 2.0 + BACK_OFF
    assert ctx.ledger.backing_off(key) == {"a": 2.0 + BACK_OFF}
    ts = e.cluster.tasks[key]
    view = ctx.key_view(ts, ctx.index.desired[key])
    a = ctx.cluster_view().workers["a"]
    said = [d.why for d in decide(Question(view, ctx.cluster_view()), a)]
    assert any("dropped by spill" in why and "not asked again" in why for why in said), said
    lines = section.explain(ts, 5.0)["lines"]
    assert any(line.startswith("dropped from a 3.0 s ago: held elsewhere") for line in lines)


def test_no_copy_is_dropped_whose_other_holder_is_leaving():
    e = cluster()
    section = SpillSection(e.ctx)
    e.attach(section)
    e.ctx.departures.leave("b", Departure("drain", "drained"))
    report(section, "a", 0.95)
    e.cycle(section, now=1.0)
    assert e.cycle(section, now=2.0) == [], "b's copies do not count: a's are the last"


def test_dry_run_counts_the_drops_and_asks_nothing():
    e = engine(
        RULES.replace("version: 1", "version: 1\nenforcement: dry-run"),
        {"a": {}, "b": {}},
        {f"copy-{i}": {"holders": ["a", "b"], "nbytes": 10 * MB} for i in range(4)},
    )
    section = SpillSection(e.ctx)
    e.attach(section)
    report(section, "a", 0.95)
    e.cycle(section, now=1.0)
    assert e.cycle(section, now=2.0) == []
    assert section.would_drop == 3 and not e.ctx.ledger.drops


def test_status_lists_the_workers_with_most_on_disk_and_counts_by_rule():
    e = cluster()
    section = SpillSection(e.ctx)
    e.attach(section)
    section.on_report(
        worker="a",
        spilled=[("lookup-0", 4.0, MB), ("sole-0", 2.0, 10 * MB)],
        fast=0.2 * TARGET,
        target=TARGET,
        order="value",
    )
    report(section, "b", 0.1)
    # The count by rule goes on across cycles, a slice of each: a busy machine may need
    # more than one.
    for _ in range(1000):
        e.cycle(section)
        if section.by_rule.at is not None:
            break
    status = section.status()
    assert status is not None
    assert list(status["workers"]) == ["a", "b"], "most bytes on disk first"
    assert status["bytes_on_disk"] == 11 * MB and status["keys_on_disk"] == 2
    assert status["bytes_on_disk_by_rule"] == {"(no rule)": 10 * MB, "table": MB}
