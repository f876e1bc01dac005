"""The offline commands behind :mod:`amm_rules.cli`: ``simulate``, ``diff``, ``test`` and
``validate --dump``.

:mod:`amm_rules.cli` declares the commands and their options (and stays importable
without ``distributed``); this module does the work: it reads the rules (reporting their
diagnostics as ``validate`` does), reads the cluster (a dump, or the state of a running
scheduler), resolves ``--kill*`` to workers, runs the simulator and prints the report.
Every problem with the input is one clear message: :class:`click.UsageError` (exit 2)
for arguments that name nothing, :class:`click.ClickException` (exit 1) for a dump that
cannot be read or a scheduler that cannot be reached.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import click

from amm_rules.language.reporters import escape_controls
from amm_rules.language.ruleset import Ruleset
from amm_rules.offline.dump import ClusterState, DumpError, read_dump

#: What a dump of a running scheduler leaves out: logs and histories the simulator does
#: not read (they are most of a dump's size).
SCHEDULER_DUMP_EXCLUDE = (
    "run_spec",
    "transition_log",
    "log",
    "logs",
    "stimulus_log",
    "transfer_incoming_log",
    "transfer_outgoing_log",
    "events",
)


def load_rules(path: str) -> Ruleset | None:
    """The rules file's ruleset, or None after printing its errors (as validate does).
    Read as validate reads it: ``-`` is standard input, and a pipe or a process
    substitution is read to its end."""
    from amm_rules.language.loader import check_argument
    from amm_rules.language.reporters import format_text

    result = check_argument(path)
    if result.ruleset is None:
        click.echo(escape_controls(format_text([result])), nl=False, err=True)
        return None
    return result.ruleset


def load_cluster(dump: str | None, scheduler: str | None, max_bytes: int) -> ClusterState:
    """The cluster of ``--dump FILE`` or ``--scheduler ADDRESS`` (exactly one), of at
    most ``max_bytes`` decompressed (``--max-dump-size``)."""
    if (dump is None) == (scheduler is None):
        raise click.UsageError("give the cluster with either --dump FILE or --scheduler ADDRESS")
    try:
        if dump is not None:
            return read_dump(dump, max_bytes)
        assert scheduler is not None
        return read_scheduler(scheduler, max_bytes)
    except DumpError as exc:
        raise click.ClickException(str(exc)) from None


def read_scheduler(address: str, max_bytes: int) -> ClusterState:
    """The state of a running scheduler, through a cluster dump it writes for us. Waits
    for the scheduler as long as dask's ``distributed.comm.timeouts.connect`` says."""
    import dask
    from dask.utils import parse_timedelta
    from distributed import Client

    timeout = parse_timedelta(dask.config.get("distributed.comm.timeouts.connect"))
    try:
        client = Client(address, timeout=timeout, set_as_default=False)
    except Exception as exc:  # OSError, TimeoutError, a bad address...
        raise click.ClickException(
            f"cannot reach the scheduler at {address}: {exc or type(exc).__name__}"
        ) from None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "cluster")
            client.dump_cluster_state(path, exclude=SCHEDULER_DUMP_EXCLUDE, format="msgpack")
            state = read_dump(path + ".msgpack.gz", max_bytes)
    finally:
        client.close()
    state.source = address
    return state


def resolve_kills(
    state: ClusterState,
    pools: dict[str, frozenset[str]],
    ruleset: Ruleset,
    workers: Sequence[str],
    hosts: Sequence[str],
    pool_names: Sequence[str],
    option: str = "--kill",
) -> list[str]:
    """Addresses of the workers named by ``--kill`` (address or name; ``option`` names
    it in messages), ``--kill-host`` and ``--kill-pool``, in the dump's order."""
    chosen: set[str] = set()
    for name in workers:
        found = [a for a, w in state.workers.items() if name in (a, w.name, a.split("://")[-1])]
        if not found:
            raise click.UsageError(
                f"{option} {name}: no worker with that address or name in {state.source}"
                + _listing("workers", list(state.workers))
            )
        chosen.update(found)
    for host in hosts:
        found = [a for a, w in state.workers.items() if w.host == host]
        if not found:
            known = sorted({w.host for w in state.workers.values()})
            raise click.UsageError(
                f"--kill-host {host}: no worker on that host in {state.source}"
                + _listing("hosts", known)
            )
        chosen.update(found)
    for pool in pool_names:
        if pool not in ruleset.pools:
            raise click.UsageError(
                f"--kill-pool {pool}: the rules define no such pool"
                + _listing("pools", list(ruleset.pools))
            )
        chosen.update(a for a, names in pools.items() if pool in names)
    return [a for a in state.workers if a in chosen]


