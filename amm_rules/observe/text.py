"""The text of ``amm-rules status`` and ``amm-rules explain``, made from the plain data
of :func:`amm_rules.observe.status.status_report` and
:func:`amm_rules.observe.explain.explain_keys` (as they arrive over the comm: lists may
be tuples). Only rendering here: every figure is computed by those modules.

Sizes are shown as dask shows them (``152.59 MiB``), times as local dates.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from amm_rules.engine.drain_request import DrainReport
from amm_rules.engine.words import (
    ago,
    columns,
    counted,
    duration,
    local_time,
    signed_size,
    size,
)
from amm_rules.observe.conformance import SATISFIED


# ---------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------
def render_status(report: Mapping[str, Any]) -> str:
    """``amm-rules status``: the rules file, one row per rule, then the engine's work."""
    lines = [f"amm-rules on {report.get('scheduler') or 'a scheduler'}"]
    stopped = not_running_line(report)
    if stopped:
        lines.append(f"not running  {stopped}")
    lines += _render_rules_file(report)
    lines.append("")
    lines += _render_rules(report)
    lines.append("")
    lines += _render_engine(report)
    return "\n".join(lines) + "\n"


def not_running_line(report: Mapping[str, Any]) -> str:
    """What a report says first while the Active Memory Manager runs no cycle, with
    since when; "" while it runs."""
    amm = report.get("amm") or {}
    if amm.get("running", True):
        return ""
    return (
        f"the Active Memory Manager runs no cycle since {local_time(amm.get('since'))} "
        "(stopped, or start: false): nothing enforces the rules, and client.replicate "
        "and scatter(broadcast=...) are the stock calls"
    )


def conformance_line(c: Mapping[str, Any]) -> str:
    """``98.3% of 1,200 governed keys meet their target and placement``; with nothing
    governed, says so (a percentage of nothing reads as a bug); while no cycle runs,
    that nothing is enforced."""
    if c.get("running") is False:
        return "not enforced: the Active Memory Manager runs no cycle"
    governed = c["governed"]
    if not governed:
        return "no governed key in memory"
    if governed == 1:
        met = "meets" if c["met"] else "does not meet"
        return f"the one governed key {met} its target and placement"
    return f"{c['fraction']:.1%} of {governed:,} governed keys meet their target and placement"


#: Lines of the last reload error shown after its first (each diagnostic is a line; the
#: error itself was clipped to 10,000 characters when kept).
RELOAD_ERROR_LINES = 20


def _render_rules_file(report: Mapping[str, Any]) -> list[str]:
    digest = report.get("sha256")
    reload = "reloaded when it changes" if report.get("reload") else "not reloaded"
    out = [
        f"rules        {report['source']}",
        f"  sha256     {digest or '(unknown: rules given as a compiled Ruleset)'}",
        f"  loaded     {local_time(report['loaded_at'])} ({reload})",
    ]
    last = report.get("last_reload_error")
    if last:
        first, *more = str(last["error"]).splitlines() or [""]
        past = ", since reloaded" if last.get("since_reloaded") else ""
        out.append(f"  last reload error at {local_time(last['time'])}{past}: {first}")
        out += [f"    {line}" for line in more[:RELOAD_ERROR_LINES]]
        if len(more) > RELOAD_ERROR_LINES:
            hidden = len(more) - RELOAD_ERROR_LINES
            out.append(f"    (+{counted(hidden, 'more line')}: amm-rules validate shows them all)")
    else:
        out.append("  last reload error: none")
    # Features off for want of an internal of this dask or distributed.
    out += [f"  unsupported  {said}" for said in report.get("unsupported") or ()]
    return out


