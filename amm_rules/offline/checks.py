"""Warnings that need a cluster: ``amm-rules validate RULES --dump FILE``.

``validate`` alone says whether a rules file is well-formed; with a cluster dump it can
also say what that cluster cannot give the rules. Each check reads the rules (a
:class:`~amm_rules.language.ruleset.Ruleset`) and the dump's workers, with pool
membership computed as the engine computes it
(:class:`~amm_rules.engine.state.placement.Placements`) and the workers a rule may use
counted by the engine's decider table (:mod:`amm_rules.engine.decide.deciders`), and
reports a positioned warning
through the rules file's own :class:`~amm_rules.language.locator.Locator`:

``min-exceeds-eligible``
    A rule's ``replicate`` minimum is above the number of workers its own ``pool`` and
    ``avoid`` leave (retiring workers do not count): its keys would stay below target.
``empty-pool``
    A pool no worker of the cluster is in.
``spread-one-host``
    A rule says ``spread: host`` but the workers it may use are all on one host.
``matches-no-key``
    A rule's match is false for every key in memory of the dump (the dump holds some),
    with near-miss hints (:mod:`amm_rules.language.near_miss`): a type, prefix, span or
    resource named otherwise than the data is.

Warnings, not errors: the cluster of a dump is one moment of one cluster, and the same
file may serve others.
"""

from __future__ import annotations

from typing import Any

from amm_rules.engine.decide.deciders import eligible as placeable
from amm_rules.engine.decide.view import WorkerView, key_string
from amm_rules.engine.words import counted
from amm_rules.language.diagnostics import Diagnostic, sort_key
from amm_rules.language.loader import CheckResult
from amm_rules.language.locator import Locator
from amm_rules.language.near_miss import Census, near_misses
from amm_rules.language.ruleset import Rule, Ruleset, TaskFacts
from amm_rules.offline.dump import ClusterState

_NONE: frozenset[str] = frozenset()


def cluster_warnings(result: CheckResult, state: ClusterState, measure: str) -> list[Diagnostic]:
    """The warnings of one checked rules file against a cluster (none if it has errors)."""
    ruleset = result.ruleset
    if ruleset is None:
        return []
    where = _locator(result)
    pools = _pools(ruleset, state, measure)
    workers = [
        WorkerView(a, w.host, "closing" if _closing(w.status) else "running", pools.get(a, _NONE))
        for a, w in state.workers.items()
    ]
    hosts = {a: w.host for a, w in state.workers.items()}
    cluster = f"the cluster of {state.source}"
    for name in ruleset.pools:
        if not any(name in p for p in pools.values()):
            where.add(
                ("pools", name),
                f"pool '{name}' has no worker in {cluster} ({counted(len(state.workers), 'worker')})",
                "empty-pool",
                severity="warning",
                at_key=True,
            )
    data_rules = where.data.get("rules") if isinstance(where.data, dict) else None
    index = {
        item.get("name"): i for i, item in enumerate(data_rules or []) if isinstance(item, dict)
    }
    for rule in ruleset.rules:
        eligible = sorted(placeable(rule.actions, workers))
        path: tuple[Any, ...] = ("rules", index.get(rule.name, 0))
        target = rule.actions.replicate
        # A minimum of `all` is every eligible worker: never more than there are.
        if target is not None and isinstance(target.min, int) and target.min > len(eligible):
            field = "replicate.min" if target.max != target.min else "replicate"
            scope = _scope(rule)
            have = (
                f"only {counted(len(eligible), 'worker')} {scope} in {cluster}"
                if scope
                else f"{cluster} has {counted(len(eligible), 'worker')}"
            )
            where.add(
                (*path, *field.split(".")),
                f"{field}: wants {counted(target.min, 'copy')}, but {have}: its keys would stay "
                "below target",
                "min-exceeds-eligible",
                severity="warning",
            )
        if rule.actions.spread == "host":
            on = sorted({hosts[a] for a in eligible})
            if len(on) <= 1:
                where_on = f"on one host ({on[0]})" if on else "on no host"
                where.add(
                    (*path, "spread"),
                    f"spread: host, but the workers it may use in {cluster} are all {where_on}",
                    "spread-one-host",
                    severity="warning",
                )
    _matches_nothing(ruleset, state, where, index, cluster)
    return sorted(where.diagnostics, key=sort_key)


def _matches_nothing(
    ruleset: Ruleset, state: ClusterState, where: Locator, index: dict[Any, int], cluster: str
) -> None:
    """``matches-no-key``: rules whose match no key in memory of the dump satisfies."""
    from amm_rules.language.expr.parser import parse

    tasks = [t for t in state.tasks.values() if t.state == "memory"]
    if not tasks:
        return
    facts = [_facts(t, state) for t in tasks]
    census: Census | None = None
    for rule in ruleset.rules:
        if any(_matches(rule, f) for f in facts):
            continue
        if census is None:
            census = Census()
            for t, f in zip(tasks, facts, strict=True):
                census.add(t.type, t.prefix, f.span, t.resources, t.annotations)
        hints = near_misses(parse(rule.match_source), census)
        n = len(tasks)
        message = f"the match is false for every key in memory in {cluster} ({counted(n, 'key')})"
        where.add(
            ("rules", index.get(rule.name, 0), "match"),
            "; ".join([message, *hints]),
            "matches-no-key",
            severity="warning",
        )


def _matches(rule: Rule, facts: TaskFacts) -> bool:
    try:
        return bool(rule.match(facts))
    except Exception:  # (never for the documented facts)
        return False


def _facts(record: Any, state: ClusterState) -> TaskFacts:
    """What a match sees of a recorded key (its span read from its ``span`` annotation,
    done when none of the span's tasks was to run)."""
    from amm_rules.engine.adapters import span_path

    span = span_path(record)
    return TaskFacts(
        key=key_string(record.key),
        prefix=record.prefix,
        group=record.group,
        type=record.type,
        nbytes=record.nbytes,
        replicas=len(record.who_has),
        waiters=len(record.waiters),
        annotations=record.annotations,
        resources=record.resources,
        span=span,
    )


def _locator(result: CheckResult) -> Locator:
    from amm_rules.language.yaml_source import read_yaml

    source = None
    if result.text is not None:
        source, _ = read_yaml(result.text)
    return Locator(result.file, source.data if source is not None else {}, source)


def _pools(ruleset: Ruleset, state: ClusterState, measure: str) -> dict[str, frozenset[str]]:
    from amm_rules.engine.state.placement import Placements
    from amm_rules.offline.sim_cluster import SimCluster

    cluster = SimCluster(state)
    placements = Placements(lambda pool, exc: None)
    placements.attach(cluster.workers)
    placements.configure(ruleset)
    placements.refresh(measure, True)
    return dict(placements.pools)


def _scope(rule: Rule) -> str:
    """``in pool gpu and outside spot`` (empty when the rule places nothing)."""
    parts = []
    if rule.actions.pool is not None:
        parts.append(f"in pool {','.join(rule.actions.pool)}")
    if rule.actions.avoid is not None:
        parts.append(f"outside {','.join(rule.actions.avoid)}")
    return " and ".join(parts)


def _closing(status: str) -> bool:
    return status not in ("running", "paused")
