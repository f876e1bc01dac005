"""The public surface as a user's typed code uses it: mypy must accept this file.

CI runs mypy on it with the project's settings, and ``tests/typing/test_types.py``
checks it together with a misuse that mypy must refuse (so that the check can fail).
Nothing here runs: pytest does not collect it (no ``test_`` prefix) and the functions
are only checked.
"""

from __future__ import annotations

from typing import Any

import dask
from distributed import Client, Future

import amm_rules
from amm_rules import (
    Diagnostic,
    PausedWorkersSettings,
    Pool,
    RebalanceSettings,
    Rule,
    RulesError,
    Ruleset,
    RulesPolicy,
    Target,
    annotate,
    drain,
    explain,
    load_ruleset,
    memory_flow,
    replicate,
    status,
)
from amm_rules.language.ruleset import Actions, Position


def rules_from_a_file(path: str) -> tuple[list[str], list[Pool], RebalanceSettings]:
    ruleset: Ruleset = load_ruleset(path)
    names = [rule.name for rule in ruleset.rules]
    pools = list(ruleset.pools.values())
    return names, pools, ruleset.rebalance


def rules_inline() -> Ruleset:
    return load_ruleset(
        {
            "version": 1,
            "pools": {"gpu": "worker.resources.GPU >= 1"},
            "rules": [{"name": "precious", "match": 'task.prefix == "x"', "replicate": 3}],
        },
        filename="inline",
    )


def what_is_wrong(path: str) -> list[str]:
    try:
        load_ruleset(path)
    except RulesError as err:
        first: Diagnostic = err.errors[0]
        return [f"{first.file}:{first.line}:{first.column}: {first.message}"] + [
            d.code for d in err.diagnostics
        ]
    return []


def records_by_hand() -> tuple[Target, Actions, Diagnostic, Position]:
    """The records a user builds: positional and keyword arguments, defaults."""
    exact = Target(3, 3)
    bounded = Target(min=2, max="all")
    assert Target.exact(2).bounds(eligible=5) == (2, 2) and bounded.follows_cluster
    actions = Actions(replicate=exact, pool=("gpu",), spread="host")
    fields: tuple[str, ...] = actions.set_fields()
    assert fields
    diagnostic = Diagnostic("rules.yaml", 4, 7, "warning", "unused pool", code="unused-pool")
    assert not diagnostic.is_error
    pause = PausedWorkersSettings(after=60.0, action="retire")
    assert pause.max_concurrent == 1
    return exact, actions, diagnostic, Position(line=1, column=2)


def a_rule(rule: Rule) -> str:
    target = rule.actions.replicate
    at = rule.position
    where = f"{at.line}:{at.column}" if at is not None else "?"
    return f"{rule.name} ({rule.match_source}) at {where}: {target}"


def the_policy(path: str) -> RulesPolicy:
    policy = RulesPolicy(path, reload=False, inflight_timeout=30.0, audit_interval=None)
    in_force: Ruleset = policy.ruleset
    assert in_force.source
    return policy


def the_policy_by_config(path: str) -> None:
    dask.config.set(
        {
            "distributed.scheduler.active-memory-manager.policies": [
                {"class": "amm_rules.RulesPolicy", "rules": path}
            ]
        }
    )


def on_a_client(client: Client, x: Any, futures: list[Future]) -> dict[str, Any]:
    with annotate(replicate=4, pool="gpu"):
        x = client.persist(x)
    with amm_rules.annotate(replicate={"min": 2, "max": "all"}) as fields:
        assert fields["replicate"]
    answer = replicate(futures, n=3, client=client)
    replicate(futures, n={"min": 2, "max": "all"})
    replicate(futures, n=None)
    why = explain(futures, client=client)
    report = status(client)
    flow = memory_flow()
    drained = drain(["tcp://10.0.0.5:40123"], deadline="25s", close=True, client=client)
    drain("worker-3", deadline=60)
    return {"answer": answer, "why": why, "report": report, "flow": flow, "drained": drained}