def _render_rules(report: Mapping[str, Any]) -> list[str]:
    c = report["conformance"]
    rows = c["rules"]
    out = [f"conformance  {conformance_line(c)}"]
    since = _departure_behind(report)
    if since:
        out.append(f"  in progress since {since}")
    table = [
        ("rule", "state", "keys", "bytes", "met", "unmet"),
        *(
            (
                r["name"] + ("" if r["in_file"] else " (removed)"),
                r["state"],
                f"{r['keys']:,}",
                size(r["bytes"]),
                f"{r['met']:,}",
                f"{r['unmet']:,}",
            )
            for r in rows
        ),
    ]
    for n, line in enumerate(columns(table, right=range(2, 6))):
        out.append(f"  {line}")
        if n and rows[n - 1]["state"] != SATISFIED:
            out.append(f"    {rows[n - 1]['sentence']}")
    return out


def cycle_timing(cycles: Mapping[str, Any]) -> str:
    """``last 1.9 ms, median 1.7 ms, worst 8.2 ms of the last 100`` (a report's
    ``cycle_ms``), or ``no cycle yet``."""
    if not cycles["recent"]:
        return "no cycle yet"
    return (
        f"last {cycles['last']:.1f} ms, median {cycles['median']:.1f} ms, worst "
        f"{cycles['worst']:.1f} ms of the last {cycles['recent']}"
    )


def _asked_before(report: Mapping[str, Any]) -> str:
    """While no cycle runs, copies in flight are what an earlier cycle asked."""
    if report["in_flight"] and not (report.get("amm") or {}).get("running", True):
        return " (asked by an earlier cycle)"
    return ""


def _render_engine(report: Mapping[str, Any]) -> list[str]:
    timing = cycle_timing(report["cycle_ms"])
    if report["cycle_ms"]["recent"]:
        timing = f"{report['cycles']:,} cycles; {timing}"
    out = [
        f"cycles       {timing}",
        f"backlog      {counted(report['classification_backlog'], 'key')} waiting for "
        "classification",
        f"in flight    {counted(report['in_flight'], 'copy')} of "
        f"{counted(report['in_flight_keys'], 'key')}{_asked_before(report)}",
    ]
    out += _render_departures(report)
    out += _render_flow(report.get("memory_flow"))
    out += _render_pressure(report.get("memory_pressure"))
    out += _render_adaptive(report.get("adaptive"), report.get("time"))
    out += _render_recompute(report.get("recompute"), report.get("protect"))
    out += _render_drains(report.get("drain"))
    out += _render_spill(report.get("spill"))
    r = report["rebalance"]
    if not r.get("enabled") and not r.get("in_flight"):
        out.append("rebalance    off")
        return out
    totals = r.get("totals", {})
    settings = (
        f"{r['measure']}, sender-min {r['sender_min']:.0%}, "
        f"recipient-max {r['recipient_max']:.0%}, gap {r['gap']:.0%}"
    )
    state = "on" if r.get("enabled") else "off (moves in flight finish)"
    if r.get("balancing"):
        state = "on for adaptive's balance"
    out.append(f"rebalance    {state} ({settings})")
    out.append(
        f"  {counted(r['in_flight'], 'move')} in flight ({size(r['in_flight_bytes'])}); "
        f"{counted(totals.get('moves', 0), 'move')}, {size(totals.get('bytes', 0))} copied, "
        f"{totals.get('done', 0):,} done, {totals.get('void', 0):,} abandoned since start"
    )
    plan = r.get("last_plan")
    if plan:
        mean = plan.get("mean")
        mean_text = f"mean {mean:.0%}, " if isinstance(mean, float) else ""
        out.append(
            f"  last plan: {counted(plan['moves'], 'move')} ({size(plan['bytes'])}), "
            f"{mean_text}stopped: {plan['stopped']}"
        )
    return out


#: Departures listed by ``amm-rules status`` (the newest first).
DEPARTURES_SHOWN = 3


def _departure_behind(report: Mapping[str, Any]) -> str | None:
    """The latest worker departure that left keys below target or lost, when some rule
    is in progress: what the engine is repairing."""
    from amm_rules.engine.sections.departures import departure_sentence

    recent = (report.get("workers_left") or {}).get("recent") or []
    states = (r["state"] for r in report["conformance"]["rules"])
    if not recent or "in-progress" not in states:
        return None
    last = recent[-1]
    if not (last.get("below") or last.get("lost")):
        return None
    return departure_sentence(last, report.get("time"))


