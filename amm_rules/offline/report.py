"""What a simulation found, as data (``--format json``) and as text.

:func:`simulation_report` turns a :class:`~amm_rules.offline.simulate.Result` (and, with
``--kill``, what the kill did) into plain data, the report of ``--format json`` (its
entries are listed in docs/simulate.md); :func:`render_text` lays the same data out for
a terminal, with long lists cut short.

Neighbours: :mod:`amm_rules.offline.simulate` produces the result; the ``simulate`` and
``diff`` commands of :mod:`amm_rules.cli` print what this module renders.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from amm_rules.engine.decide.plan import DEFAULT_SOURCE, source_label
from amm_rules.engine.decide.shadows import IDLE, SHADOWED, shadow_words
from amm_rules.engine.decide.view import key_string
from amm_rules.engine.dryrun import REBALANCE_LABEL
from amm_rules.engine.sections.activity import census_of, rule_matches
from amm_rules.engine.words import columns, counted, duration, plural, size
from amm_rules.language.expr.parser import parse
from amm_rules.language.near_miss import near_misses
from amm_rules.language.ruleset import Desired, Ruleset
from amm_rules.offline.drain import drain_lines
from amm_rules.offline.simulate import Result, SimAction, Simulation
from amm_rules.offline.workers_needed import workers_needed_lines

#: Entries of a long list the text report shows (the JSON report has them all).
TEXT_LIMIT = 10
#: Distinct reasons shown per rule in the text report.
REASONS_SHOWN = 3


@dataclass
class KillReport:
    """What ``--kill``, ``--kill-host`` and ``--kill-pool`` took away, before the first cycle."""

    #: Addresses of the workers killed.
    workers: list[str] = field(default_factory=list)
    #: Keys left with no copy: (key, bytes, label of its target or None).
    lost: list[tuple[Hashable, int, str | None]] = field(default_factory=list)
    #: Governed keys below their target's minimum after the kill: (key, label, min, copies).
    below: list[tuple[Hashable, str, int, int]] = field(default_factory=list)
    #: Per worker killed, the seconds of recompute its keys held alone stand for (its
    #: work at risk before the kill; absent where the dump recorded no compute time).
    recompute: dict[str, float] = field(default_factory=dict)


def action_dict(a: SimAction) -> dict[str, Any]:
    return {
        "op": a.op,
        "key": key_string(a.key),
        "worker": a.worker,
        "rule": a.rule,
        "bytes": a.nbytes,
        "cycle": a.cycle,
        "reason": a.reason,
    }


def simulation_report(
    sim: Simulation, result: Result, kill: KillReport | None = None, *, rules_file: str = ""
) -> dict[str, Any]:
    """The whole report of one run, as plain (JSON-able) data."""
    kill = kill or KillReport()
    keys, nbytes = sim.initial_keys
    add = [a for a in result.actions if a.op == "replicate"]
    drop = [a for a in result.actions if a.op == "drop"]
    short = {k for k, *_ in kill.below}
    restoring = [a for a in add if a.key in short]
    return {
        "rules_file": rules_file,
        "cluster": sim.cluster.source,
        "cycles": sim.last_active,
        "cycles_run": result.cycles,
        "settled": result.settled,
        "totals": {
            "workers": len(result.before),
            "keys_in_memory": keys,
            "bytes_in_memory": nbytes,
            "governed": sim.initial_governed,
            "copies_added": len(add),
            "copies_dropped": len(drop),
            "bytes_transferred": sum(a.nbytes for a in add),
        },
        "rules": rules_section(sim.ruleset, sim, result),
        "workers": workers_section(sim, result, kill),
        "pools": pools_section(sim.ruleset, result),
        "actions": [action_dict(a) for a in result.actions],
        "dry_run": [action_dict(a) for a in result.dry_run],
        "unmet": [
            {"key": key_string(s.key), "rule": s.rule, "reason": s.unmet}
            for s in result.keys.values()
            if s.unmet and sim.ctx.dry_run.label(s.desired) is None
        ],
        "misplaced": [
            {"key": key_string(s.key), "worker": w, "reason": why}
            for s in result.keys.values()
            if sim.ctx.dry_run.label(s.desired) is None
            for w, why in sorted(s.misplaced.items())
        ],
        "killed": kill.workers,
        "recompute_lost": {a: round(v, 3) for a, v in kill.recompute.items()},
        "lost": [{"key": key_string(k), "bytes": n, "rule": label} for k, n, label in kill.lost],
        "below_target": [
            {"key": key_string(k), "rule": label, "target": lo, "copies": n}
            for k, label, lo, n in kill.below
        ],
        "restoring": {"copies": len(restoring), "bytes": sum(a.nbytes for a in restoring)},
        "warnings": list(result.warnings),
        "not_simulated": list(result.not_simulated),
    }


def _paren(label: str) -> str:
    """``(precious)``; ``(annotation)`` as it is."""
    return label if label.startswith("(") else f"({label})"


def governing_label(desired: Desired) -> str:
    """The label a key is reported under: its target's, else the first field's."""
    return _first_label(desired, ("replicate", "pool", "avoid", "spread", "move"))


def _first_label(desired: Desired, names: Sequence[str]) -> str:
    """The label of the first of the fields ``names`` that something decided."""
    decided = next((name for name in names if name in desired.reasons), None)
    return DEFAULT_SOURCE if decided is None else source_label(desired, decided)


#: The counts of a rule's row in a simulation's report, in the order they are shown.
RULE_COUNTS = (
    "keys",
    "bytes",
    "add",
    "drop",
    "bytes_transferred",
    "would_add",
    "would_drop",
    "unmet",
    "misplaced",
    "pending",
)


def empty_rule_stats() -> dict[str, Any]:
    """A rule's row before anything is counted (also ``diff``'s row of a removed rule)."""
    return {**dict.fromkeys(RULE_COUNTS, 0), "reasons": Counter()}


def rules_section(ruleset: Ruleset, sim: Simulation, result: Result) -> dict[str, Any]:
    """Per label: keys and bytes governed, copies added/dropped, bytes moved, state."""
    order = [r.name for r in ruleset.rules]
    stats: defaultdict[str, dict[str, Any]] = defaultdict(
        empty_rule_stats, {name: empty_rule_stats() for name in order}
    )
    tasks = sim.cluster.tasks
    for state in result.keys.values():
        nbytes = tasks[state.key].nbytes
        # Every counter label its wishes come from (one per deciding rule or source).
        for label in {source_label(state.desired, name) for name in state.desired.reasons}:
            stats[label]["keys"] += 1
            stats[label]["bytes"] += nbytes
        if sim.ctx.dry_run.label(state.desired) is not None:
            continue
        if state.unmet:
            e = stats[state.rule]
            e["unmet"] += 1
            e["reasons"][state.unmet] += 1
        for why in state.misplaced.values():
            e = stats[_first_label(state.desired, ("pool", "avoid", "replicate"))]
            e["misplaced"] += 1
            e["reasons"][f"a copy stays where it should not be: {why}"] += 1
        if state.pending:
            stats[state.rule]["pending"] += state.pending
    for a in result.actions:
        e = stats[a.rule]
        if a.op == "replicate":
            e["add"] += 1
            e["bytes_transferred"] += a.nbytes
        else:
            e["drop"] += 1
    for a in result.dry_run:
        stats[a.rule]["would_add" if a.op == "replicate" else "would_drop"] += 1
    dry = sim.ctx.dry_run
    for label, e in stats.items():
        in_dry_run = label in dry.rules or (dry.file and label.startswith("("))
        if label == REBALANCE_LABEL:
            in_dry_run = dry.rebalance
        if label == DEFAULT_SOURCE:
            in_dry_run = False
        if in_dry_run:
            e["state"] = "dry-run"
        elif e["unmet"] or e["misplaced"]:
            e["state"] = "unsatisfiable"
        elif e["pending"]:
            e["state"] = "in-progress"
        else:
            e["state"] = "satisfied"
        e["reasons"] = dict(e["reasons"].most_common())
    _unused(ruleset, sim, stats)
    # The rules in their file's order (each has a row), then the other labels.
    return {k: stats[k] for k in [*order, *sorted(set(stats) - set(order))]}


def _unused(ruleset: Ruleset, sim: Simulation, stats: dict[str, dict[str, Any]]) -> None:
    """The rules that govern no key while keys are in memory, as live status tells
    them: ``shadowed`` when they match keys whose fields something earlier decides,
    ``idle`` when they match none (with near-miss hints); each with its ``sentence``."""
    unused = [r for r in ruleset.rules if not stats[r.name]["keys"]]
    tasks = list(sim.cluster.in_memory())
    if not unused or not tasks:
        return  # no key in memory: nothing to match, as in live status
    usage = rule_matches(sim.ctx, unused, tasks)
    census = None
    for rule in unused:
        e = stats[rule.name]
        shadow = usage[rule.name]
        if shadow.shadowed:
            e["state"], e["sentence"] = SHADOWED, shadow_words(shadow)
            e["shadowed"] = shadow.to_dict()
            continue
        if census is None:
            census = census_of(tasks, sampled=False)
        hints = near_misses(parse(rule.match_source), census)
        head = f"matches none of the {counted(len(tasks), 'key')} in memory"
        e["state"], e["sentence"] = IDLE, "; ".join([head, *hints])


def workers_section(
    sim: Simulation, result: Result, kill: KillReport
) -> dict[str, dict[str, Any]]:
    killed = set(kill.workers)
    out = {}
    for address in sorted(result.before):
        name, host = sim.names[address]
        out[address] = {
            "name": name,
            "host": host,
            "pools": sorted(result.pools.get(address, ())),
            "before": result.before[address],
            "after": result.after.get(address, 0),
            "killed": address in killed,
        }
    return out


def pools_section(ruleset: Ruleset, result: Result) -> dict[str, dict[str, Any]]:
    out = {}
    for name in ruleset.pools:
        members = [a for a, pools in result.pools.items() if name in pools]
        out[name] = {
            "workers": len(members),
            "before": sum(result.before.get(a, 0) for a in members),
            "after": sum(result.after.get(a, 0) for a in members),
        }
    return out


# -- text ----------------------------------------------------------------------------------


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Columns padded to their widest cell; numbers right-aligned."""
    rows = [[str(c) for c in r] for r in rows]
    numeric = {i for i in range(len(header)) if rows and all(_numeric(r[i]) for r in rows)}
    return columns([header, *rows], numeric)


