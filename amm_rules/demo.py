"""``amm-rules demo``: a local cluster obeying a rules file, shown before and after.

Starts four in-process workers (two of them with ``resources={"GPU": 1}``) and a
scheduler whose Active Memory Manager runs :class:`amm_rules.RulesPolicy` with the
demo rules (``examples/rules/demo.yaml``, or the copy shipped in the package) or the
file given with ``--rules``. The workload follows the file
(:mod:`amm_rules.demo_workload`): for each rule, keys it matches, put where the rule
does not want them; a rule the demo cannot make a key for is named, with what it would
need. Then the AMM works and the demo prints what changed: a table per rule (keys,
copies wanted and held, placement), a table per worker (keys, managed bytes, pools),
what ``move: never`` kept, and the engine's own ``explain`` answer for one key.

The tables are computed on the client from the rules file (the language half:
:meth:`Ruleset.resolve` and the pool expressions) and from where the scheduler says
the data is, so the demo's verdict is an independent check of what the engine did.
The command line (:mod:`amm_rules.cli`) calls :func:`main`.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import click
import dask

from amm_rules.demo_workload import (
    KEY_NBYTES,
    MAX_NBYTES,
    Workload,
    available_kinds,
    key_facts,
    plan,
    type_name,
    workers_for,
)
from amm_rules.engine.decide.deciders import count_copies, eligible
from amm_rules.engine.decide.view import WorkerView
from amm_rules.engine.words import columns, counted, plural, size
from amm_rules.language.diagnostics import RulesError
from amm_rules.language.loader import load_ruleset
from amm_rules.language.ruleset import UNGOVERNED, Desired, Ruleset, TaskFacts, WorkerFacts

__all__ = ["default_rules_path", "main", "recommended_rules_path", "suggestion"]

#: How often the demo looks at the cluster while the AMM works.
POLL_INTERVAL = 0.25
#: The AMM interval used by the demo (the default, 2 s, would make the demo slow).
AMM_INTERVAL = "500ms"


def _shipped(name: str) -> Path:
    """``examples/rules/NAME`` in a source checkout, else the copy the wheel ships as
    ``amm_rules/data/NAME`` (the build maps the one file to the other)."""
    checkout = Path(__file__).resolve().parent.parent / "examples" / "rules" / name
    if checkout.is_file():
        return checkout
    return Path(str(resources.files("amm_rules") / "data" / name))


def default_rules_path() -> Path:
    """The demo's rules: ``demo.yaml`` of the checkout's examples, or of the wheel."""
    return _shipped("demo.yaml")


def recommended_rules_path() -> Path:
    """``recommended.yaml`` of the checkout's examples, or of the wheel: the sections
    that measured best on the seed's workloads (docs/performance.md), for a user who
    writes no rules."""
    return _shipped("recommended.yaml")


def suggestion(path: Path | None = None) -> list[str]:
    """What the demo suggests once it ran its own rules: the recommended file, the
    sections it turns on, and how to use it."""
    path = recommended_rules_path() if path is None else path
    try:
        ruleset = load_ruleset(path)
    except (OSError, RulesError):
        return []
    sections = ruleset.sections_on
    turned_on = ", ".join(sections) if sections else "no section"
    return [
        "No rules of your own yet? The recommended file turns on what measured best on",
        f"the workloads of docs/performance.md ({turned_on}): {path}",
        "Deploy it as `rules:` of amm_rules.RulesPolicy, or try it here:",
        f"  amm-rules demo --rules {path}",
    ]


def main(
    rules: str | Path | None = None,
    *,
    workers: int = 4,
    duration: float = 30.0,
) -> int:
    """Run the demo; return 0 if every target was met within ``duration`` seconds, else 1.

    ``rules`` is a rules file (default: the demo rules). Half of the ``workers`` (at
    least one) have a ``GPU`` resource.
    """
    path = Path(rules) if rules is not None else default_rules_path()
    try:
        ruleset = load_ruleset(path)
    except RulesError as err:
        click.echo(f"amm-rules demo: the rules file cannot be used:\n{err}", err=True)
        return 1
    except OSError as err:
        click.echo(f"amm-rules demo: cannot read {path}: {err}", err=True)
        return 1

    from distributed import Client

    with _demo_cluster(path, workers) as cluster, Client(cluster) as client:
        client.wait_for_workers(workers)
        hosts = {w["host"] for w in client.scheduler_info()["workers"].values()}
        click.echo(
            f"amm-rules demo: {counted(workers, 'worker')} on {counted(len(hosts), 'host')}, "
            f"rules from {path}"
        )
        if len(hosts) < workers:
            click.echo("  (workers share a host here: 'spread: host' falls back to any worker)")
        for pool in ruleset.pools.values():
            click.echo(f"  pool {pool.name}: {pool.source}")

        from distributed.utils import key_split_group

        workload = plan(ruleset, group_of=key_split_group)
        _print_workload(workload)
        futures, facts = _workload(client, ruleset, workload)
        before = _snapshot(client, ruleset, futures, facts)
        click.echo("\nBefore the Active Memory Manager runs:\n")
        _print_tables(before)

        click.echo(f"\nActive Memory Manager running every {AMM_INTERVAL}:")
        client.amm.start()
        after = _wait_for_targets(client, ruleset, futures, facts, duration)

        click.echo("\nAfter:\n")
        _print_tables(after)
        _print_move_never(before, after, workload, ruleset)
        _print_explain(client, after, futures, workload)
        if after.all_ok:
            click.echo("\nEvery target is met.")
            if rules is None:
                click.echo("\n" + "\n".join(suggestion()))
            return 0
        click.echo("\nSome targets are not met:", err=True)
        for line in _explain_unmet(client, after, futures):
            click.echo(f"  {line}", err=True)
        return 1


# ----------------------------------------------------------------------------------
# The cluster


def _loopback_hosts(n: int) -> list[str]:
    """Distinct loopback addresses if this system routes 127.0.0.0/8 (Linux does),
    so that each worker is on its own "host" and ``spread: host`` has room to act."""
    hosts = [f"127.0.0.{i + 1}" for i in range(n)]
    for host in hosts[1:]:
        try:
            with socket.socket() as sock:
                sock.bind((host, 0))
        except OSError:
            return ["127.0.0.1"] * n
    return hosts


@contextmanager
def _demo_cluster(rules: Path, n_workers: int) -> Iterator[Any]:
    from distributed import Scheduler, SpecCluster, Worker

    n_gpu = max(1, n_workers // 2)
    hosts = _loopback_hosts(n_workers)
    workers = {
        f"{'gpu' if i < n_gpu else 'cpu'}-{i}": {
            "cls": Worker,
            "options": {
                "host": hosts[i],
                "nthreads": 1,
                "memory_limit": "1 GiB",
                "resources": {"GPU": 1} if i < n_gpu else {},
            },
        }
        for i in range(n_workers)
    }
    scheduler = {
        "cls": Scheduler,
        "options": {"host": hosts[0], "port": 0, "dashboard": False, "protocol": "tcp"},
    }
    # The scheduler reads its AMM settings when it starts, in this process. The AMM
    # starts stopped so that the demo can show the cluster before it acts.
    config = {
        "distributed.scheduler.active-memory-manager.start": False,
        "distributed.scheduler.active-memory-manager.interval": AMM_INTERVAL,
        "distributed.scheduler.active-memory-manager.policies": [
            {"class": "amm_rules.RulesPolicy", "rules": str(rules)}
        ],
    }
    with (
        dask.config.set(config),
        SpecCluster(
            workers=workers, scheduler=scheduler, silence_logs=logging.ERROR, name="amm-rules-demo"
        ) as cluster,
    ):
        yield cluster


def _make(kind: str, nbytes: int, seed: int) -> Any:
    """A value of ``kind`` (see :data:`amm_rules.demo_workload.KINDS`) of about ``nbytes``."""
    if kind == "numpy":
        import numpy as np

        return np.full(nbytes, seed % 256, dtype="uint8")
    if kind == "pandas":
        import numpy as np
        import pandas as pd

        return pd.DataFrame({"x": np.full(max(1, nbytes // 8), seed, dtype="int64")})
    return bytes([seed % 256]) * nbytes


def _print_workload(workload: Workload) -> None:
    """What the demo makes for each rule, and which rules it cannot make a key for."""
    for spec in workload.specs:
        extra = f", annotated {dict(spec.annotations)}" if spec.annotations else ""
        click.echo(
            f"  rule {spec.rule}: {counted(spec.count, 'key')} {spec.prefix}-N, "
            f"{type_name(spec.kind)} of {size(spec.nbytes)}{extra}"
        )
    for rule, missing in workload.missing.items():
        modules = [module for module, _ in missing]
        verb = "is" if len(modules) == 1 else "are"
        click.echo(
            f"  rule {rule}: no key: {' and '.join(modules)} {verb} not installed, and its "
            f"keys would be {' or '.join(t for _, t in missing)} "
            f"(pip install {' '.join(modules)})"
        )
    unmatched = [r for r in workload.unmatched if r not in workload.missing]
    if unmatched:
        names = ", ".join(unmatched)
        click.echo(
            f"  rules the demo makes no key for: {names}. Its keys are named after the "
            "strings in a rule's match (task.prefix, task.key, task.group), hold "
            f"{' or '.join(type_name(k) for k in available_kinds())} of up to "
            f"{size(MAX_NBYTES)} and carry the "
            "annotations the match reads; a match on other types (cupy, cudf, ...) or on "
            "larger sizes needs a real workload."
        )


def _workload(
    client: Any, ruleset: Ruleset, workload: Workload
) -> tuple[list[Any], dict[str, TaskFacts]]:
    """Make the keys of ``workload``, each where its rule does not want it, plus keys
    no rule governs copied to every worker (``reduce-replicas`` trims them). Returns the
    futures and each key's facts as the rules see them."""
    from distributed import wait

    info = client.scheduler_info()["workers"]
    order = sorted(info, key=lambda a: str(info[a].get("name", a)))
    pools = _pools(ruleset, info)
    futures: list[Any] = []
    facts: dict[str, TaskFacts] = {}
    two_copies: list[Any] = []
    for spec in workload.specs:
        where = workers_for(spec, pools, order)
        made = _submit(
            client, spec.prefix, spec.kind, spec.nbytes, spec.count, where, facts, spec.annotations
        )
        futures += made
        if spec.placement == "two-workers":
            two_copies += made
    broadcast = []
    if workload.scratch is not None:
        broadcast = _submit(client, workload.scratch, "bytes", KEY_NBYTES, 3, order[:1], facts, {})
        futures += broadcast
    wait(futures)
    # Extra copies are made by tasks that read the keys elsewhere, as a computation
    # makes them (client.replicate would set a runtime target instead).
    readers = [
        client.submit(len, f, workers=[w], allow_other_workers=False, pure=False)
        for made, where in ((two_copies, order[:2]), (broadcast, order))
        for f in made
        for w in where
    ]
    wait(readers)
    return futures, facts