def latest_departures(report: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], str]]:
    """The last :data:`DEPARTURES_SHOWN` workers that left (the ``worker-left`` events),
    newest first, each with its sentence: what it left below target or lost."""
    from amm_rules.engine.sections.departures import departure_sentence

    recent = (report.get("workers_left") or {}).get("recent") or []
    now = report.get("time")
    return [(e, departure_sentence(e, now)) for e in reversed(recent[-DEPARTURES_SHOWN:])]


def _render_departures(report: Mapping[str, Any]) -> list[str]:
    lines = [said for _, said in latest_departures(report)]
    if not lines:
        return ["left         no worker left since the policy started"]
    return [f"left         {lines[0]}", *(f"             {line}" for line in lines[1:])]


def _render_spill(spill: Mapping[str, Any] | None) -> list[str]:
    """The spill section: its settings, what is on disk, then a line per worker."""
    if not spill:
        return []
    on = {True: "on", False: "off"}
    workers = spill["workers"]
    on_disk = spill.get("bytes_on_disk", sum(w["bytes_on_disk"] for w in workers.values()))
    out = [
        f"spill        order {spill['order']}, drop-copies {on[spill['drop_copies']]}, "
        f"prefetch {on[spill['prefetch']]}; {counted(spill['keys_on_disk'], 'key')} "
        f"({size(on_disk)}) on disk, {counted(spill['drops'], 'copy')} dropped "
        f"instead of written; worker plugin {spill['plugin']}"
    ]
    if "lru_read_bytes" in spill:
        out.append(f"  {_saved_sentence(spill)}")
    if spill.get("plugin_error"):
        out.append(f"  {spill['plugin_error']}")
    for address, w in workers.items():
        saved = f"; {_saved_sentence(w)}" if "lru_read_bytes" in w else ""
        out.append(
            f"  {address}  {counted(w['keys_on_disk'], 'key')} on disk "
            f"({size(w['bytes_on_disk'])}); written {size(w['written_bytes'])}, "
            f"read back {size(w['read_bytes'])}; {counted(w['drops'], 'drop')}, "
            f"{w['prefetches']:,} read back ahead; {w['near_spill']:.0%} of the way to "
            f"writing to disk{saved}"
        )
    more = spill.get("workers_reporting", len(workers)) - len(workers)
    if more > 0:
        out.append(
            f"  (+{counted(more, 'more worker')} with less on disk: written "
            f"{size(spill['written_bytes'])}, read back {size(spill['read_bytes'])} in all)"
        )
    for address, why in spill["left_alone"].items():
        out.append(f"  {address}  left alone: {why}")
    by_rule = spill.get("bytes_on_disk_by_rule") or {}
    if by_rule:
        out.append(
            "  on disk by rule: " + ", ".join(f"{rule} {size(n)}" for rule, n in by_rule.items())
        )
    return out


def _saved_sentence(figures: Mapping[str, Any]) -> str:
    """What the order saved of reading back, as the worker plugin estimates it."""
    saved = figures["saved_read_bytes"]
    what = f"saved {size(saved)}" if saved >= 0 else f"cost {size(-saved)} more"
    return (
        f"order by value {what} of reading back: {size(figures['read_since_bytes'])} "
        f"read back, least-recently-used ~{size(figures['lru_read_bytes'])} (estimate)"
    )


def _render_drains(drain: Mapping[str, Any] | None) -> list[str]:
    """A line per drain (running, or ended recently), then its prediction or outcome."""
    out: list[str] = []
    for d in map(DrainReport.from_dict, (drain or {}).get("drains", ())):
        head = "drain        " if not out else "             "
        out.append(f"{head}{d.headline()}")
        if d.detail():
            out.append(f"               {d.detail()}")
        for entry in d.cannot_stay:
            out.append(
                f"               cannot move: {counted(entry['keys'], 'key')} ({entry['why']})"
            )
    return out


