"""Action fields (``replicate``, ``pool``, ``avoid``, ``spread``, ``move``): their
checking and conversion, shared by rules files and ``amm`` annotations.

The rules file is checked structurally by the JSON Schema first (see
:mod:`amm_rules.schema`); annotations arrive as arbitrary Python values from a client.
Both end here, so that a field means exactly the same thing wherever it is written.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from amm_rules.ruleset import ACTION_FIELDS, Actions, Target

#: Upper bound on any replication target; larger numbers are almost certainly mistakes
#: and would only ever be "unmet".
MAX_REPLICAS = 10_000
#: Pool names: identifiers, with ``-`` allowed after the first character.
POOL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")
SPREAD_VALUES = ("host", "none")
MOVE_VALUES = ("allowed", "never")


class ActionError(ValueError):
    """An invalid action field. ``field`` names it (``replicate``, ``replicate.min``...)."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")


def _count(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        else:
            raise ActionError(field, f"expected a whole number of copies, got {value!r}")
    if value < 1:
        raise ActionError(field, f"must be at least 1 (the AMM never drops the last copy), got {value}")
    if value > MAX_REPLICAS:
        raise ActionError(field, f"must be at most {MAX_REPLICAS}, got {value}")
    return value


def parse_target(value: Any, field: str = "replicate") -> Target:
    """``3`` → ``Target(3, 3)``; ``{"min": 2, "max": 5}`` → ``Target(2, 5)``."""
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in ("min", "max"))
        if unknown:
            raise ActionError(field, f"unknown key {unknown[0]!r}; expected 'min' and/or 'max'")
        if not value:
            raise ActionError(field, "expected at least one of 'min' and 'max'")
        lo = _count(value["min"], f"{field}.min") if "min" in value else 1
        hi = _count(value["max"], f"{field}.max") if "max" in value else None
        if hi is not None and hi < lo:
            raise ActionError(field, f"max ({hi}) is below min ({lo})")
        return Target(lo, hi)
    return Target.exact(_count(value, field))


def parse_pools(value: Any, field: str, known: Collection[str] | None) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names:
        raise ActionError(field, f"expected a pool name or a non-empty list of them, got {value!r}")
    out: list[str] = []
    for name in names:
        if not isinstance(name, str) or not POOL_NAME.match(name):
            raise ActionError(field, f"{name!r} is not a pool name")
        if known is not None and name not in known:
            raise ActionError(field, unknown_pool_message(name, known))
        if name not in out:
            out.append(name)
    return tuple(out)


def unknown_pool_message(name: str, known: Collection[str]) -> str:
    from amm_rules.suggest import did_you_mean

    if not known:
        return f"unknown pool {name!r}: no pools are defined"
    return f"unknown pool {name!r}{did_you_mean(name, known)}"


def _choice(value: Any, field: str, allowed: tuple[str, ...]) -> Any:
    if value not in allowed or not isinstance(value, str):
        expected = " or ".join(repr(a) for a in allowed)
        raise ActionError(field, f"expected {expected}, got {value!r}")
    return value


def parse_actions(value: Any, known_pools: Collection[str] | None = None) -> Actions:
    """Check and convert a mapping of action fields.

    ``known_pools`` is the set of pool names that may be named; ``None`` skips that
    check (a client checking an annotation does not know the scheduler's pools).
    Raises :class:`ActionError` for the first problem found.
    """
    if not isinstance(value, Mapping):
        raise ActionError("amm", f"expected a mapping of action fields, got {type(value).__name__}")
    for key in value:
        if key not in ACTION_FIELDS:
            from amm_rules.suggest import did_you_mean

            raise ActionError(str(key), f"unknown action field{did_you_mean(str(key), ACTION_FIELDS)}; "
                              f"expected one of {', '.join(ACTION_FIELDS)}")
    if not value:
        raise ActionError("amm", f"expected at least one of {', '.join(ACTION_FIELDS)}")
    return Actions(
        replicate=parse_target(value["replicate"]) if "replicate" in value else None,
        pool=parse_pools(value["pool"], "pool", known_pools) if "pool" in value else None,
        avoid=parse_pools(value["avoid"], "avoid", known_pools) if "avoid" in value else None,
        spread=_choice(value["spread"], "spread", SPREAD_VALUES) if "spread" in value else None,
        move=_choice(value["move"], "move", MOVE_VALUES) if "move" in value else None,
    )
