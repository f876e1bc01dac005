"""``amm-rules simulate --drain WORKER --deadline 60s --rate 100MiB/s``: what a drain
would move off a recorded cluster's workers before their deadline, and what it would
lose.

The engine's own parts decide, as in the scheduler (:mod:`amm_rules.engine.sections.drain`):
the evacuation planner places each key the drained workers hold by its rules
(:func:`~amm_rules.engine.decide.evacuate.plan_evacuation`), the drain's order of value
ranks them (:func:`~amm_rules.engine.evacuation.rank_views`) and its prediction
walks them at the rate given (:func:`~amm_rules.engine.decide.drain.predict`), each
drained worker sending at that rate. The copies that leave in time land, the drained
workers are then lost (``--kill``'s report: keys lost, keys below their target) and the
simulation runs its cycles on what stays.

Recompute estimates are those the simulation's engine has of the recorded cluster; where
it has none, beyond the keys below their replication minimum keys are moved smallest
first (the report says so). Neighbours: :mod:`amm_rules.offline.commands` runs it;
:mod:`amm_rules.offline.report`'s text report opens with :func:`drain_lines`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from amm_rules.engine.decide.drain import TIER_NAMES, predict
from amm_rules.engine.decide.evacuate import plan_evacuation
from amm_rules.engine.decide.view import key_string
from amm_rules.engine.evacuation import evacuation_input, rank_views
from amm_rules.engine.words import bytes_per_second, drain_item_why, duration, prediction_record
from amm_rules.language.fields import UnitError, parse_size

#: Keys listed per worker, in the order they would leave.
KEYS_SHOWN = 10


def parse_rate(value: str) -> float:
    """``"100MiB/s"`` (or ``"100 MiB"``, or a number of bytes) → bytes per second."""
    text = value.strip()
    if text.endswith("/s"):
        text = text[:-2]
    try:
        rate = parse_size(text)
    except UnitError as exc:
        raise ValueError(f"expected a rate like '100MiB/s', got {value!r} ({exc})") from None
    if rate <= 0:
        raise ValueError(f"a rate must be more than 0 bytes per second, got {value!r}")
    return float(rate)


def drain_workers(
    sim: Any, victims: Sequence[str], deadline: float, rate: float
) -> dict[str, Any]:
    """Drain ``victims`` (addresses) of a simulation within ``deadline`` seconds at
    ``rate`` bytes per second each: the copies that leave in time land. Returns what
    the drain predicted and moved, per worker."""
    ctx = sim.ctx
    tasks = sim.cluster.tasks
    leaving = set(victims)
    out: dict[str, Any] = {"deadline": deadline, "rate": rate, "note": "", "workers": {}}
    estimated = False
    for address in victims:
        ws = sim.cluster.workers[address]
        views, cluster = evacuation_input(ctx, list(ws.has_what), leaving)
        ranked, items = rank_views(views, cluster, tasks, ctx.costs.estimate)
        estimated |= any(item.seconds for item in items.values())
        plan = plan_evacuation(ranked, cluster, now=sim.now)
        order = list(dict.fromkeys(c.key for c in plan.copies))
        cannot = {s.key: s.why for s in plan.stuck}
        prediction = predict(
            [items[k] for k in order], rate, deadline, "given", [items[k] for k in cannot]
        )
        in_time = set(order if prediction.cutoff is None else order[: prediction.cutoff])
        moved = 0
        for copy in plan.copies:
            if copy.key in in_time:
                sim.cluster.add_replica(tasks[copy.key], sim.cluster.workers[copy.worker])
                moved += copy.nbytes
        out["workers"][address] = {
            "name": sim.names.get(address, (address, ""))[0],
            "prediction": prediction_record(prediction),
            "moved_keys": len(in_time),
            "moved_bytes": moved,
            "first": [
                {
                    "key": key_string(k),
                    "tier": TIER_NAMES[items[k].tier],
                    "why": drain_item_why(items[k]),
                    "in_time": k in in_time,
                }
                for k in order[:KEYS_SHOWN]
            ],
            "cannot_move": [{"key": key_string(k), "why": why} for k, why in cannot.items()],
        }
    if not estimated:
        out["note"] = (
            "no recompute estimate in this cluster's record: beyond the keys below their "
            "replication minimum, keys move smallest first"
        )
    return out


def drain_lines(drain: dict[str, Any] | None) -> list[str]:
    """The drain's part of ``simulate``'s text report."""
    if not drain:
        return []
    note = f" ({drain['note']})" if drain["note"] else ""
    lines = [
        f"drain within {duration(drain['deadline'])} at {bytes_per_second(drain['rate'])} per worker{note}:"
    ]
    for address, w in drain["workers"].items():
        lines.append(f"  {address} ({w['name']}): {w['prediction']['text']}")
        for entry in w["first"]:
            mark = "in time" if entry["in_time"] else "too late"
            lines.append(f"    {mark}: {entry['key']} ({entry['why']})")
        for entry in w["cannot_move"][:KEYS_SHOWN]:
            lines.append(f"    cannot move: {entry['key']} ({entry['why']})")
    return lines


__all__ = ["drain_lines", "drain_workers", "parse_rate"]