def _render_flow(flow: Mapping[str, Any] | None) -> list[str]:
    """The memory flow's summary line and its top producers and freers."""
    if not flow:
        return []

    totals = flow.get("totals") or {}
    out = [
        f"memory flow  {counted(flow['prefixes'], 'prefix')}; {size(totals.get('produced', 0))} "
        f"produced, {size(totals.get('freed', 0))} freed, "
        f"{size(totals.get('live', 0))} live"
    ]
    producers = ", ".join(
        f"{r['prefix']} ({signed_size(r['net_per_task'])}/task)" for r in flow["top_producers"]
    )
    freers = ", ".join(
        f"{r['prefix']} ({size(r['freed_by'])} freed by finishing)" for r in flow["top_freers"]
    )
    out.append(f"  producers  {producers or 'none yet'}")
    out.append(f"  freers     {freers or 'none yet'}")
    return out


def _render_pressure(pressure: Mapping[str, Any] | None) -> list[str]:
    """The memory-pressure section: its state and why."""
    if not pressure:
        return ["pressure     no memory-pressure section"]
    totals = pressure.get("totals") or {}
    out = [
        f"pressure     {pressure_state(pressure)}; {totals.get('holds', 0):,.0f} holds, "
        f"{totals.get('held_seconds', 0):,.1f}s held since start"
    ]
    out += [f"  {reason}" for reason in pressure.get("reasons") or ()]
    return out


def pressure_state(pressure: Mapping[str, Any]) -> str:
    """The memory-pressure section's state; while it holds, for how long and at what
    saturation."""
    if pressure["state"] != "holding":
        return str(pressure["state"])
    return (
        f"holding for {pressure['held_for']:.0f}s (worker-saturation "
        f"{pressure['saturation']:g}, the scheduler's {pressure['scheduler_saturation']:g})"
    )


def _render_adaptive(adaptive: Mapping[str, Any] | None, now: float | None) -> list[str]:
    """The adaptive section: its settings, the last target, the workers kept."""
    if not adaptive:
        return []
    settings = adaptive.get("settings")
    if settings is None:
        head = "no adaptive section (distributed's target; scale-down keeps pools, move: never)"
    else:
        parts = [f"headroom {settings['headroom']:.0%}"]
        if not settings["memory"]:
            parts.insert(0, "memory off")
        parts.append("hold-rules" if settings["hold_rules"] else "hold-rules off")
        if settings["memory"]:
            parts.append("balance" if settings.get("balance", True) else "balance off")
        head = f"on ({', '.join(parts)})"
    out = [f"adaptive     {head}"]
    target = adaptive.get("target")
    if target:
        out.append(
            f"  target {counted(target['workers'], 'worker')} (distributed's "
            f"{target['stock']}, memory's {target['memory']}) "
            f"{ago((now or time.time()) - target['at'])}"
        )
        out.append(f"  {target['text']}")
    out += [f"  {kept['why']}" for kept in (adaptive.get("kept") or {}).values()]
    return out


def _render_recompute(
    recompute: Mapping[str, Any] | None, protect: Mapping[str, Any] | None
) -> list[str]:
    """Work at risk (the workers with the most) and the protect section."""

    out = []
    if recompute:
        workers = recompute.get("workers") or []
        top = ", ".join(
            f"{w['worker']} {duration(w['seconds'])} ({counted(w['keys'], 'key')})"
            for w in workers[:3]
        )
        out.append(
            f"at risk      {duration(recompute['total_seconds'])} of recompute on "
            f"{counted(recompute['workers_at_risk'], 'worker')} holding keys alone"
            + (f"; most: {top}" if top else "")
        )
    if not protect:
        out.append("protect      no protect section")
        return out
    state = "budget exhausted" if protect["budget_exhausted"] else "within budget"
    out.append(
        f"protect      {counted(protect['keys'], 'key')} ({protect['keys_held']:,} holding "
        f"{counted(protect['copies'], 'copy')}), {size(protect['held_bytes'])} of "
        f"{size(protect['budget_bytes'])} budget ({protect['budget']}), {state}"
    )
    out.append(
        f"  {duration(protect['seconds_protected'])} of recompute protected, "
        f"{duration(protect['seconds_at_risk'])} left at risk; "
        f"{counted(protect['left_out'], 'candidate')} left out "
        f"({duration(protect['left_out_seconds'])})"
        + ("; choosing again" if protect.get("choosing") else "")
    )
    return out


