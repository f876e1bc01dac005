"""The ``amm-rules`` command line (also ``python -m amm_rules``): its commands and their
options, each command's help its docstring. Those against a running scheduler
(``status``, ``explain``, ``drain``) talk to it through :mod:`amm_rules.cli.remote`.

This module and everything ``validate`` needs belong to the language half: nothing
here imports ``distributed``, and heavy imports are made inside the commands (the
offline ones live in :mod:`amm_rules.offline.commands`), so the command starts about
as fast as its parsing dependencies import.

Exit status of every command: 0 success, 1 a problem found (invalid rules, an
unreachable scheduler, no engine there, unknown keys, ``status --check`` with a rule
not satisfied, data lost by ``simulate --kill``, a failed rule test), 2 usage.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from amm_rules import __version__

if TYPE_CHECKING:
    from collections.abc import Callable

    from amm_rules.language.loader import CheckResult


def _format(choices: tuple[str, ...]) -> Any:
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(choices),
        default="text",
        show_default=True,
        help="Output format.",
    )


_format_option = _format(("text", "json"))
# The cluster that simulate and diff read: a dump file, or a running scheduler's state.
_dump_option = click.option(
    "--dump",
    type=click.Path(dir_okay=False),
    help="Cluster dump (Client.dump_cluster_state: .msgpack.gz or .yaml).",
)
_state_option = click.option(
    "--scheduler", metavar="ADDRESS", help="Read the state of a running scheduler."
)
#: The default of ``--max-dump-size`` (``amm_rules.offline.dump.MAX_DUMP_BYTES``, which
#: this module does not import: it stays importable without the offline half).
MAX_DUMP_SIZE = "1 GiB"


def _dump_size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    from amm_rules.language.fields import UnitError, parse_size

    try:
        return parse_size(value)
    except UnitError as exc:
        raise click.BadParameter(str(exc)) from None


_max_dump_option = click.option(
    "--max-dump-size",
    "max_dump_bytes",
    metavar="SIZE",
    default=MAX_DUMP_SIZE,
    show_default=True,
    callback=_dump_size,
    help="Refuse a cluster dump larger than this once decompressed (e.g. '4 GiB').",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="amm-rules")
def main() -> None:
    """Declarative rules for Dask's Active Memory Manager."""


@main.command()
@click.argument("files", nargs=-1, metavar="FILE...")
@_format(("text", "json", "github"))
@click.option("--strict", is_flag=True, help="Fail (exit 1) on warnings too.")
@click.option(
    "--dump",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also warn about what this cluster (a Client.dump_cluster_state file) cannot "
    "give the rules: a min above its eligible workers, a pool with no workers, spread: "
    "host on one host.",
)
@click.option(
    "--disable",
    "disabled",
    multiple=True,
    metavar="CODE",
    help="Do not report warnings with this code (repeatable).",
)
@click.option(
    "--dask-config",
    "dask_configs",
    multiple=True,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="A dask config file: check the rules of its amm_rules.RulesPolicy entries (repeatable).",
)
@_max_dump_option
def validate(
    files: tuple[str, ...],
    fmt: str,
    strict: bool,
    dump: str | None,
    disabled: tuple[str, ...],
    dask_configs: tuple[str, ...],
    max_dump_bytes: int,
) -> None:
    """Check rules files and report every problem.

    FILE '-' reads standard input. Exit status: 0 when no file has errors (warnings
    allowed unless --strict), 1 when any file has errors (with --strict: errors or
    warnings) or the dump cannot be read, 2 for usage errors.
    """
    if not files and not dask_configs:
        raise click.UsageError("name at least one rules FILE ('-' for standard input)")
    if disabled:
        from amm_rules.language.lint import ALL_WARNING_CODES

        unknown = [c for c in disabled if c not in ALL_WARNING_CODES]
        if unknown:
            raise click.BadParameter(
                f"{unknown[0]!r} is not a warning code; only warnings can be disabled: "
                f"{', '.join(sorted(ALL_WARNING_CODES))}",
                param_hint="'--disable'",
            )
    sys.exit(
        _validate(
            list(files), fmt, strict, dump, frozenset(disabled), list(dask_configs), max_dump_bytes
        )
    )


