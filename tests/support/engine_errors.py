"""Engine events that mean something went wrong inside the engine, recorded while a test
runs, so that no cluster test passes while the engine fails behind it.

A cycle that raises becomes an ``error`` event and the rest of the cycle is skipped; a
match or pool that raises becomes a ``rule-error`` event and counts as "no match"; an
``audit`` event says the scheduler hooks missed a change. None of them stops the
scheduler, so a test that only looks at copies can pass while the engine is broken.

``tests/conftest.py`` records every such event of every test (every RulesPolicy of the
test process: ``gen_cluster``, ``LocalCluster``, ad-hoc managers) and fails the test if
one was emitted, unless the test is marked ``@pytest.mark.engine_errors(...)`` with the
actions it provokes on purpose (no arguments: any). Schedulers in other processes are
checked by their tests through ``client.get_events("amm-rules")``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The actions that mean the engine failed, or its hooks missed something.
ERROR_ACTIONS = frozenset({"error", "rule-error", "audit"})


@contextmanager
def recording() -> Iterator[list[dict[str, Any]]]:
    """Record the :data:`ERROR_ACTIONS` events every ``EventLog`` emits in the block."""
    from amm_rules.engine.events import EventLog

    seen: list[dict[str, Any]] = []
    original = EventLog.emit

    def emit(self: EventLog, action: str, **fields: Any) -> None:
        if action in ERROR_ACTIONS:
            seen.append({"action": action, **fields})
        original(self, action, **fields)

    EventLog.emit = emit  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        EventLog.emit = original  # type: ignore[method-assign]
