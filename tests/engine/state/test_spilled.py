"""The keys whose rule sets ``spill``, as the spill section takes them: a value per
holder that reported, sent once, the rule's ``last`` infinite and ``first`` zero; and
the governed keys telling them as they are filed."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

from amm_rules.engine.state.governed import GovernedKeys
from amm_rules.engine.state.spilled import RuledKeys
from amm_rules.language.ruleset import Desired, Reason


class Worker:
    """A worker as the scheduler's tasks hold it (hashed by identity)."""

    def __init__(self, address: str) -> None:
        self.address = address


def worker(address: str) -> Any:
    return Worker(address)


def task(key: str, *holders: Any) -> Any:
    return SimpleNamespace(key=key, who_has=set(holders), nbytes=10)


def spill(value: str) -> Desired:
    return Desired(spill=value, reasons={"spill": Reason("rule", "table")})


def test_values_go_to_holders_that_reported_once_each() -> None:
    a, b, c = worker("a"), worker("b"), worker("c")
    table, bulk, gone = task("table", a, b), task("bulk", a), task("gone")
    desired = {"table": spill("last"), "bulk": spill("first"), "gone": spill("last")}
    ruled = RuledKeys()
    ruled.filed([table, bulk, gone])
    sent: dict[str, dict[Any, float]] = {}
    out = ruled.values(desired, {"a"}, sent)  # b has no plugin (not reported)
    assert out == {"a": [("table", math.inf), ("bulk", 0.0)]}
    assert sent == {"a": {"table": math.inf, "bulk": 0.0}}
    # Taken: nothing again; a copy on c is sent to c alone, once.
    assert ruled.values(desired, {"a", "c"}, sent) == {}
    table.who_has.add(c)
    ruled.copied(table, c)
    ruled.copied(table, c)
    assert ruled.values(desired, {"a", "c"}, sent) == {"c": [("table", math.inf)]}
    # A copy gone before the cycle, or a key no rule sets spill for any more: nothing.
    ruled.copied(bulk, c)
    del desired["table"]
    ruled.filed([table])
    assert ruled.values(desired, {"a", "c"}, sent) == {}


def test_governed_keys_tell_the_keys_filed_with_a_spill() -> None:
    governed = GovernedKeys({}, lambda key: None)
    ruled = RuledKeys()
    governed.follow_spill_rules(ruled)
    a = worker("a")
    table, other = task("table", a), task("other", a)
    plain = Desired(spread="host", reasons={"spread": Reason("rule", "hosts")})
    governed.file([(spill("last"), ["table"], [table]), (plain, ["other"], [other])], fresh=True)
    assert ruled.values(governed.desired, {"a"}, {}) == {"a": [("table", math.inf)]}
    governed.follow_spill_rules(None)
    governed.put("again", task("again", a), spill("first"))
    assert ruled.values(governed.desired, {"a"}, {}) == {}