def _submit(
    client: Any,
    prefix: str,
    kind: str,
    nbytes: int,
    count: int,
    where: Sequence[str],
    facts: dict[str, TaskFacts],
    annotations: Mapping[str, Any],
) -> list[Any]:
    from distributed.utils import key_split_group

    out = []
    with dask.annotate(**annotations):
        for i in range(count):
            key = f"{prefix}-{i}"
            out.append(
                client.submit(
                    _make,
                    kind,
                    nbytes,
                    i,
                    key=key,
                    workers=[where[i % len(where)]],
                    allow_other_workers=False,
                    pure=False,
                )
            )
            facts[key] = key_facts(key, type_name(kind), nbytes, annotations, key_split_group)
    return out


# ----------------------------------------------------------------------------------
# What the rules want, and what the cluster holds


@dataclass
class KeyRow:
    key: str
    desired: Desired
    holders: tuple[str, ...]
    #: The number of copies is within the target.
    copies_ok: bool
    #: Every copy is on a worker the rules allow (and on distinct hosts if spread).
    placement_ok: bool
    nbytes: int
    #: Nothing more can be done: the target is met, or held as far as the eligible
    #: workers allow (the engine reports the rest as unmet).
    settled: bool


@dataclass
class RuleRow:
    rule: str
    wanted: str
    keys: list[KeyRow] = field(default_factory=list)


