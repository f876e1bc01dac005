"""amm-rules: declarative rules for Dask's Active Memory Manager.

The package has two halves. The language half (loading, schema, expressions,
diagnostics, ``amm-rules validate``) imports nothing from ``distributed`` so that
validating a rules file is fast and works where no cluster exists. The scheduler
half (:class:`RulesPolicy` and its planner, annotations and runtime helpers) is
imported lazily, on first access of one of its names. Importing changes nothing in a
scheduler: a :class:`RulesPolicy` turns on what makes it seen (status, explain,
metrics, cluster dumps: :mod:`amm_rules.observe.extension`) when it attaches.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from amm_rules.language.diagnostics import Diagnostic, RulesError
from amm_rules.language.loader import load_ruleset
from amm_rules.language.ruleset import (
    PausedWorkersSettings,
    Pool,
    RebalanceSettings,
    Rule,
    Ruleset,
    Target,
)

__version__ = "0.1.0"

#: Names of the scheduler half, resolved on first access (they import distributed).
_LAZY = {
    "RulesPolicy": "amm_rules.engine.policy",
    "annotate": "amm_rules.client",
    "persist": "amm_rules.client",
    "replicate": "amm_rules.client",
    "explain": "amm_rules.client",
    "status": "amm_rules.client",
    "memory_flow": "amm_rules.client",
    "drain": "amm_rules.client",
}

__all__ = [
    "Diagnostic",
    "PausedWorkersSettings",
    "Pool",
    "RebalanceSettings",
    "Rule",
    "Ruleset",
    "RulesError",
    "Target",
    "load_ruleset",
    # lazy, see _LAZY
    "RulesPolicy",
    "annotate",
    "drain",
    "explain",
    "memory_flow",
    "persist",
    "replicate",
    "status",
]

if TYPE_CHECKING:
    from amm_rules.client import (
        annotate,
        drain,
        explain,
        memory_flow,
        persist,
        replicate,
        status,
    )
    from amm_rules.engine.policy import RulesPolicy


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'amm_rules' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