def _numeric(cell: str) -> bool:
    head = cell.split(" ")[0].replace(",", "").replace(".", "").lstrip("+-")
    return head.isdigit()


def _listed(items: Sequence[Any], line: Callable[[Any], str]) -> list[str]:
    """The first :data:`TEXT_LIMIT` items, a line each, and how many more there are."""
    rest = len(items) - TEXT_LIMIT
    more = [f"  ... and {rest} more (--format json lists them all)"] if rest > 0 else []
    return [f"  {line(x)}" for x in items[:TEXT_LIMIT]] + more


def render_text(report: Mapping[str, Any]) -> str:
    """The report for a terminal (a drain's part first)."""
    t = report["totals"]
    lines = [
        *drain_lines(report.get("drain")),
        f"cluster: {report['cluster']}: {counted(t['workers'], 'worker')}, "
        f"{counted(t['keys_in_memory'], 'key')} in memory ({size(t['bytes_in_memory'])}), "
        f"{t['governed']:,} governed by the rules",
    ]
    lines += kill_lines(report)
    if report["settled"]:
        lines.append(f"settled after {counted(report['cycles'], 'cycle')}")
    else:
        lines.append(
            f"not settled after {counted(report['cycles_run'], 'cycle')} (stopped by --cycles "
            "or the cycle limit)"
        )
    lines.append(
        f"copies added: {t['copies_added']} ({size(t['bytes_transferred'])}), "
        f"copies dropped: {t['copies_dropped']}"
    )
    lines += workers_needed_lines(report.get("workers_needed"))
    lines += ["", *rule_lines(report["rules"])]
    if report["pools"]:
        lines += ["", *pool_lines(report["pools"])]
    lines += ["", *worker_lines(report["workers"])]
    lines += list_lines(report)
    return "\n".join(lines) + "\n"


