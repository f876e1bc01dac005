"""The ``rebalance`` and ``demand`` sections' matches read a task as the rules do: the
span's state comes from the spans the engine follows, which a match of either section
asks it to follow (``task.span_done`` read only there was always false)."""

from __future__ import annotations

from types import SimpleNamespace

from amm_rules import load_ruleset
from amm_rules.engine.rebalance.rebalancer import Rebalancer
from amm_rules.engine.state.spans import SpanStates


class Task:
    """A key in memory of span ``s`` (hashable, as the scheduler's tasks are)."""

    key = "x-1"
    state = "memory"
    actor = False
    waiters = ()
    group = SimpleNamespace(span_id="s")


def test_a_section_match_reading_the_span_makes_the_engine_follow_spans() -> None:
    for section in ("rebalance", "demand"):
        ruleset = load_ruleset({"version": 1, section: {"match": "task.span_done"}})
        assert ruleset.follows_spans and not ruleset.reads_span_state, section
    plain = load_ruleset({"version": 1, "rebalance": {"match": "task.nbytes > 0"}})
    assert plain.rebalance_depends == {"nbytes"} and not plain.follows_spans


def test_the_rebalance_match_sees_the_span_state() -> None:
    ruleset = load_ruleset({"version": 1, "rebalance": {"match": "task.span_done"}})
    rebalancer = Rebalancer()
    rebalancer.configure(ruleset.rebalance)
    rebalancer.spans = spans = SpanStates()
    ts = Task()
    manager = SimpleNamespace(pending={})
    spans.set("s", False)
    can_move = rebalancer._can_move({"x-1": ts}, manager, {}, {})
    assert can_move("x-1", "tcp://a") == "outside rebalance.match"
    spans.set("s", True)
    assert can_move("x-1", "tcp://a") is None
