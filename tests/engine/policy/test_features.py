"""The feature check at attach (amm_rules.engine.features): an internal of dask or
distributed that a feature needs is taken away on a real scheduler, within the test,
and the feature says it is off, in the same words, in the log, as one ``unsupported``
event, in ``status`` (text too), on the page's header and from ``amm-rules validate
--dask-config``. On the declared floor and above, nothing is missing."""

from __future__ import annotations

import html
from pathlib import Path

import dask._task_spec
import pytest
import yaml
from click.testing import CliRunner
from distributed import Scheduler
from distributed.utils_test import gen_cluster

from amm_rules.cli import main
from amm_rules.engine import features
from amm_rules.engine.features import DATA_PRODUCER, Feature, missing, words
from amm_rules.engine.sections import SECTIONS
from amm_rules.engine.sections.adaptive import AdaptiveSection
from amm_rules.engine.sections.memory_pressure import CALLBACK, MemoryPressure
from amm_rules.engine.sections.paused_workers import RESTART, PausedWorkers
from amm_rules.observe.dashboard import header_html
from amm_rules.observe.status import status_report
from amm_rules.observe.text import render_status
from benchmarks.support.waiting import wait_cycles
from tests.support.cluster import amm_config, events, policy_of
from tests.support.pressure import section
from tests.support.rulesets import rules

pytestmark = pytest.mark.compat

PRESSURE = "memory-pressure: off: needs dask >= 2025.1 (Task._data_producer)"
RESTARTS = (
    "paused-workers: action: restart: off: needs distributed >= 2024.4.0 "
    "(Scheduler.restart_workers(on_error=, stimulus_id=))"
)


def test_every_feature_is_supported_here() -> None:
    """This environment is at or above the declared floor: nothing is missing."""
    every = [features.ENGINE, features.WORKER_WATCH, features.PROMETHEUS, features.DASHBOARD]
    every += [f for cls in SECTIONS for f in cls.FEATURES]
    assert {f.name: missing(f) for f in every} == {f.name: [] for f in every}


def test_the_words_name_each_release_once() -> None:
    assert words("memory-pressure", [DATA_PRODUCER]) == PRESSURE
    a, b, c = features.RETIRING + (features.RESTART_WORKERS,)
    assert words("x", [a, b, c]) == (
        "x: off: needs distributed >= 2025.1 (RetireWorker (run, done, manager, address), "
        "Scheduler.retire_workers(close_workers=, remove=)), distributed >= 2024.4.0 "
        "(Scheduler.restart_workers(on_error=, stimulus_id=))"
    )


def test_a_check_that_raises_counts_as_missing() -> None:
    def broken(_: object) -> bool:
        raise ImportError("moved")

    need = features.Need("somewhere.thing", "distributed", "2026.1", broken)
    assert missing(Feature("f", (need,))) == [need]


@pytest.fixture
def no_data_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    """dask's Task without ``_data_producer``, as before dask 2025.1 (no graph may be
    built meanwhile: Task() sets it)."""
    monkeypatch.delattr(dask._task_spec.Task, "_data_producer")


@pytest.mark.usefixtures("no_data_producer")
@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(section()), timeout=60)
async def test_memory_pressure_without_its_internal_is_off_and_says_so(c, s, a, caplog):
    policy = policy_of(s)
    assert policy.unsupported == {"memory-pressure": PRESSURE}
    said = [r.getMessage() for r in caplog.records if r.name == "amm_rules.engine.policy"]
    assert said.count(f"amm-rules: {PRESSURE}") == 1
    assert events(s, "unsupported") == [
        {
            "action": "unsupported",
            "feature": "memory-pressure",
            "needs": ["Task._data_producer"],
            "message": PRESSURE,
        }
    ]
    # Off: neither attached nor run (its periodic check never starts).
    await wait_cycles(s, 3)
    pressure = policy.section(MemoryPressure)
    assert pressure not in policy.ctx.hooks  # (attached, it is one of the engine's plugin's)
    assert policy.ctx.hooks in s.plugins.values()
    assert not any(name.startswith(CALLBACK) for name in s.periodic_callbacks)
    assert len(events(s, "unsupported")) == 1  # once, not per cycle
    # status, its text, the page's header.
    report = await c.scheduler.amm_rules_status()
    assert list(report["unsupported"]) == [PRESSURE]
    assert f"  unsupported  {PRESSURE}" in render_status(status_report(policy)).splitlines()
    assert html.escape(PRESSURE) in header_html(status_report(policy))


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(None, start=False), timeout=60)
async def test_restarts_without_restart_workers_retire_instead_and_say_why(c, s, a, monkeypatch):
    """Taken away after the start (the scheduler's own start does not need it); a
    policy attached now sees it missing."""
    from distributed.active_memory_manager import ActiveMemoryManagerExtension

    from amm_rules.engine.policy import RulesPolicy

    monkeypatch.delattr(Scheduler, "restart_workers")
    policy = RulesPolicy(rules(**{"paused-workers": {"after": "1s", "action": "restart"}}))
    ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    try:
        assert policy.unsupported == {RESTART: RESTARTS}
        paused = policy.section(PausedWorkers)
        assert paused.clock in policy.ctx.hooks and not paused.supports(RESTART)  # the rest is on
        ws = s.workers[a.address]
        monkeypatch.setattr(ws, "nanny", "tcp://127.0.0.1:1")  # restartable, but for this
        handling = paused._start(ws)
        assert (handling.action, handling.note) == ("retire", f"{RESTARTS}: retired instead")
        assert any(e["message"] == RESTARTS for e in events(s, "unsupported"))
    finally:
        policy.detach()


