"""Shared test configuration: hypothesis profiles, the ``slow`` marker, and the checks
every test gets.

``CI=true`` selects the ``ci`` hypothesis profile (bounded, derandomized example counts
so a CI run is reproducible and fits its time budget); long stress and soak runs are
marked ``slow`` and only run with ``--run-slow``.

At the start of the run, what the host harness (:mod:`benchmarks.support.hosts`) of an
earlier run that died left behind is removed.

Every test fails, after its own checks pass:

- if the engine emitted an ``error``, ``rule-error`` or ``audit`` event while it ran
  (:mod:`tests.support.engine_errors`), unless it is marked
  ``@pytest.mark.engine_errors("error", ...)`` with the actions it provokes on purpose;
- if the deadlines of its waits add up to more than its own timeout
  (:mod:`benchmarks.support.waiting`): a wait must fail with its own message, before the
  test's timeout cuts it short;
- (at its teardown) if a policy it attached is still scraped by the process's
  ``/metrics``: it was never detached, and every later test's scrape would show it.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from amm_rules.observe import metrics
from benchmarks.support import hosts
from benchmarks.support.waiting import BUDGET, declared_timeout
from tests.support import engine_errors
from tests.support.env import in_ci

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if in_ci() else "dev")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-slow", action="store_true", default=False, help="run tests marked slow"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_sessionstart(session: pytest.Session) -> None:
    # Namespaces, links and processes of the host harness that an earlier run left
    # when it died (by the harness's name prefix, and only of runs no longer alive).
    hosts.sweep()


def _timeout_of(item: pytest.Item) -> float:
    """The test's own timeout: gen_cluster's or gen_test's, else pytest-timeout's."""
    declared = declared_timeout(getattr(item, "obj", None))
    if declared is not None:
        return declared
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(item.config.getini("timeout") or 300)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    BUDGET.reset()
    with engine_errors.recording() as seen:
        result = yield
    marker = item.get_closest_marker("engine_errors")
    allowed = set(engine_errors.ERROR_ACTIONS if marker and not marker.args else ())
    if marker is not None:
        allowed.update(marker.args)
    unexpected = [e for e in seen if e["action"] not in allowed]
    if unexpected:
        pytest.fail(
            f"the engine reported {len(unexpected)} unexpected event(s): {unexpected[:5]} "
            "(a test that provokes them says so with @pytest.mark.engine_errors(...))",
            pytrace=False,
        )
    timeout = _timeout_of(item)
    if BUDGET.spent >= timeout:
        pytest.fail(
            f"the deadlines of this test's {BUDGET.waits} waits add up to {BUDGET.spent:.0f} s, "
            f"not less than its timeout of {timeout:.0f} s: raise the timeout (a slow run "
            "must fail at the wait that names its condition)",
            pytrace=False,
        )
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, Any, Any]:
    result = yield
    # A policy still scraped once its test is over was never detached: its scheduler's
    # figures would stay in every later /metrics of the process (another test's).
    collector = metrics.registered()
    left = list(collector.policies) if collector is not None else []
    for policy in left:
        metrics.unregister(policy)
    if left:
        pytest.fail(
            f"{len(left)} policy(ies) still attached after the test (scraped by /metrics "
            "for every later test of the process): detach them (RulesPolicy.detach, or "
            "close the scheduler they run on)",
            pytrace=False,
        )
    return result
