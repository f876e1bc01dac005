"""The recompute-costs section: what each key would cost to compute again, and the work
at risk on each worker, refreshed once per cycle and shown everywhere.

The :class:`~amm_rules.engine.state.costs.RecomputeCosts` itself is engine state (on the
:class:`~amm_rules.engine.context.EngineContext`): the key index's replica wrappers feed
it (and its transition hook, while it keeps keys per group). This section connects it
to the index at attach (counting the sole copies of the keys already in memory from
the index's first batch, not from a scan of its own), refreshes the estimates at the
start of each cycle if keys entered or left memory since the last (before
classification, so that rules reading ``task.recompute_seconds`` see this cycle's
figures; keys of groups whose estimate moved are classified again while rules read
it), and reports them in the status, ``explain`` and Prometheus (docs/observe.md).

Neighbours: :mod:`amm_rules.engine.state.costs` estimates;
:mod:`amm_rules.engine.sections.protect` spends a budget on the dearest keys.
"""

from __future__ import annotations

from typing import Any

from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.engine.state.costs import RecomputeCosts
from amm_rules.engine.words import counted, duration
from amm_rules.language.ruleset import Ruleset

#: Workers with series (and status rows) of their own; the total counts them all.
TOP_WORKERS = 20
#: Groups listed in the status, dearest per key first.
TOP_GROUPS = 5
#: The label of the cluster's total in ``dask_amm_rules_work_at_risk_seconds``.
TOTAL = "(total)"


def recompute_sentence(estimate: float | None, own: float | None, ancestors: float) -> str:
    """``recompute ≈ 41 min: own 2 s, 7 ancestors released``."""
    if estimate is None:
        return "recompute: unknown (no task of its group measured)"
    n = round(ancestors)
    released = f"{counted(n, 'ancestor')} released" if n else "no ancestor released"
    return f"recompute ≈ {duration(estimate)}: own {duration(own)}, {released}"


class RecomputeCostsSection(Section):
    """Recompute estimates and work at risk (see the module docstring)."""

    name = "recompute-costs"
    status_key = "recompute"
    explain_key = "recompute"
    METRICS = {
        "work_at_risk_seconds": (
            "work_at_risk_seconds",
            "gauge",
            "Seconds of recompute the loss of a worker would cost now: the keys of which "
            f"it holds the only copy (the {TOP_WORKERS} workers with the most, and "
            f"worker={TOTAL!r} for the cluster)",
            "worker",
        ),
    }

    def attach(self) -> None:
        ctx = self.ctx
        costs: RecomputeCosts = ctx.costs
        index = ctx.index
        # The keys found in memory at attach are the index's first batch (the policy's
        # one scan of scheduler.tasks): counted from there.
        costs.track_keys = _tracks(ctx.ruleset)
        costs.seed(list(index.dirty.values()), track=costs.track_keys)
        index.follow_costs(costs, costs.track_keys)

    def detach(self) -> None:
        self.ctx.index.follow_costs(None)

    def reloaded(self, in_memory: list[Any]) -> None:
        """Keep (or stop keeping) the keys in memory per group, as the rules in force
        need them or not; ``in_memory``: the tasks in memory now."""
        ctx = self.ctx
        costs = ctx.costs
        if _tracks(ctx.ruleset):
            if not costs.track_keys:
                costs.start_tracking(in_memory)
        elif costs.track_keys:
            costs.stop_tracking()
        ctx.index.follow_costs(costs, costs.track_keys)

    def run(self, cycle: Cycle) -> tuple[()]:
        """Refresh the estimates if keys entered or left memory; while rules read
        ``task.recompute_seconds``, classify again the keys of the groups republished."""
        ctx = self.ctx
        costs = ctx.costs
        if ctx.index.take_memory_changed():
            costs.changed = True
        republished = costs.refresh(ctx.scheduler.task_groups)
        if republished and ctx.ruleset.reads_costs and costs.track_keys:
            for group in republished:
                ctx.index.reclassify(list(costs.keys_of(group)))
        return ()

    def status(self) -> dict[str, Any]:
        """Work at risk in all and for the workers with the most; the dearest groups
        with keys in memory."""
        costs = self.ctx.costs
        workers = [
            {"worker": address, "seconds": round(seconds, 3), "keys": costs.sole_keys(address)}
            for address, seconds in costs.top_at_risk(TOP_WORKERS)
        ]
        groups = []
        for entry in sorted(
            (e for e in costs.groups.values() if e.published is not None),
            key=lambda e: -(e.published or 0.0),
        ):
            in_memory = entry.group.states.get("memory", 0)
            if not in_memory:
                continue
            groups.append(
                {
                    "group": entry.group.name,
                    "seconds": round(entry.published or 0.0, 3),
                    "own": None if entry.own is None else round(entry.own, 3),
                    "source": entry.source,
                    "ancestors": round(entry.ancestors, 1),
                    "in_memory": in_memory,
                }
            )
            if len(groups) >= TOP_GROUPS:
                break
        return {
            "total_seconds": round(costs.total_at_risk(), 3),
            "workers_at_risk": sum(1 for v in costs.at_risk.values() if v > 1e-9),
            "workers": workers,
            "groups": groups,
            "groups_known": len(costs.groups),
            "refreshes": costs.refreshes,
        }

    def explain(self, ts: Any, now: float) -> dict[str, Any] | None:
        """The key's recompute estimate, what it is made of, and who holds it alone."""
        costs = self.ctx.costs
        group = getattr(ts, "group", None)
        entry = costs.groups.get(group) if group is not None else None
        estimate = costs.estimate(group) if group is not None else None
        own = entry.own if entry is not None else None
        ancestors = entry.ancestors if entry is not None else 0.0
        who_has = ts.who_has or ()
        return {
            "seconds": None if estimate is None else round(estimate, 3),
            "own": None if own is None else round(own, 3),
            "source": entry.source if entry is not None else "unknown",
            "ancestors": round(ancestors, 1),
            "sole_holder": next(iter(who_has)).address if len(who_has) == 1 else None,
            "text": recompute_sentence(estimate, own, ancestors),
        }

    def metrics(self) -> dict[str, Any]:
        """``work_at_risk_seconds`` per worker (the top ones) and in all."""
        costs = self.ctx.costs
        per_worker: dict[str, float] = dict(costs.top_at_risk(TOP_WORKERS))
        per_worker[TOTAL] = costs.total_at_risk()
        return {"work_at_risk_seconds": per_worker}


def _tracks(ruleset: Ruleset) -> bool:
    """Whether the keys in memory per group must be kept (protect, or rules reading
    ``task.recompute_seconds``)."""
    return ruleset.protect is not None or ruleset.reads_costs


__all__ = ["RecomputeCostsSection", "recompute_sentence"]