def kill_lines(report: Mapping[str, Any]) -> list[str]:
    if not report["killed"]:
        return []
    lost = report["lost"]
    lines = [f"killed: {counted(len(report['killed']), 'worker')}: {', '.join(report['killed'])}"]
    for address, seconds in (report.get("recompute_lost") or {}).items():
        if seconds > 0:
            lines.append(f"losing {address} costs ≈ {duration(seconds)} of recompute")
    if lost:
        lines.append(
            f"DATA LOSS: {counted(len(lost), 'key')} "
            f"{plural(len(lost), 'loses its', 'lose their')} last copy "
            f"({size(sum(x['bytes'] for x in lost))}):"
        )
        lines += _listed(lost, lambda x: x["key"] + (f" (rule {x['rule']})" if x["rule"] else ""))
    else:
        lines.append("no key loses its last copy")
    below = report["below_target"]
    if below:
        r = report["restoring"]
        lines.append(
            f"below target after the kill: {counted(len(below), 'key')}; restored by "
            f"{counted(r['copies'], 'copy')} ({size(r['bytes'])}):"
        )
        lines += _listed(
            below,
            lambda x: (
                f"{x['key']}: {x['copies']} of {counted(x['target'], 'copy')} {_paren(x['rule'])}"
            ),
        )
    return lines