def render_memory_flow(table: Mapping[str, Mapping[str, Any]], top: int) -> str:
    """``amm-rules status --memory-flow``: the top producers (largest net bytes per
    task) and the top freers (most bytes freed by their tasks finishing)."""

    rows = list(table.items())

    def ranked(figure: str) -> list[tuple[str, Mapping[str, Any]]]:
        """The ``top`` prefixes with the most of ``figure`` (those with none left out)."""
        chosen = [r for r in rows if (r[1][figure] or 0) > 0]
        return sorted(chosen, key=lambda r: -r[1][figure])[:top]

    header = ("prefix", "tasks", "produced", "freed by", "net/task", "freed", "live")

    def cells(prefix: str, r: Mapping[str, Any]) -> tuple[str, ...]:
        return (
            prefix,
            f"{r['tasks']:,}",
            size(r["produced"]),
            size(r["freed_by"]),
            signed_size(r["net_per_task"]),
            size(r["freed"]),
            size(r["live"]),
        )

    out = [f"memory flow of {len(rows):,} task prefixes"]
    for title, chosen in (
        ("top producers (net bytes added per task)", ranked("net_per_task")),
        ("top freers (bytes of inputs freed by their tasks finishing)", ranked("freed_by")),
    ):
        out += ["", title]
        if not chosen:
            out.append("  none yet")
            continue
        out += [
            f"  {line}"
            for line in columns([header, *(cells(p, r) for p, r in chosen)], right=range(1, 7))
        ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------
# explain
# ---------------------------------------------------------------------------------

#: Above this many workers, workers without a copy are grouped by decision.
WORKERS_LISTED = 12


def render_explain(answers: Mapping[str, Mapping[str, Any]]) -> str:
    """``amm-rules explain``: one block per key, the summary line first."""
    blocks = [_render_one(name, a) for name, a in answers.items()]
    return "\n".join(blocks)


def _render_one(name: str, a: Mapping[str, Any]) -> str:
    lines = [f"{name}: {a['summary']}"]
    facts = a.get("facts")
    if facts is None:
        pressure = a.get("memory_pressure")
        if pressure:
            lines += [f"  pressure  {reason}" for reason in pressure.get("reasons") or ()]
        lines += _render_history(a.get("history", []))
        return "\n".join(lines) + "\n"
    lines.append(
        f"  task     prefix {facts['prefix']}, group {facts['group']}, type {facts['type']}, "
        f"{size(facts['nbytes'])}, {counted(facts['waiters'], 'waiting task')}"
    )
    flow = facts.get("memory_flow")
    if flow and flow.get("tasks"):
        lines.append(
            f"  kind     {signed_size(flow['net_per_task'])} per task over "
            f"{counted(flow['tasks'], 'task')} ({size(flow['produced'])} produced, "
            f"{size(flow['freed_by'])} freed by finishing)"
        )
    recompute = a.get("recompute")
    if recompute:
        alone = recompute.get("sole_holder")
        # (The sentence names itself: "recompute ≈ 29 ms: own ...".)
        lines.append(
            f"  {recompute['text']} ({recompute['source']})"
            + (f"; only copy on {alone}" if alone else "")
        )
    protect = a.get("protect")
    if protect:
        lines.append(
            f"  protect  {counted(protect['copies'], 'copy')} kept"
            if protect.get("protected")
            else f"  protect  not protected: {protect['why']}"
        )
    spill = a.get("spill")
    if spill:
        if spill.get("spill"):
            lines.append(f"  spill    {spill['spill']} ({spill['spill_from']})")
        lines += [f"  spill    {line}" for line in spill["lines"]]
    lines += [f"  claim    {sentence}" for sentence in a.get("held") or ()]
    if facts["annotations"]:
        lines.append(f"  annotations  {facts['annotations']}")
    for n, h in enumerate(facts["holders"]):
        pools = ",".join(h["pools"]) or "no pool"
        head = "  holders  " if n == 0 else "           "
        lines.append(f"{head}{h['address']} ({pools}; host {h['host']}; {h['status']})")
    lines.append("  cascade")
    lines += _render_cascade(a["cascade"])
    lines.append("  workers")
    lines += _render_workers(a["decisions"])
    if a.get("rebalance"):
        lines.append(f"  rebalance  {_rebalance_words(a['rebalance'])}")
    drain = a.get("drain")
    if drain:
        words = drain.get("text") or f"{drain['standing']}: {drain['why']}"
        lines.append(f"  drain    {drain['worker']} drains: {words}")
    lines += _render_history(a.get("history", []))
    return "\n".join(lines) + "\n"


def _render_cascade(cascade: list[Mapping[str, Any]]) -> list[str]:
    rows = []
    n = 0
    for entry in cascade:
        if "rule" in entry:
            n += 1
            label = f"{n}. {entry['rule']}"
            if entry.get("error"):
                what = entry["error"]
            else:
                what = "matched" if entry["matched"] else "no match"
        else:
            label = entry["source"]
            what = entry.get("error") or ("sets" if entry["sets"] else "none")
        parts = [what]
        if entry["decided"]:
            parts.append(
                "decided " + ", ".join(f"{f}={entry['sets'][f]}" for f in entry["decided"])
            )
        if entry["overridden"]:
            parts.append(
                "overridden: "
                + ", ".join(f"{f} (by {by})" for f, by in entry["overridden"].items())
            )
        if "rule" in entry and entry["matched"] is False and entry["sets"]:
            parts.append("sets " + ", ".join(f"{f}={v}" for f, v in entry["sets"].items()))
        rows.append((label, "; ".join(parts)))
    width = max(len(label) for label, _ in rows)
    return [f"    {label:<{width}}  {text}" for label, text in rows]


def _render_workers(decisions: Mapping[str, Mapping[str, Any]]) -> list[str]:
    def why(d: Mapping[str, Any]) -> str:
        parts = [x["why"] for x in d["deciders"]]
        if d.get("next"):
            parts.append(d["next"])
        if d.get("rebalance"):
            parts.append(f"rebalance: {d['rebalance']}")
        return "; ".join(parts)

    items = list(decisions.items())
    width = max((len(a) for a, _ in items), default=0)
    if len(items) <= WORKERS_LISTED:
        return [f"    {a:<{width}}  {d['decision']:<9}  {why(d)}".rstrip() for a, d in items]
    out = []
    groups: dict[tuple[str, str], list[str]] = {}
    for address, d in items:
        if d["decision"] == "holds" or d.get("next"):
            out.append(f"    {address:<{width}}  {d['decision']:<9}  {why(d)}".rstrip())
        else:
            text = "; ".join(x["why"] for x in d["deciders"])
            groups.setdefault((d["decision"], text), []).append(address)
    for (decision, text), addresses in sorted(groups.items(), key=lambda g: -len(g[1])):
        examples = ", ".join(addresses[:3]) + (", ..." if len(addresses) > 3 else "")
        workers = counted(len(addresses), "worker")
        out.append(f"    {workers}  {decision:<9}  {text or '-'}  ({examples})")
    return out


def _rebalance_words(r: Mapping[str, Any]) -> str:
    if r.get("moving"):
        landed = "landed" if r.get("landed") else "in flight"
        return f"moving from {r['sender']} to {r['recipient']} (copy {landed})"
    return "cooling down after a move: not moved again yet"


def _render_history(history: list[Mapping[str, Any]]) -> list[str]:
    if not history:
        return ["  last decisions: none kept"]
    out = ["  last decisions"]
    for h in history:
        stamp = time.strftime("%H:%M:%S", time.localtime(h["time"]))
        source = "" if h["source"] in h["reason"] else f" [{h['source']}]"
        out.append(
            f"    {stamp}  {h['op']:<9} {h['worker']}  {h['outcome']}: {h['reason']}{source}"
        )
    return out