@dataclass
class WorkerRow:
    address: str
    name: str
    host: str
    pools: tuple[str, ...]
    keys: int
    managed: int


@dataclass
class Snapshot:
    rules: list[RuleRow]
    workers: list[WorkerRow]
    keys: list[KeyRow]

    @property
    def all_ok(self) -> bool:
        return all(k.copies_ok and k.placement_ok for k in self.keys)

    @property
    def settled(self) -> bool:
        return all(k.settled and k.placement_ok for k in self.keys)

    @property
    def summary(self) -> str:
        ok = sum(k.copies_ok and k.placement_ok for k in self.keys)
        copies = sum(len(k.holders) for k in self.keys)
        return (
            f"{ok}/{counted(len(self.keys), 'key')} where the rules want them, "
            f"{counted(copies, 'copy')} held"
        )


def _worker_facts(address: str, info: Mapping[str, Any]) -> WorkerFacts:
    memory_limit = info.get("memory_limit") or 0
    memory = info.get("metrics", {}).get("managed_bytes", 0)
    return WorkerFacts(
        address=address,
        name=str(info.get("name", "")),
        host=info.get("host", ""),
        resources=dict(info.get("resources", {})),
        memory_limit=memory_limit,
        nthreads=info.get("nthreads", 1),
        memory=memory,
        memory_fraction=memory / memory_limit if memory_limit else 0.0,
    )