def rule_lines(rules: Mapping[str, Mapping[str, Any]]) -> list[str]:
    rows = []
    notes = []
    for label, e in rules.items():
        add, drop = e["add"], e["drop"]
        if e["state"] == "dry-run":
            add, drop = f"({e['would_add']})", f"({e['would_drop']})"
        rows.append(
            [
                label,
                e["keys"],
                size(e["bytes"]),
                add,
                drop,
                size(e["bytes_transferred"]),
                e["state"],
            ]
        )
        for reason, n in list(e["reasons"].items())[:REASONS_SHOWN]:
            notes.append(f"  {label}: {counted(n, 'key')}: {reason}")
    out = table(["rule", "keys", "bytes", "add", "drop", "transfer", "state"], rows)
    if any(e["state"] == "dry-run" for e in rules.values()):
        out.append("(in dry-run: what enforcing would add and drop, in parentheses)")
    if notes:
        out += ["", "why not satisfied:", *notes]
    return out + unused_lines(rules)


def unused_lines(rules: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The rules that govern no key (``shadowed``, ``idle``), each with its sentence."""
    said = [
        f"  {label}: {e['state']}: {e['sentence']}"
        for label, e in rules.items()
        if e.get("sentence")
    ]
    return ["", "rules that govern no key:", *said] if said else []


def pool_lines(pools: Mapping[str, Mapping[str, Any]]) -> list[str]:
    rows = [
        [name, p["workers"], size(p["before"]), size(p["after"]), _change(p["before"], p["after"])]
        for name, p in pools.items()
    ]
    return table(["pool", "workers", "before", "after", "change"], rows)


def worker_lines(workers: Mapping[str, Mapping[str, Any]]) -> list[str]:
    rows = []
    for address, w in workers.items():
        after = "killed" if w["killed"] else size(w["after"])
        change = "" if w["killed"] else _change(w["before"], w["after"])
        rows.append(
            [
                address,
                w["name"],
                w["host"],
                ",".join(w["pools"]) or "-",
                size(w["before"]),
                after,
                change,
            ]
        )
    return table(["worker", "name", "host", "pools", "before", "after", "change"], rows)


def _change(before: int, after: int) -> str:
    delta = after - before
    if not delta:
        return "0"
    return ("+" if delta > 0 else "-") + size(abs(delta))


def list_lines(report: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    unmet = report["unmet"]
    if unmet:
        out += ["", f"keys left below target ({len(unmet)}):"]
        out += _listed(unmet, lambda x: f"{x['key']} {_paren(x['rule'])}: {x['reason']}")
    misplaced = report["misplaced"]
    if misplaced:
        out += ["", f"copies left where they should not be ({len(misplaced)}):"]
        out += _listed(misplaced, lambda x: f"{x['key']} on {x['worker']}: {x['reason']}")
    dry = report["dry_run"]
    if dry:
        out += ["", f"held back by dry-run ({len(dry)}):"]
        out += _listed(dry, lambda x: f"{x['op']} {x['key']} on {x['worker']} {_paren(x['rule'])}")
    actions = report["actions"]
    if actions:
        out += ["", f"actions ({len(actions)}):"]
        out += _listed(
            actions,
            lambda x: (
                f"cycle {x['cycle']}: {x['op']} {x['key']} on {x['worker']} {_paren(x['rule'])}"
            ),
        )
    out += [f"warning: {w}" for w in report["warnings"]]
    out += [f"note: {why}" for why in report.get("not_simulated", ())]
    return out


__all__ = ["KillReport", "render_text", "simulation_report"]
