"""Waiting in cluster tests: on a condition, with a generous deadline that fails the test,
never a fixed sleep before an assert.

- :func:`wait_for` polls a condition until it holds; past its deadline it fails, naming
  what it waited for and what it saw last; :func:`poll` does the same for a value
  (fetched, or awaited, each time) and returns it;
- :func:`cycles` runs AMM cycles of a manager the test drives (``start=False``), and
  :func:`cycle_until` runs them until a condition holds;
- :func:`wait_cycles` waits until the scheduler's own AMM has run its RulesPolicy ``n``
  more times: the way to say "and it stays so" (check, together with
  :class:`tests.support.cluster.Requests`, that nothing was asked in those cycles).

Deadlines are seconds for what takes tens of milliseconds on a quiet machine: they
catch a hang, they never measure speed. Every deadline is charged to the running test's
*poll budget* (:data:`BUDGET`); ``tests/conftest.py`` fails a test whose budget exceeds
its own timeout (``gen_cluster(timeout=...)``), so that a slow run fails at the wait
that names the condition, not at an anonymous test timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

#: The default deadline of one wait, in seconds.
WAIT = 20.0
#: Seconds between two looks at a condition.
PERIOD = 0.01
#: Seconds between two cycles of a manager the test drives: long enough for the
#: messages of a cycle to reach the workers and most transfers to land.
PACE = 0.05


class Budget:
    """The sum of the deadlines of the waits a test ran (reset by ``conftest``)."""

    def __init__(self) -> None:
        self.spent = 0.0
        self.waits = 0

    def reset(self) -> None:
        self.spent = 0.0
        self.waits = 0

    def charge(self, seconds: float) -> None:
        self.spent += seconds
        self.waits += 1


BUDGET = Budget()


def _describe(show: Callable[[], Any] | None) -> str:
    if show is None:
        return ""
    try:
        return f"; last seen: {show()!r}"
    except Exception as exc:  # the description must not hide the timeout
        return f"; (describing the state raised {exc!r})"


async def wait_for(
    condition: Callable[[], Any],
    what: str,
    timeout: float = WAIT,
    show: Callable[[], Any] | None = None,
) -> None:
    """Poll ``condition`` until it is true; fail after ``timeout`` seconds, saying
    ``what`` was awaited and, if given, ``show()`` of the last state."""
    BUDGET.charge(timeout)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what}{_describe(show)}")
        await asyncio.sleep(PERIOD)


async def poll(
    fetch: Callable[[], Any],
    check: Callable[[Any], Any],
    what: str,
    timeout: float = WAIT,
) -> Any:
    """Fetch a value (``fetch()``, or its awaitable) until ``check(value)`` holds, and
    return that value; fail after ``timeout`` seconds, showing the last value."""
    BUDGET.charge(timeout)
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if inspect.isawaitable(value):
            value = await value
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what}; last seen: {value!r}")
        await asyncio.sleep(PERIOD)


def wait_for_sync(
    condition: Callable[[], Any],
    what: str,
    timeout: float = WAIT,
    show: Callable[[], Any] | None = None,
) -> None:
    """:func:`wait_for` for tests with a synchronous client."""
    BUDGET.charge(timeout)
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout} s: {what}{_describe(show)}")
        time.sleep(PERIOD)


def _manager(amm_or_scheduler: Any) -> Any:
    extensions = getattr(amm_or_scheduler, "extensions", None)
    return extensions["amm"] if extensions is not None else amm_or_scheduler


async def cycles(amm_or_scheduler: Any, n: int = 3) -> None:
    """Run ``n`` AMM cycles of a manager (or of a scheduler's own ``amm`` extension),
    :data:`PACE` apart so that what each asked for reaches the workers."""
    amm = _manager(amm_or_scheduler)
    for _ in range(n):
        amm.run_once()
        await asyncio.sleep(PACE)


async def cycle_until(
    amm: Any,
    condition: Callable[[], Any],
    what: str,
    timeout: float = WAIT,
    show: Callable[[], Any] | None = None,
) -> int:
    """Run cycles of a manager the test drives until ``condition`` holds; return how
    many it took. Fails after ``timeout`` seconds."""
    BUDGET.charge(timeout)
    deadline = time.monotonic() + timeout
    ran = 0
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"not reached within {timeout} s ({ran} cycles): {what}{_describe(show)}"
            )
        _manager(amm).run_once()
        ran += 1
        await asyncio.sleep(PACE)
    return ran


async def wait_cycles(scheduler: Any, n: int, timeout: float = WAIT) -> None:
    """Wait until the RulesPolicy of the scheduler's own AMM has run ``n`` more cycles."""
    from benchmarks.support.cluster import policy_of

    policy = policy_of(scheduler)
    start = policy.cycles
    await wait_for(lambda: policy.cycles - start >= n, f"{n} more AMM cycles", timeout)


def declared_timeout(test: Callable[..., Any]) -> float | None:
    """The timeout a ``gen_cluster`` or ``gen_test`` test was declared with, found in the
    closure of the wrapper they build around the test; None if there is none."""
    todo, seen = [test], set()
    while todo:
        fn = todo.pop(0)  # breadth first: the outermost wrapper's timeout
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        cells = dict(zip(code.co_freevars, fn.__closure__ or (), strict=True)) if code else {}
        if "timeout" in cells:
            value = cells["timeout"].cell_contents
            if isinstance(value, (int, float)):
                return float(value)
        for cell in cells.values():
            try:
                inner = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if inspect.isfunction(inner):
                todo.append(inner)
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None:
            todo.append(wrapped)
    return None