def test_validate_dask_config_says_the_same_words(tmp_path: Path, no_data_producer: None) -> None:
    config = tmp_path / "dask.yaml"
    policies = [{"class": "amm_rules.RulesPolicy", "rules": section()}]
    scheduler = {"active-memory-manager": {"policies": policies}}
    config.write_text(yaml.safe_dump({"distributed": {"scheduler": scheduler}}, sort_keys=False))
    result = CliRunner().invoke(main, ["validate", "--dask-config", str(config)])
    lines = [
        line for line in result.output.splitlines() if "unsupported" in line or "off:" in line
    ]
    text = config.read_text().splitlines()
    at = next(n for n, line in enumerate(text, 1) if line.lstrip().startswith("memory-pressure:"))
    column = len(text[at - 1]) - len(text[at - 1].lstrip()) + 1
    assert lines[0].startswith(f"{config}:{at}:{column}: warning[unsupported]: {PRESSURE}"), (
        result.output
    )
    assert result.exit_code == 0  # a warning (with --strict, 1)
    strict = CliRunner().invoke(main, ["validate", "--strict", "--dask-config", str(config)])
    assert strict.exit_code == 1


def test_a_rules_file_that_does_not_use_the_feature_gets_no_warning(
    tmp_path: Path, no_data_producer: None
) -> None:
    config = tmp_path / "dask.yaml"
    policies = [{"class": "amm_rules.RulesPolicy", "rules": rules()}]
    scheduler = {"active-memory-manager": {"policies": policies}}
    config.write_text(yaml.safe_dump({"distributed": {"scheduler": scheduler}}))
    result = CliRunner().invoke(main, ["validate", "--dask-config", str(config)])
    assert "off:" not in result.output and result.exit_code == 0


def test_the_engine_without_its_hooks_runs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the replica methods it wraps, the engine says so and every section is
    off (a real scheduler object, not started: nothing else is needed to attach)."""
    import asyncio

    from distributed.active_memory_manager import ActiveMemoryManagerExtension

    from amm_rules.engine.policy import RulesPolicy

    async def attach() -> RulesPolicy:
        s = Scheduler(dashboard_address=":0", validate=True)
        owner = next(k for k in Scheduler.__mro__ if "remove_all_replicas" in vars(k))
        monkeypatch.delattr(owner, "remove_all_replicas")
        policy = RulesPolicy(rules())
        ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
        try:
            list(policy.run())
            return policy
        finally:
            policy.detach()
            await s.close()

    policy = asyncio.run(attach())
    assert policy.unsupported == {
        "engine": "engine: off: needs distributed >= 2025.1 (Scheduler.remove_all_replicas)"
    }
    assert policy._on == ()  # every section off


ADAPTIVE_MEMORY = "adaptive: memory: off: needs distributed >= 2025.1 (Scheduler.task_prefixes)"


@pytest.fixture
def no_task_prefixes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adaptive target's need of ``Scheduler.task_prefixes`` unmet, as on a release
    that moved it (the scheduler itself cannot run without its prefixes)."""
    guard, memory = AdaptiveSection.FEATURES
    (prefixes, *rest) = memory.needs
    gone = features.Need(prefixes.what, prefixes.package, prefixes.since, lambda _: False)
    changed = Feature(memory.name, (gone, *rest), memory.in_use)
    monkeypatch.setattr(AdaptiveSection, "FEATURES", (guard, changed))


@pytest.mark.usefixtures("no_task_prefixes")
@gen_cluster(
    client=True,
    nthreads=[("", 1)],
    config=amm_config({**rules(), "adaptive": {}}),
)
async def test_the_adaptive_target_without_its_internal_is_distributeds(c, s, a):
    """Without the task prefixes, memory asks for nothing: the target is distributed's,
    the guard still holds, and the section says why."""
    policy = policy_of(s)
    assert policy.unsupported == {"adaptive: memory": ADAPTIVE_MEMORY}
    held = await c.scatter({"x": b"." * 1000})
    assert s.adaptive_target() == Scheduler.adaptive_target(s)
    adaptive = policy.section(AdaptiveSection)
    assert "target" not in adaptive.status()
    assert ADAPTIVE_MEMORY in render_status(status_report(policy))
    del held


def test_validate_names_the_adaptive_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``validate --dask-config`` says it at the section's key, with the scheduler's
    class as this environment has it (here without ``task_prefixes``)."""
    from distributed.scheduler import SchedulerState

    monkeypatch.delattr(SchedulerState, "task_prefixes")
    config = tmp_path / "dask.yaml"
    policies = [{"class": "amm_rules.RulesPolicy", "rules": {**rules(), "adaptive": {}}}]
    scheduler = {"active-memory-manager": {"policies": policies}}
    config.write_text(yaml.safe_dump({"distributed": {"scheduler": scheduler}}, sort_keys=False))
    result = CliRunner().invoke(main, ["validate", "--dask-config", str(config)])
    text = config.read_text().splitlines()
    at = next(n for n, line in enumerate(text, 1) if line.lstrip().startswith("adaptive:"))
    column = len(text[at - 1]) - len(text[at - 1].lstrip()) + 1
    assert f"{config}:{at}:{column}: warning[unsupported]: {ADAPTIVE_MEMORY}" in result.output
