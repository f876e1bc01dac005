"""The engine's scheduler plugin: the scheduler calls every plugin's ``transition`` on
every transition, so the engine adds one plugin, whose members are the parts that hear
the scheduler, and whose ``transition`` is the key index's own; a section's part is a
member only while the rules have the section (``memory-pressure``, ``paused-workers``),
and follows a reload both ways."""

from __future__ import annotations

from typing import Any

from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from amm_rules.engine.sections.memory_pressure import MemoryPressure
from amm_rules.engine.sections.paused_workers import PausedWorkers
from benchmarks.support.waiting import cycle_until
from tests.support.cluster import amm_config
from tests.support.rules_files import write_atomically

BOTH = """\
version: 1
memory-pressure: {}
paused-workers:
  after: 30s
"""


def plugged(s: Any, policy: RulesPolicy) -> set[str]:
    """Which of the two sections' plugins the scheduler calls."""
    mine = {
        "memory-pressure": policy.section(MemoryPressure),
        "paused-workers": policy.section(PausedWorkers).clock,
    }
    return {name for name, p in mine.items() if p in policy.ctx.hooks}


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(None, start=False), timeout=60)
async def test_section_plugins_only_while_the_rules_have_the_section(c, s, a, tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text("version: 1\n")
    policy = RulesPolicy(str(path))
    ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    amm = policy.manager
    assert plugged(s, policy) == set()
    engine = [p for name, p in s.plugins.items() if name.startswith("amm-rules")]
    assert engine == [policy.ctx.hooks]
    # The key index (transitions), the handlers' metadata, the retirements' departures
    # and adaptive scaling's scale-down guard: what every rules file needs.
    assert [n for _, n in policy.ctx.hooks.members] == [
        "amm-rules",
        "amm-rules-handlers",
        "amm-rules-retirements",
        "amm-rules-scale-down",
    ]
    # A transition costs the key index's hook and nothing more.
    assert policy.ctx.hooks.transition == policy.index.transition

    write_atomically(path, BOTH)
    await cycle_until(
        amm, lambda: plugged(s, policy) == {"memory-pressure", "paused-workers"}, "plugged in"
    )
    write_atomically(path, "version: 1\n")
    await cycle_until(amm, lambda: plugged(s, policy) == set(), "both plugins out again")
    assert policy.section(MemoryPressure).settings is None


@gen_cluster(
    client=True,
    nthreads=[("", 1)],
    config=amm_config({"version": 1, "memory-pressure": {}}),
    timeout=60,
)
async def test_a_section_in_the_rules_at_start_is_plugged_in(c, s, a):
    (policy,) = s.extensions["amm"].policies
    assert plugged(s, policy) == {"memory-pressure"}
