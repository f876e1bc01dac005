"""``amm-rules diff OLD NEW --dump FILE``: what changing the rules would do to a cluster.

The question a reviewer asks before the scheduler hot-reloads NEW in place of OLD. The
answer comes in three steps, each with the engine's own parts:

1. OLD settles on the cluster first (:class:`~amm_rules.offline.simulate.Simulation`):
   a dump is rarely taken at rest, and what OLD would still do is not the change's
   doing. How much that was is reported on its own.
2. Every key in memory is resolved with both rule sets (the same classifier as the
   scheduler's): keys whose target (``replicate``), placement (``pool``, ``avoid``,
   ``spread``) or ``move`` changes, field by field, with the rule that decides each
   side.
3. NEW runs from OLD's resting state until it settles: the copies added and dropped,
   the bytes transferred, per rule and in total, the memory of each worker and pool
   before and after, and the keys left unmet (the report of
   :func:`~amm_rules.offline.report.simulation_report`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import Any

from amm_rules.engine.decide.plan import source_label
from amm_rules.engine.decide.view import key_string
from amm_rules.language.ruleset import ACTION_FIELDS, Desired, Ruleset
from amm_rules.offline.dump import ClusterState
from amm_rules.offline.report import empty_rule_stats, simulation_report
from amm_rules.offline.sim_cluster import SimCluster
from amm_rules.offline.simulate import Simulation, runtime_targets

Key = Hashable
#: Examples of changed keys per field in the text report.
EXAMPLES = 3


def describe(desired: Desired, name: str) -> str:
    """``"3 (rule keep)"``, ``"gpu (rule device)"``, ``"- (not set)"``."""
    value = getattr(desired, name)
    if value is None:
        return "- (not set)"
    if isinstance(value, tuple):
        value = ",".join(value)
    return f"{value} ({desired.reasons[name]})"


def changed_fields(old: Desired, new: Desired) -> dict[str, dict[str, str]]:
    """The fields whose value or deciding rule differ: name -> {old, new}."""
    out = {}
    for name in ACTION_FIELDS:
        before, after = getattr(old, name), getattr(new, name)
        if before == after and old.reasons.get(name) == new.reasons.get(name):
            continue
        out[name] = {"old": describe(old, name), "new": describe(new, name)}
    return out


def diff_rules(
    old: Ruleset,
    new: Ruleset,
    state: ClusterState,
    *,
    measure: str,
    interval: float,
    cycles: int | None = None,
    old_file: str = "",
    new_file: str = "",
) -> dict[str, Any]:
    """The report of ``amm-rules diff`` as plain data (see the module docstring)."""
    cluster = SimCluster(state)
    runtime = runtime_targets(state)
    before = Simulation(old, cluster, measure=measure, interval=interval, runtime=runtime)
    settling = before.run()
    after = Simulation(new, cluster, measure=measure, interval=interval, runtime=runtime)
    changes = []
    changed_by: Counter[str] = Counter()
    for ts in cluster.in_memory():
        was = before.ctx.classifier.resolve(ts, runtime.get(ts.key))
        now = after.ctx.classifier.resolve(ts, runtime.get(ts.key))
        fields = changed_fields(was, now)
        if not fields:
            continue
        changes.append({"key": key_string(ts.key), "fields": fields})
        changed_by.update({_label(was, now, f) for f in fields})
    result = after.run(cycles)
    report = simulation_report(after, result, rules_file=new_file)
    for label, n in changed_by.items():
        removed = {**empty_rule_stats(), "state": "removed"}
        report["rules"].setdefault(label, removed)["keys_changed"] = n
    for entry in report["rules"].values():
        entry.setdefault("keys_changed", 0)
    report.update(
        old_rules_file=old_file,
        new_rules_file=new_file,
        old_settling={
            "cycles": before.last_active,
            "settled": settling.settled,
            "actions": len(settling.actions),
        },
        changed=changes,
    )
    report["totals"]["keys_changed"] = len(changes)
    return report


def _label(old: Desired, new: Desired, name: str) -> str:
    """The rule a change of field ``name`` is due to: the new side's, else the old's."""
    return source_label(new if name in new.reasons else old, name)


def render_diff(report: dict[str, Any]) -> str:
    """The diff for a terminal."""
    from amm_rules.engine.words import counted, size
    from amm_rules.offline.report import list_lines, pool_lines, table, unused_lines, worker_lines

    t = report["totals"]
    settling = report["old_settling"]
    lines = [f"{report['old_rules_file']} -> {report['new_rules_file']} on {report['cluster']}"]
    if settling["actions"]:
        lines.append(
            f"the old rules are not at rest on this cluster: {counted(settling['actions'], 'action')}"
            f" in {counted(settling['cycles'], 'cycle')} settle them first (not counted below)"
        )
    lines.append(
        f"{t['keys_changed']:,} of {counted(t['keys_in_memory'], 'key')} in memory change what "
        "they want"
    )
    by_field: dict[str, list[dict[str, Any]]] = {}
    for change in report["changed"]:
        for name in change["fields"]:
            by_field.setdefault(name, []).append(change)
    for name, items in by_field.items():
        lines.append(f"  {name}: {counted(len(items), 'key')}, e.g.")
        for item in items[:EXAMPLES]:
            f = item["fields"][name]
            lines.append(f"    {item['key']}: {f['old']} -> {f['new']}")
    rows = [
        [label, e["keys_changed"], e["add"], e["drop"], size(e["bytes_transferred"]), e["state"]]
        for label, e in report["rules"].items()
    ]
    lines += ["", *table(["rule", "keys changed", "add", "drop", "transfer", "state"], rows)]
    lines += unused_lines(report["rules"])
    lines += [
        "",
        f"in total: {counted(t['copies_added'], 'copy')} added ({size(t['bytes_transferred'])}), "
        f"{t['copies_dropped']} dropped; "
        + (
            f"settled after {counted(report['cycles'], 'cycle')}"
            if report["settled"]
            else f"not settled after {counted(report['cycles_run'], 'cycle')}"
        ),
    ]
    if report["pools"]:
        lines += ["", *pool_lines(report["pools"])]
    lines += ["", *worker_lines(report["workers"]), *list_lines(report)]
    return "\n".join(lines).rstrip("\n") + "\n"