def _validate(
    files: list[str],
    fmt: str,
    strict: bool,
    dump: str | None = None,
    disabled: frozenset[str] = frozenset(),
    dask_configs: list[str] | None = None,
    max_dump_bytes: int = 0,
) -> int:
    """``validate``'s exit status (``max_dump_bytes`` is read with ``dump`` only)."""
    from amm_rules.language.loader import check_argument
    from amm_rules.language.reporters import REPORTERS

    results = [check_argument(f) for f in files]
    if dask_configs:
        from amm_rules.language.dask_config import check_dask_config

        for config in dask_configs:
            results += check_dask_config(config)
        _add_unsupported(results)
    if dump is not None:
        # Only here: reading a dump and computing pools imports the engine (distributed).
        from amm_rules.language.directives import silence
        from amm_rules.offline.commands import add_cluster_warnings

        add_cluster_warnings(results, dump, max_dump_bytes)
        silence(results)  # '# amm-rules: disable=' covers the cluster's warnings too
    for r in results:
        r.diagnostics = [d for d in r.diagnostics if d.is_error or d.code not in disabled]
    click.echo(REPORTERS[fmt](results), nl=False)
    failed = any(d.is_error or strict for r in results for d in r.diagnostics)
    return 1 if failed else 0


def _add_unsupported(results: list[CheckResult]) -> None:
    """A warning (``unsupported``) for each feature the rules use that this
    environment's dask or distributed cannot serve, in the words a scheduler here would
    log (see amm_rules.engine.features), at the feature's key in the file."""
    from amm_rules.engine.features import unsupported_in
    from amm_rules.engine.sections import SECTIONS
    from amm_rules.language.diagnostics import Diagnostic

    features = [f for section in SECTIONS for f in section.FEATURES]
    for r in results:
        for ruleset in [r.ruleset, *r.inline] if r.ruleset is not None else r.inline:
            for feature, said in unsupported_in(ruleset, features):
                line, column = _key_position(r.text, feature.name.split(":")[0])
                r.diagnostics.append(
                    Diagnostic(r.file, line, column, "warning", said, None, "unsupported")
                )


def _key_position(text: str | None, key: str) -> tuple[int, int]:
    """Line and column of the first ``key:`` in ``text`` (0, 0 if none)."""
    for n, line in enumerate((text or "").splitlines(), 1):
        if line.lstrip().startswith(f"{key}:"):
            return n, len(line) - len(line.lstrip()) + 1
    return 0, 0


@main.command()
@click.argument("rules", metavar="RULES")
@_dump_option
@_state_option
@click.option(
    "--cycles",
    type=click.IntRange(min=1),
    default=None,
    help="Stop after N cycles (1: exactly the next cycle's suggestions). Default: until "
    "nothing changes.",
)
@click.option("--kill", multiple=True, metavar="WORKER", help="Lose a worker (address or name).")
@click.option("--kill-host", multiple=True, metavar="HOST", help="Lose every worker of a host.")
@click.option("--kill-pool", multiple=True, metavar="NAME", help="Lose every worker of a pool.")
@click.option(
    "--drain",
    multiple=True,
    metavar="WORKER",
    help="Drain a worker (address or name) before --deadline at --rate, then lose it.",
)
@click.option(
    "--deadline",
    default="60s",
    show_default=True,
    metavar="DURATION",
    help="With --drain: the time the workers have.",
)
@click.option(
    "--rate",
    default="100MiB/s",
    show_default=True,
    metavar="RATE",
    help="With --drain: bytes per second each drained worker sends.",
)
@_format_option
@_max_dump_option
def simulate(
    rules: str,
    dump: str | None,
    scheduler: str | None,
    cycles: int | None,
    kill: tuple[str, ...],
    kill_host: tuple[str, ...],
    kill_pool: tuple[str, ...],
    drain: tuple[str, ...],
    deadline: str,
    rate: str,
    fmt: str,
    max_dump_bytes: int,
) -> None:
    """What RULES would do to a cluster, cycle after cycle, until nothing changes.

    Runs the engine's own classifier and planners on the cluster of --dump or
    --scheduler; copies land between cycles; the computation is frozen. Reports per
    rule, per pool and per worker, the keys left unmet, and with --kill* what losing
    those workers does. With --drain, the workers first send what they can before
    --deadline at --rate, most valuable first (the drain's own order and prediction),
    and are then lost.

    RULES is read as validate reads a FILE: '-' is standard input, and a pipe or a
    process substitution is read to its end.

    Exit status: 0; 1 when a --kill* (or a drain's deadline) loses the last copy of a
    key, or the rules or the cluster cannot be read; 2 for usage errors.
    """
    from amm_rules.offline.commands import simulate as run
    from amm_rules.offline.drain import parse_rate

    try:
        seconds = _duration(None, None, deadline)
    except click.BadParameter as exc:
        exc.param_hint = "'--deadline'"
        raise
    try:
        per_second = parse_rate(rate)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--rate'") from None

    sys.exit(
        run(
            rules,
            dump,
            scheduler,
            cycles=cycles,
            kill=(kill, kill_host, kill_pool),
            drain=(drain, seconds, per_second),
            fmt=fmt,
            max_dump_bytes=max_dump_bytes,
        )
    )