def _listing(what: str, names: list[str]) -> str:
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    return f" ({what}: {shown})" if names else f" (it has no {what})"


def simulate(
    rules: str,
    dump: str | None,
    scheduler: str | None,
    *,
    cycles: int | None,
    kill: tuple[Sequence[str], Sequence[str], Sequence[str]],
    drain: tuple[Sequence[str], float, float],
    fmt: str,
    max_dump_bytes: int,
) -> int:
    """``amm-rules simulate`` (``kill`` and ``drain`` as :func:`run_simulation` takes
    them). Exit status: 1 if a kill (or a drain's deadline) loses data, or the input is
    bad."""
    from amm_rules.offline.report import render_text
    from amm_rules.offline.simulate import amm_defaults

    ruleset = load_rules(rules)
    if ruleset is None:
        return 1
    state = load_cluster(dump, scheduler, max_dump_bytes)
    measure, interval = amm_defaults()
    report = run_simulation(
        ruleset,
        state,
        measure=measure,
        interval=interval,
        cycles=cycles,
        kill=kill,
        rules_file=rules,
        drain=drain,
    )
    if fmt == "json":
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(escape_controls(render_text(report)), nl=False)
    for warning in state.warnings:
        click.echo(escape_controls(f"warning: {state.source}: {warning}"), err=True)
    return 1 if report["lost"] else 0


def run_simulation(
    ruleset: Ruleset,
    state: ClusterState,
    *,
    measure: str,
    interval: float,
    cycles: int | None = None,
    kill: tuple[Sequence[str], Sequence[str], Sequence[str]] = ((), (), ()),
    rules_file: str = "",
    drain: tuple[Sequence[str], float, float] = ((), 60.0, 100 * 2**20),
) -> dict[str, Any]:
    """Simulate ``ruleset`` on ``state`` (after the kills; after the drain of
    ``drain``'s workers within its deadline at its rate, which kills them) and return
    the report."""
    from amm_rules.offline.report import simulation_report
    from amm_rules.offline.simulate import Simulation
    from amm_rules.offline.workers_needed import workers_needed

    sim = Simulation.of(ruleset, state, measure=measure, interval=interval)
    report = None
    drained = None
    drain_workers_, deadline, rate = drain
    if drain_workers_:
        from amm_rules.offline.drain import drain_workers

        if any(kill):
            raise click.UsageError("--drain and --kill* cannot be used together")
        victims = resolve_kills(
            state, sim.initial_pools, ruleset, drain_workers_, (), (), option="--drain"
        )
        drained = drain_workers(sim, victims, deadline, rate)
        report = kill_workers(sim, victims)
    elif any(kill):
        victims = resolve_kills(state, sim.initial_pools, ruleset, *kill)
        report = kill_workers(sim, victims)
    result = sim.run(cycles)
    out = simulation_report(sim, result, report, rules_file=rules_file)
    out["workers_needed"] = workers_needed(sim)
    if drained is not None:
        out["drain"] = drained
    return out


def kill_workers(sim: Any, victims: list[str]) -> Any:
    """Kill workers in a simulation before its first cycle; what that does."""
    from amm_rules.offline.report import KillReport, governing_label

    governed = dict(sim.desired)
    at_risk = sim.ctx.costs.at_risk
    recompute = {a: at_risk.get(a, 0.0) for a in victims}
    lost = sim.kill(victims)
    below = [
        (ts.key, governing_label(d), lo, len(ts.who_has or ())) for ts, d, lo in sim.below_target()
    ]
    return KillReport(
        workers=victims,
        lost=[
            (ts.key, ts.nbytes, governing_label(governed[ts.key]) if ts.key in governed else None)
            for ts in lost
        ],
        below=below,
        recompute=recompute,
    )


