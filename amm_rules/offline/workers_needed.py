"""How many workers these rules need for this dump: the answer of ``amm-rules simulate``
to what adaptive scaling would ask of the recorded cluster, once the rules settled.

Two figures, from the pure half of the ``adaptive`` section
(:mod:`amm_rules.engine.decide.adaptive`):

- **memory**: :func:`~amm_rules.engine.decide.adaptive.memory_target` on the recorded
  workers (their limits, their managed bytes in memory and on disk, plus the copies the
  simulation made) and the tasks still to run per prefix; a dump records no memory
  flow, so a task still to run is expected to produce what a key of its prefix in
  memory holds on average (nothing when none is). The headroom is the rules file's
  ``adaptive:`` section's, else that section's default;
- **rules**: the workers that must stay when scale-down lets go every other one it
  may, in the order it would (:func:`~amm_rules.engine.decide.adaptive.hold` with the
  rules' minimums, pools and spread, over the workers cheapest to move first), with
  why the others stay.

The answer is the larger of the two (at least one worker).

Neighbours: :mod:`amm_rules.offline.commands` runs the simulation; this module reads it
and :mod:`amm_rules.offline.report` prints it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from amm_rules.engine.adapters import worker_status
from amm_rules.engine.decide.adaptive import (
    TO_RUN,
    MemoryDemand,
    cheapest_first,
    hold,
    memory_target,
)
from amm_rules.engine.sections.adaptive import held_classes, leaving_costs, slots
from amm_rules.engine.words import counted, kept_why, target_details, target_sentence
from amm_rules.language.fields import format_fraction
from amm_rules.language.ruleset import AdaptiveSettings

if TYPE_CHECKING:
    from amm_rules.offline.simulate import Simulation

#: Reasons named per answer (the workers kept may share them).
REASONS_SHOWN = 5
#: Bytes per second assumed to send a worker's data (distributed's default bandwidth).
BANDWIDTH = 100e6


def memory_demand(cluster: Any) -> MemoryDemand:
    """The memory view of a recorded cluster (see the module docstring)."""
    workers = [ws for ws in cluster.workers.values() if worker_status(ws) != "closing"]
    to_run: Counter[str] = Counter()
    held_bytes: Counter[str] = Counter()
    held_keys: Counter[str] = Counter()
    for ts in cluster.tasks.values():
        name = ts.prefix.name
        if ts.state in TO_RUN:
            to_run[name] += 1
        elif ts.state == "memory" and ts.nbytes >= 0:
            held_bytes[name] += ts.nbytes
            held_keys[name] += 1
    per_task = {p: held_bytes[p] / held_keys[p] for p in to_run if held_keys[p]}
    return MemoryDemand(
        limits=tuple(int(ws.memory_limit or 0) for ws in workers),
        in_memory=sum(ws.memory.managed for ws in workers),
        on_disk=sum(ws.memory.spilled for ws in workers),
        to_run=dict(to_run),
        per_task=per_task,
    )


def workers_needed(sim: Simulation) -> dict[str, Any]:
    """The answer, as plain data (see the module docstring)."""
    settings = sim.ruleset.adaptive or AdaptiveSettings()
    headroom = format_fraction(settings.headroom)
    if sim.ruleset.adaptive is None:
        headroom += ", the adaptive section's default"
    ctx = sim.ctx
    cluster = sim.cluster
    target = memory_target(memory_demand(cluster), settings.headroom, settings.disk_rate)
    workers = slots(ctx)
    running = [ws for ws in cluster.workers.values() if worker_status(ws) == "running"]
    order = cheapest_first(leaving_costs(ctx, running), BANDWIDTH, BANDWIDTH)
    decided = hold(workers, held_classes(ctx, workers), order, minimums=settings.hold_rules)
    by_rules = max(1, len(running) - len(decided.allowed))
    # Each reason once, in the order the workers kept give them.
    reasons = list(dict.fromkeys(kept_why(why) for kept in decided.kept.values() for why in kept))
    return {
        "workers": max(1, target.workers, by_rules),
        "running": len(running),
        "headroom": settings.headroom,
        "section": sim.ruleset.adaptive is not None,
        "memory": {
            "workers": target.workers,
            "needed": target.needed,
            "expected": target.expected,
            "per_worker": target.per_worker,
            "text": target_sentence(target),
            "details": target_details(target, headroom) if target.per_worker else None,
        },
        "rules": {
            "workers": by_rules,
            "may_leave": len(decided.allowed),
            "kept": sorted(decided.kept),
            "why": reasons,
        },
    }


def workers_needed_lines(answer: Mapping[str, Any] | None) -> list[str]:
    """``workers needed: 3 (4 running)`` and its two reasons, for the text report."""
    if not answer:
        return []
    memory, rules = answer["memory"], answer["rules"]
    lines = [
        f"workers needed: {answer['workers']} ({answer['running']} running)",
        f"  memory: {memory['workers']}: {memory['details']}"
        if memory["details"]
        else f"  memory: {memory['text']}",
    ]
    if rules["why"]:
        why = "; ".join(rules["why"][:REASONS_SHOWN])
        more = len(rules["why"]) - REASONS_SHOWN
        if more > 0:
            why += f"; and {counted(more, 'reason')} more"
        lines.append(f"  rules: {rules['workers']}: the others could leave; kept: {why}")
    else:
        lines.append(f"  rules: {rules['workers']}: every other worker could leave")
    return lines


__all__ = ["memory_demand", "workers_needed", "workers_needed_lines"]