@main.command()
@click.argument("old", metavar="OLD")
@click.argument("new", metavar="NEW")
@_dump_option
@_state_option
@click.option(
    "--cycles",
    type=click.IntRange(min=1),
    default=None,
    help="Stop the new rules after N cycles. Default: until nothing changes.",
)
@_format_option
@_max_dump_option
def diff(
    old: str,
    new: str,
    dump: str | None,
    scheduler: str | None,
    cycles: int | None,
    fmt: str,
    max_dump_bytes: int,
) -> None:
    """What replacing the rules OLD by NEW would do to a cluster.

    OLD settles on the cluster first; then every key whose target or placement changes
    is listed, and NEW runs until nothing changes: copies added and dropped, bytes
    transferred, per rule and in total.

    OLD and NEW are read as validate reads a FILE: either may be '-' (standard input),
    a pipe or a process substitution, such as <(git show HEAD~1:rules.yaml).

    Exit status: 0; 1 when the rules or the cluster cannot be read; 2 for usage errors.
    """
    from amm_rules.offline.commands import diff as run

    sys.exit(run(old, new, dump, scheduler, cycles=cycles, fmt=fmt, max_dump_bytes=max_dump_bytes))


@main.command(name="test")
@click.argument("paths", nargs=-1, metavar="FILE|DIR...", type=click.Path(exists=True))
@click.option("--coverage", is_flag=True, help="List the rules and pools no case exercised.")
@_format_option
@click.option("--schema", "show_schema", is_flag=True, help="Print the test files' JSON Schema.")
@click.option(
    "--allow-outside",
    is_flag=True,
    help="Let a test file's 'rules:' name a file outside the tree the test file belongs "
    "to and the directories given.",
)
@click.option(
    "--from-dump",
    "from_dump",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="DUMP",
    help="Write a test file instead of running tests: the cluster of this dump "
    "(Client.dump_cluster_state), and what --rules decide for its keys as expectations.",
)
@click.option(
    "--rules",
    "rules",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="RULES",
    help="With --from-dump: the rules file the cases test.",
)
@click.option(
    "-o",
    "--output",
    default="-",
    show_default=True,
    metavar="FILE",
    help="With --from-dump: where to write the test file ('-': standard output).",
)
@click.option(
    "--sample",
    type=click.IntRange(min=1, max=100_000),
    default=200,
    show_default=True,
    metavar="N",
    help="With --from-dump: most keys in the case, taken in turn from each task group.",
)
@_max_dump_option
def test_command(
    paths: tuple[str, ...],
    coverage: bool,
    fmt: str,
    show_schema: bool,
    allow_outside: bool,
    from_dump: str | None,
    rules: str | None,
    output: str,
    sample: int,
    max_dump_bytes: int,
) -> None:
    """Run rule tests: test files, or every *_test.yaml under the directories given.

    Each case builds a small cluster, runs the rules on it with the engine's own
    planners until nothing changes, and checks what was expected. PASS or FAIL per
    case, with what differed and where.

    A test file's 'rules:' is read relative to the test file, and must be inside the
    tree the test file belongs to (the nearest directory holding .git or pyproject.toml,
    else the file's own) or the directories given, wherever the command runs from,
    unless --allow-outside.

    With --from-dump DUMP --rules RULES, writes a test file instead (to -o FILE): the
    dump's workers, a sample of its keys in memory (--sample) and what RULES decide for
    each as expectations; it passes on RULES and fails once a change of them changes a
    decision.

    Exit status: 0 when every case passed, 1 when a case failed or a test file has
    errors, 2 for usage errors (including no test file found).
    """
    if show_schema:
        click.echo(rule_test_schema_text(), nl=False)
        return
    if from_dump is not None or rules is not None:
        if from_dump is None or rules is None or paths:
            raise click.UsageError(
                "--from-dump DUMP and --rules RULES go together, without test files"
            )
        from amm_rules.offline.commands import write_tests

        sys.exit(
            write_tests(from_dump, rules, output, sample=sample, max_dump_bytes=max_dump_bytes)
        )
    if not paths:
        raise click.UsageError("give test files or directories (or --schema)")
    from amm_rules.offline.commands import run_tests

    sys.exit(run_tests(paths, coverage=coverage, fmt=fmt, allow_outside=allow_outside))