def diff(
    old: str,
    new: str,
    dump: str | None,
    scheduler: str | None,
    *,
    cycles: int | None,
    fmt: str,
    max_dump_bytes: int,
) -> int:
    """``amm-rules diff``."""
    from amm_rules.offline.diff import diff_rules, render_diff
    from amm_rules.offline.simulate import amm_defaults

    if old == new == "-":
        raise click.UsageError("OLD and NEW cannot both be '-': standard input is read once")
    before, after = load_rules(old), load_rules(new)
    if before is None or after is None:
        return 1
    state = load_cluster(dump, scheduler, max_dump_bytes)
    measure, interval = amm_defaults()
    report = diff_rules(
        before,
        after,
        state,
        measure=measure,
        interval=interval,
        cycles=cycles,
        old_file=old,
        new_file=new,
    )
    if fmt == "json":
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(escape_controls(render_diff(report)), nl=False)
    for warning in state.warnings:
        click.echo(escape_controls(f"warning: {state.source}: {warning}"), err=True)
    return 0


def run_tests(paths: Sequence[str], *, coverage: bool, fmt: str, allow_outside: bool) -> int:
    """``amm-rules test``; ``allow_outside``: a test file's ``rules:`` may be anywhere
    (see :func:`~amm_rules.offline.ruletests.run_files`)."""
    from amm_rules.offline.ruletests import (
        allowed_roots,
        exit_status,
        find_test_files,
        render_json,
        render_text,
        run_files,
    )

    files = find_test_files(paths)
    if not files:
        raise click.UsageError(
            f"no test files in {', '.join(paths)} (test files are named *_test.yaml)"
        )
    roots = None if allow_outside else allowed_roots(paths)
    results, cover = run_files(files, roots)
    shown = cover if coverage else None
    if fmt == "json":
        click.echo(json.dumps(render_json(results, shown), indent=2))
    else:
        click.echo(escape_controls(render_text(results, shown)), nl=False)
    return exit_status(results)


def write_tests(dump: str, rules: str, output: str, *, sample: int, max_dump_bytes: int) -> int:
    """``amm-rules test --from-dump DUMP --rules RULES -o OUTPUT``: a test file of the
    dump's cluster, what the rules decide today as its expectations
    (:mod:`amm_rules.offline.casegen`). ``-`` writes to standard output."""
    from amm_rules.engine.words import counted
    from amm_rules.offline.casegen import CaseGenError, cases_from_dump

    ruleset = load_rules(rules)
    if ruleset is None:
        return 1
    if rules == "-":
        raise click.UsageError("--rules: a test file names its rules file: give a path, not '-'")
    state = load_cluster(dump, None, max_dump_bytes)
    command = f"amm-rules test --from-dump {dump} --rules {rules}"  # named in the file
    try:
        made = cases_from_dump(state, ruleset, rules, output, sample=sample, command=command)
    except CaseGenError as exc:
        raise click.ClickException(str(exc)) from None
    if output == "-":
        click.echo(made.text, nl=False)
    else:
        with open(output, "w", encoding="utf-8") as f:
            f.write(made.text)
        click.echo(
            f"wrote {output}: 1 case of {counted(made.keys, 'key')} (of {made.keys_in_memory:,} in "
            f"memory in {state.source}), the rules' decisions as expectations",
            err=True,
        )
    for warning in state.warnings:
        click.echo(escape_controls(f"warning: {state.source}: {warning}"), err=True)
    return 0


def add_cluster_warnings(results: Sequence[Any], dump: str, max_bytes: int) -> None:
    """``validate --dump``: add the warnings that need a cluster to each checked file."""
    from amm_rules.language.diagnostics import sort_key
    from amm_rules.offline.checks import cluster_warnings
    from amm_rules.offline.simulate import amm_defaults

    state = load_cluster(dump, None, max_bytes)
    measure, _ = amm_defaults()
    for result in results:
        extra = cluster_warnings(result, state, measure)
        result.diagnostics = sorted([*result.diagnostics, *extra], key=sort_key)