def _pools(ruleset: Ruleset, info: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Each worker's pools, by address, from the scheduler's view of the workers."""
    facts = {a: _worker_facts(a, w) for a, w in info.items()}
    return {
        a: tuple(name for name, pool in ruleset.pools.items() if pool.predicate(f))
        for a, f in facts.items()
    }


def _snapshot(
    client: Any, ruleset: Ruleset, futures: list[Any], made: Mapping[str, TaskFacts]
) -> Snapshot:
    info = client.scheduler_info()["workers"]
    facts = {a: _worker_facts(a, w) for a, w in info.items()}
    pools = _pools(ruleset, info)
    keys = [f.key for f in futures]
    who_has = client.who_has(futures)
    nbytes = client.nbytes(keys, summary=False)

    states = []
    for key in keys:
        holders = tuple(who_has.get(key, ()))
        task = replace(made[str(key)], nbytes=nbytes.get(key, 0), replicas=len(holders))
        desired = ruleset.resolve(task)
        copies_ok, settled, placement_ok = _judge(desired, holders, pools, facts, ruleset)
        states.append(
            KeyRow(str(key), desired, holders, copies_ok, placement_ok, task.nbytes, settled)
        )

    workers = [
        WorkerRow(
            address=a,
            name=str(info[a].get("name", "")),
            host=facts[a].host,
            pools=pools[a],
            keys=sum(a in s.holders for s in states),
            managed=sum(s.nbytes for s in states if a in s.holders),
        )
        for a in sorted(info, key=lambda a: str(info[a].get("name", a)))
    ]
    return Snapshot(_rule_rows(ruleset, states), workers, states)


def _judge(
    desired: Desired,
    holders: tuple[str, ...],
    pools: Mapping[str, tuple[str, ...]],
    facts: Mapping[str, WorkerFacts],
    ruleset: Ruleset,
) -> tuple[bool, bool, bool]:
    """Is the number of copies right (and if not, can it get better), and are the
    copies in the right places? Counted as the engine counts them
    (:mod:`amm_rules.engine.decide.deciders`)."""
    if desired.move == "never":
        # amm-rules leaves the key alone: whatever it holds is what the rules want.
        return True, True, True
    workers = [
        WorkerView(a, facts[a].host if a in facts else "", "running", frozenset(p))
        for a, p in pools.items()
    ]
    placeable = eligible(desired, workers)
    count = count_copies(desired, holders, placeable, 0, ruleset.reduce_replicas)
    held = len(holders)
    within = count.hi is None or held <= count.hi
    copies_ok = count.lo <= held and within
    # A target larger than the eligible workers is held as far as it can be.
    settled = min(count.lo, max(1, count.eligible)) <= held and within
    placement_ok = not placeable or not count.misplaced
    if desired.spread == "host" and placement_ok:
        hosts = {facts[h].host for h in holders if h in facts}
        eligible_hosts = {facts[a].host for a in placeable}
        placement_ok = len(hosts) >= min(held, len(eligible_hosts))
    return copies_ok, settled, placement_ok


def _rule_rows(ruleset: Ruleset, states: list[KeyRow]) -> list[RuleRow]:
    """One row per rule that decides a field of some key, in file order, then the
    keys no rule governs. A key counts for every rule that decided one of its fields."""
    rows = []
    for rule in ruleset.rules:
        row = RuleRow(rule.name, _describe(rule.actions))
        row.keys = [
            s for s in states if any(r.rule == rule.name for r in s.desired.reasons.values())
        ]
        rows.append(row)
    rest = [s for s in states if s.desired is UNGOVERNED or not s.desired.governed]
    if rest:
        wanted = "1 (reduce-replicas)" if ruleset.reduce_replicas else "any"
        rows.append(RuleRow("(no rule)", wanted, rest))
    return rows


def _describe(actions: Any) -> str:
    parts = []
    if actions.replicate is not None:
        target = actions.replicate
        one = target.min == target.max == 1
        parts.append(f"{target} {plural(1 if one else 2, 'copy')}")
    if actions.pool is not None:
        parts.append(f"in {','.join(actions.pool)}")
    if actions.avoid is not None:
        parts.append(f"not in {','.join(actions.avoid)}")
    if actions.spread == "host":
        parts.append("spread over hosts")
    if actions.move == "never":
        parts.append("never moved")
    return ", ".join(parts) or "-"


def _wait_for_targets(
    client: Any,
    ruleset: Ruleset,
    futures: list[Any],
    made: Mapping[str, TaskFacts],
    duration: float,
) -> Snapshot:
    """Poll until every key is where the rules want it (or as close as the cluster
    allows), printing each change."""
    start = time.monotonic()
    snapshot = _snapshot(client, ruleset, futures, made)
    last = ""
    while True:
        elapsed = time.monotonic() - start
        if snapshot.summary != last:
            last = snapshot.summary
            click.echo(f"  {elapsed:5.1f} s  {last}")
        if snapshot.settled or elapsed >= duration:
            return snapshot
        time.sleep(POLL_INTERVAL)
        snapshot = _snapshot(client, ruleset, futures, made)


# ----------------------------------------------------------------------------------
# Output


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], right: Iterable[int] = ()
) -> str:
    """A plain-text table; columns listed in ``right`` are right-aligned (numbers)."""
    cells = [list(map(str, headers)), *([str(c) for c in row] for row in rows)]
    return "\n".join(columns(cells, set(right), ruled=True))


def _count_range(values: list[int]) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _print_tables(snapshot: Snapshot) -> None:
    click.echo(
        _table(
            ("rule", "wants", "keys", "copies per key", "copies ok", "placement ok"),
            (
                (
                    r.rule,
                    r.wanted,
                    len(r.keys),
                    _count_range([len(k.holders) for k in r.keys]),
                    f"{sum(k.copies_ok for k in r.keys)}/{len(r.keys)}",
                    f"{sum(k.placement_ok for k in r.keys)}/{len(r.keys)}",
                )
                for r in snapshot.rules
            ),
            right=(2, 3, 4, 5),
        )
    )
    click.echo()
    click.echo(
        _table(
            ("worker", "host", "pools", "keys", "managed"),
            (
                (w.name, w.host, ",".join(w.pools) or "-", w.keys, size(w.managed))
                for w in snapshot.workers
            ),
            right=(3, 4),
        )
    )


def _explain_unmet(client: Any, snapshot: Snapshot, futures: list[Any]) -> list[str]:
    """The engine's own account of up to five keys that are not where they should be."""
    from amm_rules.client import explain

    unmet = {k.key for k in snapshot.keys if not (k.copies_ok and k.placement_ok)}
    chosen = [f for f in futures if str(f.key) in unmet][:5]
    try:
        answer = explain(chosen, client=client)
    except Exception as err:  # the demo must end cleanly even if explain fails
        return [f"(explain failed: {err})"]
    lines = []
    for f in chosen:
        why = answer.get(str(f.key), {})
        reason = why.get("unmet") or "no reason given"
        lines.append(
            f"{f.key}: on {counted(len(why.get('holders', [])), 'worker')}, wants "
            f"{why.get('desired', '?')}; engine says: {reason}"
        )
    return lines


def _print_move_never(
    before: Snapshot, after: Snapshot, workload: Workload, ruleset: Ruleset
) -> None:
    """What ``move: never`` kept: the copies its keys were given, which the AMM would
    otherwise have changed."""
    kept = [s for s in workload.specs if s.desired.move == "never"]
    if not kept:
        return
    copies_before = {k.key: len(k.holders) for k in before.keys}
    for spec in kept:
        keys = [k for k in after.keys if k.key.startswith(f"{spec.prefix}-")]
        held = [(copies_before.get(k.key, 0), len(k.holders)) for k in keys]
        same = sum(b == a for b, a in held)
        copies = _count_range([a for _, a in held])
        trimmed = (
            "reduce-replicas would have trimmed them to 1, as it did the keys no rule governs"
            if ruleset.reduce_replicas
            else "nothing else would have changed them here (reduce-replicas is off)"
        )
        click.echo(
            f"\nmove: never (rule {spec.rule}): {same}/{counted(len(keys), 'key')} kept the "
            f"{copies} {plural(2 if copies != '1' else 1, 'copy')} they were given; without it, "
            f"{trimmed}."
        )


def _print_explain(client: Any, after: Snapshot, futures: list[Any], workload: Workload) -> None:
    """The engine's own answer (``amm_rules.explain``) for one key of the first rule
    that placed or copied something."""
    spec = next((s for s in workload.specs if s.desired.move != "never"), None)
    if spec is None:
        return
    from amm_rules.client import explain

    future = next(f for f in futures if str(f.key) == f"{spec.prefix}-0")
    try:
        answer = explain([future], client=client)[str(future.key)]
    except Exception as err:  # the demo must end cleanly even if explain fails
        click.echo(f"\n(explain failed: {err})")
        return
    names = {w.address: w.name for w in after.workers}
    click.echo(f"\nWhy is {future.key} where it is? amm_rules.explain answers:")
    click.echo(f"  desired: {answer.get('desired')}")
    holders = ", ".join(names.get(h, h) for h in answer.get("holders", []))
    click.echo(f"  held by: {holders}")
    for address, why in sorted(
        answer.get("workers", {}).items(), key=lambda w: names.get(w[0], w[0])
    ):
        click.echo(f"  {names.get(address, address)}: {why}")
    if answer.get("unmet"):
        click.echo(f"  unmet: {answer['unmet']}")