def rule_test_schema_text() -> str:
    import json

    from amm_rules.offline.casefile import TEST_SCHEMA

    return json.dumps(TEST_SCHEMA, indent=2) + "\n"


@main.command()
def schema() -> None:
    """Print the JSON Schema of rules files (for editor completion)."""
    click.echo(schema_text(), nl=False)


def schema_text() -> str:
    import json

    from amm_rules.language.schema import SCHEMA

    return json.dumps(SCHEMA, indent=2) + "\n"


@main.command()
@click.option(
    "--rules",
    "rules",
    type=click.Path(dir_okay=False),
    default=None,
    help="Rules file to use instead of the demo's own.",
)
def demo(rules: str | None) -> None:
    """Run the demo (a local cluster driven by a rules file)."""
    import importlib

    try:
        demo_module = importlib.import_module("amm_rules.demo")
    except ModuleNotFoundError as exc:
        if exc.name != "amm_rules.demo":
            raise
    else:
        result = demo_module.main(rules=rules)
        sys.exit(result if isinstance(result, int) else 0)
    # The demo is not part of this build: show what the rules files say instead.
    if rules is not None:
        files = [rules]
    else:
        # examples/rules of a source checkout (next to the package directory)
        examples = Path(__file__).resolve().parents[2] / "examples" / "rules"
        files = sorted(str(p) for p in examples.glob("*.yaml"))
        if not files:
            raise click.ClickException(
                "no demo here, and no examples/rules/ directory (run from a source checkout)"
            )
    click.echo("amm_rules.demo is not available; validating the example rules instead.", err=True)
    sys.exit(_validate(files, "text", strict=False))


# ---------------------------------------------------------------------------------
# Against a running scheduler
# ---------------------------------------------------------------------------------

_scheduler_option = click.option(
    "--scheduler",
    "address",
    default=None,
    metavar="ADDRESS",
    help="The scheduler's address (default: DASK_SCHEDULER_ADDRESS, or dask config "
    "'scheduler-address').",
)
_timeout_option = click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=2.0,  # amm_rules.cli.remote.DEFAULT_TIMEOUT (not imported here: startup time)
    show_default=True,
    help="Seconds to wait for the scheduler at each step. 2 s by default: a reachable "
    "scheduler answers in milliseconds, so waiting longer mostly delays the error.",
)


def _remote(command: Callable[..., Any], given: str | None, *args: Any, **kwargs: Any) -> Any:
    """``command`` run against the scheduler at ``--scheduler`` (else dask's config); a
    :class:`~amm_rules.cli.remote.RemoteError` is one line on standard error, exit 1."""
    from amm_rules.cli.remote import RemoteError, scheduler_address

    address = scheduler_address(given)
    if not address:
        raise click.UsageError(
            "no scheduler address: pass --scheduler ADDRESS, or set DASK_SCHEDULER_ADDRESS"
        )
    try:
        return command(address, *args, **kwargs)
    except RemoteError as exc:
        click.echo(f"amm-rules: error: {exc}", err=True)
        sys.exit(1)


@main.command()
@_scheduler_option
@_format_option
@click.option("--check", is_flag=True, help="Exit 1 when any rule is not 'satisfied'.")
@click.option(
    "--memory-flow",
    "memory_flow",
    is_flag=True,
    help="Show the memory flow per task prefix instead: top producers and top freers.",
)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="With --memory-flow: prefixes per table.",
)
@_timeout_option
def status(
    address: str | None, fmt: str, check: bool, memory_flow: bool, top: int, timeout: float
) -> None:
    """Per-rule conformance and the engine's work, from a running scheduler.

    One row per rule (and for annotations and runtime targets): its state
    (satisfied, in-progress, unsatisfiable), keys, bytes, keys meeting their target
    and not; then the rules file, cycle times, the classification backlog, the memory
    flow, memory pressure and rebalancing. With --memory-flow: per task prefix, the
    bytes produced and freed (the top producers and the top freers; every prefix with
    --format json). Exit status: 0, or 1 if the scheduler cannot be reached, runs no
    amm-rules engine, or (with --check) a rule is not satisfied; 2 for usage errors.
    """
    from amm_rules.cli.remote import memory_flow_command, status_command

    if memory_flow and check:
        raise click.UsageError("--check and --memory-flow cannot be used together")
    if memory_flow:
        text, code = _remote(memory_flow_command, address, fmt, top, timeout)
    else:
        text, code = _remote(status_command, address, fmt, check, timeout)
    click.echo(text, nl=False)
    sys.exit(code)


