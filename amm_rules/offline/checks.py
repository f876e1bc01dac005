"""Warnings that need a cluster: ``amm-rules validate RULES --dump FILE``.

``validate`` alone says whether a rules file is well-formed; with a cluster dump it can
also say what that cluster cannot give the rules. Each check reads the rules (a
:class:`~amm_rules.language.ruleset.Ruleset`) and the dump's workers, with pool
membership computed as the engine computes it
(:class:`~amm_rules.engine.state.placement.Placements`) and the workers a rule may use
counted by the engine's decider table (:mod:`amm_rules.engine.decide.deciders`), and
reports a positioned warning
through the rules file's own :class:`~amm_rules.language.locator.Locator`:
``min-exceeds-eligible``, ``empty-pool``, ``spread-one-host``, ``matches-no-key`` and
``shadowed-in-cluster``, each explained in docs/rules.md ("Warnings that need a
cluster"); the last two are live status's ``idle`` and ``shadowed``, said alike.

Warnings, not errors: the cluster of a dump is one moment of one cluster, and the same
file may serve others.
"""

from __future__ import annotations

from typing import Any

from amm_rules.engine.decide.deciders import eligible as placeable
from amm_rules.engine.decide.shadows import shadow_words
from amm_rules.engine.decide.view import WorkerView
from amm_rules.engine.sections.activity import census_of, rule_matches
from amm_rules.engine.words import counted
from amm_rules.language.diagnostics import Diagnostic, sort_key
from amm_rules.language.expr.parser import parse
from amm_rules.language.loader import CheckResult
from amm_rules.language.locator import Locator
from amm_rules.language.near_miss import Census, near_misses
from amm_rules.language.ruleset import Rule, Ruleset
from amm_rules.offline.dump import ClusterState
from amm_rules.offline.simulate import Simulation

_NONE: frozenset[str] = frozenset()


def cluster_warnings(result: CheckResult, state: ClusterState, measure: str) -> list[Diagnostic]:
    """The warnings of one checked rules file against a cluster (none if it has errors)."""
    ruleset = result.ruleset
    if ruleset is None:
        return []
    where = _locator(result)
    # The engine itself on the dump, before any cycle: its pools, and what each rule takes.
    sim = Simulation.of(ruleset, state, measure=measure)
    pools = sim.initial_pools
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
    _unused_rules(ruleset, sim, where, index, cluster)
    return sorted(where.diagnostics, key=sort_key)


def _unused_rules(
    ruleset: Ruleset, sim: Simulation, where: Locator, index: dict[Any, int], cluster: str
) -> None:
    """``matches-no-key`` and ``shadowed-in-cluster``: rules that match none of the keys
    in memory of the dump, and rules that match some but decide none of their fields
    (something earlier in the cascade does), as live status calls them ``idle`` and
    ``shadowed``: the dump's keys classified by the engine itself (a simulation of
    the dump, before any cycle)."""
    tasks = list(sim.cluster.in_memory())
    if not tasks:
        return
    usage = rule_matches(sim.ctx, ruleset.rules, tasks)
    census: Census | None = None
    n = len(tasks)
    for rule in ruleset.rules:
        at = ("rules", index.get(rule.name, 0), "match")
        shadow = usage[rule.name]
        if shadow.shadowed:
            where.add(
                at,
                f"{shadow_words(shadow)}, in {cluster}: the rule decides nothing there",
                "shadowed-in-cluster",
                severity="warning",
            )
            continue
        if shadow.matched:
            continue
        if census is None:
            census = census_of(tasks, sampled=False)
        hints = near_misses(parse(rule.match_source), census)
        message = f"the match is false for every key in memory in {cluster} ({counted(n, 'key')})"
        where.add(at, "; ".join([message, *hints]), "matches-no-key", severity="warning")


def _locator(result: CheckResult) -> Locator:
    from amm_rules.language.yaml_source import read_yaml

    source = None
    if result.text is not None:
        source, _ = read_yaml(result.text)
    return Locator(result.file, source.data if source is not None else {}, source)


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