@main.command()
@click.argument("keys", nargs=-1, metavar="KEY...")
@_scheduler_option
@click.option("--unmet", is_flag=True, help="Explain keys whose target is unmet.")
@click.option("--rule", default=None, metavar="NAME", help="With --unmet: keys of this rule.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=None,
    help="With --unmet: at most this many keys (default 10).",
)
@_format_option
@_timeout_option
def explain(
    keys: tuple[str, ...],
    address: str | None,
    unmet: bool,
    rule: str | None,
    limit: int | None,
    fmt: str,
    timeout: float,
) -> None:
    """Why keys are where they are: a summary line, the key's facts, the rules
    cascade, one decision per worker (yes, no, throttled, holds) and the engine's
    last decisions for the key.

    KEY is written as dask prints it: x-1a2b, or a tuple such as "('x-1a2b', 0)"
    (read as data, never run as code). With --unmet instead of keys, explains keys
    whose target or placement is unmet, as far as --limit (the scheduler explains at
    most 1,000 keys in one call, fewer at hundreds of workers; the last line says how
    many were shown of how many). Exit status: 0, or 1 for
    unknown keys, an unreachable scheduler or one without amm-rules; 2 for usage
    errors.
    """
    from amm_rules.cli.keys import parse_key
    from amm_rules.cli.remote import explain_command

    if unmet == bool(keys):
        raise click.UsageError("give keys to explain, or --unmet (not both)")
    if not unmet and (rule is not None or limit is not None):
        raise click.UsageError("--rule and --limit go with --unmet")
    try:
        parsed = [parse_key(k) for k in keys]
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="KEY") from None
    out, errors, code = _remote(
        explain_command,
        address,
        parsed,
        list(keys),
        unmet=unmet,
        rule=rule,
        limit=limit or 10,
        fmt=fmt,
        timeout=timeout,
    )
    click.echo(out, nl=False)
    for line in errors:
        click.echo(f"amm-rules: {line}", err=True)
    sys.exit(code)


def _duration(ctx: click.Context | None, param: click.Parameter | None, value: str) -> float:
    from amm_rules.language.fields import UnitError, parse_duration

    try:
        seconds = parse_duration(value)
    except UnitError as exc:
        raise click.BadParameter(str(exc)) from None
    if seconds <= 0:
        raise click.BadParameter(f"must be more than 0 s, got {value!r}")
    return seconds


@main.command()
@click.argument("workers", nargs=-1, metavar="WORKER...")
@_scheduler_option
@click.option(
    "--deadline",
    default="60s",
    show_default=True,
    callback=_duration,
    help="When the workers must be gone (a duration: 120s, 2 min).",
)
@click.option(
    "--close", is_flag=True, help="Close each worker once its keys are safe, or at the deadline."
)
@_format_option
@_timeout_option
def drain(
    workers: tuple[str, ...],
    address: str | None,
    deadline: float,
    close: bool,
    fmt: str,
    timeout: float,
) -> None:
    """Move what WORKERs hold before a deadline, most valuable first.

    WORKER is an address or a worker's name. The workers stop receiving tasks; their
    keys are copied where their rules allow, a rule's replicate minimum first, then
    the keys whose recompute costs most per byte, then the rest, at the transfer rate
    the workers show. What cannot leave in time is said at once, and the prediction is
    updated as the drain goes. With --close, each worker is closed once its keys are
    safe, or at the deadline. Exit status: 0 when every key was safe, 1 when keys were
    not (or the scheduler cannot be reached, or runs no amm-rules engine), 2 for usage
    errors.
    """
    from amm_rules.cli.remote import drain_command

    if not workers:
        raise click.UsageError("name at least one WORKER to drain (an address or a name)")
    code = _remote(
        drain_command,
        address,
        list(workers),
        deadline,
        close=close,
        fmt=fmt,
        timeout=timeout,
        echo=click.echo,
    )
    sys.exit(code)
