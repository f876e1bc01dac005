"""Checked data → :class:`~amm_rules.language.ruleset.Ruleset`: the meaning of a rules file.

Runs after the schema check (:mod:`amm_rules.language.schema_check`), which checks
shapes, and skips whatever it already reported, so each problem is told once. Checked
here: expressions (pools in the ``worker`` context, matches in the ``task`` context),
unique rule names, pool names in ``pool``/``avoid``, ``replicate`` bounds, and the units,
bounds and combinations of the sections' fields. Action fields are converted by
:func:`amm_rules.language.fields.parse_actions`, the same function that reads ``amm``
annotations, so a field means the same in both places.

Besides the :class:`Ruleset` (``None`` when there are errors), :func:`build` returns a
:class:`Draft`: what :mod:`amm_rules.language.lint` needs to look for suspicious rules, kept for
every entry that compiled even when other entries did not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import Any, Literal, TypeVar

from amm_rules.language.fields import (
    ActionError,
    UnitError,
    format_fraction,
    parse_actions,
    parse_budget,
    parse_duration,
    parse_fraction,
    parse_rate,
    parse_size,
    parse_target,
    unknown_pool_message,
)
from amm_rules.language.locator import Locator
from amm_rules.language.records import record
from amm_rules.language.ruleset import (
    ACTION_FIELDS,
    DEFAULT_PRODUCERS,
    MAX_REBALANCE_SECONDS,
    PRODUCER_ATTRIBUTES,
    Actions,
    AdaptiveSettings,
    DemandSettings,
    MemoryPressureSettings,
    PausedWorkersSettings,
    Pool,
    Position,
    ProtectSettings,
    RebalanceSettings,
    Rule,
    Ruleset,
    SpillSettings,
)
from amm_rules.language.yaml_source import Path


@record
class RuleDraft:
    """A rule whose match and actions compiled."""

    index: int
    name: str
    match_source: str
    #: True/False when the match folds to a constant, else None.
    constant: bool | None
    actions: Actions


@record
class Draft:
    """What lint looks at: compiled parts of the file, with their constants."""

    #: The file's data (lint warns at a section's field where the file writes it).
    data: dict[str, Any] = field(default_factory=dict)
    #: Pool name → constant value of its expression (None: depends on the worker).
    pools: dict[str, bool | None] = field(default_factory=dict)
    #: The resource names the pools read (``worker.resources.GPU``: ``GPU``).
    resources: set[str] = field(default_factory=set)
    rules: list[RuleDraft] = field(default_factory=list)
    rebalance: RebalanceSettings | None = None
    paused_workers: PausedWorkersSettings | None = None
    spill: SpillSettings | None = None
    adaptive: AdaptiveSettings | None = None


def expression_text(value: Any) -> str | None:
    """The expression a YAML value stands for (``match: true`` is the text ``true``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return value if isinstance(value, str) else None


def build(data: Any, where: Locator, source_name: str) -> tuple[Ruleset | None, Draft]:
    if not isinstance(data, dict):
        return None, Draft()
    draft = Draft(data)
    pools = _pools(data.get("pools"), where, draft)
    rules = _rules(data.get("rules"), where, draft, _pool_names(data), frozenset(draft.resources))
    rebalance, rebalance_depends = _rebalance(data.get("rebalance"), where)
    draft.rebalance = rebalance
    paused = draft.paused_workers = _paused_workers(data.get("paused-workers"), where)
    demand, demand_depends = _demand(data.get("demand"), where)
    pressure = _memory_pressure(data.get("memory-pressure"), where)
    protect = _protect(data.get("protect"), where)
    spill = draft.spill = _spill(data.get("spill"))
    adaptive = draft.adaptive = _adaptive(data.get("adaptive"), where)
    top = _read_section(data, (), where, {"reload-settle": ("reload_settle", _duration)})
    if where.has_errors:
        return None, draft
    # Without errors, the schema vouches for the values of the top-level fields.
    ruleset = Ruleset(
        pools=pools,
        rules=tuple(rules),
        rebalance=rebalance,
        paused_workers=paused,
        memory_pressure=pressure,
        reduce_replicas=data.get("reduce-replicas", True),
        legacy_replicate=data.get("legacy-replicate", "honour"),
        demand=demand,
        demand_depends=demand_depends,
        rebalance_depends=rebalance_depends,
        protect=protect,
        spill=spill,
        adaptive=adaptive,
        source=source_name,
        version=1,
        enforcement=data.get("enforcement", "enforce"),
        **top,
    )
    return ruleset, draft


def _pool_names(data: dict[str, Any]) -> set[str] | None:
    """The pool names rules may use; ``None`` when the ``pools`` section is written but
    is not a mapping: the schema reported that, and "unknown pool" for every name a
    rule uses would only repeat it."""
    pools = data.get("pools")
    if pools is None:
        return set()
    return {str(k) for k in pools} if isinstance(pools, dict) else None


def _compile(
    text: str,
    context: Literal["task", "worker"],
    path: Path,
    where: Locator,
    resources: frozenset[str] = frozenset(),
) -> Any:
    from amm_rules.language.expr import ExpressionError, compile_expression

    try:
        compiled = compile_expression(text, context, resources)
    except ExpressionError as exc:
        where.add_expression(path, exc.problems)
        return None
    if compiled.warnings:
        where.add_expression(path, compiled.warnings, severity="warning")
    return compiled


def _position(where: Locator, path: Path, at_key: bool = False) -> Position | None:
    line, column = where.position(path, at_key)
    return Position(line, column) if line else None


# -- pools --------------------------------------------------------------------------


def _pools(section: Any, where: Locator, draft: Draft) -> dict[str, Pool]:
    out: dict[str, Pool] = {}
    if not isinstance(section, dict):
        return out
    for name, value in section.items():
        path = ("pools", name)
        text = expression_text(value)
        if text is None or where.reported_under(path):
            continue
        compiled = _compile(text, "worker", path, where)
        if compiled is None:
            continue
        draft.pools[str(name)] = compiled.constant
        draft.resources |= compiled.resources
        out[str(name)] = Pool(
            str(name),
            text,
            compiled.predicate,
            _position(where, path, True),
            frozenset(compiled.depends),
        )
    return out


# -- rules --------------------------------------------------------------------------


def _rules(
    section: Any,
    where: Locator,
    draft: Draft,
    known: set[str] | None,
    resources: frozenset[str] = frozenset(),
) -> list[Rule]:
    """The rules; ``resources``: the resource names the pools read (an annotation of
    one of these names is a warning)."""
    out: list[Rule] = []
    if not isinstance(section, list):
        return out
    first_use: dict[str, int] = {}
    for index, item in enumerate(section):
        if not isinstance(item, dict):
            continue
        path: Path = ("rules", index)
        name = item.get("name")
        if isinstance(name, str) and name:
            if name in first_use:
                where.add(
                    (*path, "name"),
                    f"duplicate rule name '{name}'; rule names must be "
                    f"unique (first used on line {first_use[name]})",
                    "duplicate-rule",
                )
            else:
                first_use[name] = where.position((*path, "name"))[0]
        text = expression_text(item.get("match"))
        compiled = None
        if text is not None and not where.reported_under((*path, "match")):
            compiled = _compile(text, "task", (*path, "match"), where, resources)
        actions = _actions(item, path, where, known)
        if compiled is None or actions is None or where.reported_under(path):
            continue
        if not isinstance(name, str) or text is None:
            # Already an error elsewhere: the YAML reader drops an entry whose key it
            # refuses (a tag on the key `name`), and says so at the key.
            continue
        draft.rules.append(RuleDraft(index, name, text, compiled.constant, actions))
        out.append(
            Rule(
                name,
                text,
                compiled.predicate,
                actions,
                frozenset(compiled.depends),
                _position(where, path),
                compiled.conjuncts,
                item.get("enforcement"),
            )
        )
    return out


def _actions(
    item: dict[str, Any], path: Path, where: Locator, known: set[str] | None
) -> Actions | None:
    fields = {f: item[f] for f in ACTION_FIELDS if f in item}
    if not fields:
        return None  # the schema reported "rule has no action"
    ok = True
    if "replicate" in fields and not where.reported_under((*path, "replicate")):
        try:
            parse_target(fields["replicate"])
        except ActionError as exc:
            # "max (2) is below min (5)": the max is what to change.
            at = (
                (*path, "replicate", "max") if "below min" in exc.message else (*path, "replicate")
            )
            where.add(at, str(exc), "bad-value")
            ok = False
    for name in ("pool", "avoid"):
        if name in fields and not where.reported_under((*path, name)):
            ok &= _check_pools(fields[name], (*path, name), where, known)
    if not ok or where.reported_under(path):
        return None
    # The checks above and the schema leave parse_actions nothing to refuse.
    return parse_actions(fields, known_pools=None)


def _check_pools(value: Any, path: Path, where: Locator, known: set[str] | None) -> bool:
    if known is None:
        return True  # the pools section is not a mapping, which is reported already
    if isinstance(value, str):
        items = [(value, path)]
    elif isinstance(value, list):
        items = [(v, (*path, i)) for i, v in enumerate(value)]
    else:
        return True  # a wrong type was reported by the schema check
    ok = True
    for name, at in items:
        if isinstance(name, str) and name not in known:
            where.add(at, f"{path[-1]}: {unknown_pool_message(name, known)}", "unknown-pool")
            ok = False
    return ok


# -- section fields -----------------------------------------------------------------

#: Reads the value of one field at its path: the value the settings take, or None after
#: reporting why it is refused (or when it is of a shape the schema refused already).
Reader = Callable[[Any, Path, Locator], Any]
T = TypeVar("T")


def _read_section(
    section: dict[str, Any],
    at: Path,
    where: Locator,
    table: dict[str, tuple[str, Reader]],
) -> dict[str, Any]:
    """The settings of the section at ``at``: each field of ``table`` (field →
    (attribute, reader)) that is written in it and not reported yet, as read."""
    kwargs: dict[str, Any] = {}
    for key, (attr, read) in table.items():
        if key in section and not where.reported_under((*at, key)):
            value = read(section[key], (*at, key), where)
            if value is not None:
                kwargs[attr] = value
    return kwargs


def _shaped(*types: type) -> Reader:
    """A reader of a field whose shape the schema checks (a boolean is no whole number
    to it): the value, if it is of ``types``."""
    return lambda value, path, where: value if isinstance(value, types) else None


def _number(value: Any, path: Path, where: Locator) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _parsed(parse: Callable[[Any], T], value: Any, path: Path, where: Locator) -> T | None:
    """``parse(value)``, or None after reporting why the value is not one."""
    try:
        return parse(value)
    except UnitError as exc:
        where.add(path, f"{path[-1]}: {exc}", exc.code)
        return None


def _refuse(value: Any, path: Path, where: Locator, bound: str) -> None:
    """Report a value out of bounds: ``KEY: must be BOUND, got VALUE``."""
    shown = value.strip() if isinstance(value, str) else value
    where.add(path, f"{path[-1]}: must be {bound}, got {shown!r}", "bad-value")


def _fraction(value: Any, path: Path, where: Locator) -> float | None:
    return _parsed(parse_fraction, value, path, where)


def _size(value: Any, path: Path, where: Locator) -> int | None:
    """A size in bytes. The schema bounds plain numbers; text is bounded here: ``0.5 B``
    is less than one byte, and a budget of 0 would never let anything move."""
    size = _parsed(parse_size, value, path, where)
    if size is not None and size < 1:
        _refuse(value, path, where, "at least 1 byte")
        return None
    return size


def _duration(value: Any, path: Path, where: Locator, zero: bool = True) -> float | None:
    """A duration in seconds (0 allowed when ``zero``). The schema bounds plain numbers;
    text (``"0s"``, ``"48h"``) is bounded here."""
    seconds = _parsed(parse_duration, value, path, where)
    if seconds == 0 and not zero:
        _refuse(value, path, where, "more than 0 seconds")
    elif seconds is not None and seconds > MAX_REBALANCE_SECONDS:
        _refuse(value, path, where, f"at most {MAX_REBALANCE_SECONDS} seconds (one day)")
    else:
        return seconds
    return None


def _positive_duration(value: Any, path: Path, where: Locator) -> float | None:
    return _duration(value, path, where, zero=False)


def _rate(value: Any, path: Path, where: Locator) -> int | None:
    rate = _parsed(parse_rate, value, path, where)
    if rate is not None and rate < 1:
        _refuse(value, path, where, "at least 1 byte per second")
        return None
    return rate


def _headroom(value: Any, path: Path, where: Locator) -> float | None:
    headroom = _parsed(parse_fraction, value, path, where)
    if headroom is not None and headroom >= 1:
        where.add(
            path,
            f"headroom: must be below 100%, got {format_fraction(headroom)}: no memory would "
            "be left for data",
            "bad-value",
        )
        return None
    return headroom


def _budget(value: Any, path: Path, where: Locator) -> dict[str, Any] | None:
    """``protect``'s budget, as the settings' ``budget_*`` fields."""
    budget = _parsed(parse_budget, value, path, where)
    if budget is None:
        return None
    text = value.strip() if isinstance(value, str) else f"{value} B"
    return {"budget_fraction": budget[0], "budget_bytes": budget[1], "budget_text": text}


def _match(
    section: dict[str, Any], at: Path, where: Locator, kwargs: dict[str, Any]
) -> frozenset[str]:
    """The section's ``match`` into ``kwargs`` (``match_source``, ``match``); the task
    attributes it reads."""
    text = expression_text(section.get("match"))
    if text is None or where.reported_under((*at, "match")):
        return frozenset()
    compiled = _compile(text, "task", (*at, "match"), where)
    if compiled is None:
        return frozenset()
    kwargs["match_source"] = text
    kwargs["match"] = compiled.predicate
    return frozenset(compiled.depends)


# -- sections -----------------------------------------------------------------------

#: A cool-down of 0 means none; a timeout of 0 would abandon every move before its copy
#: could land.
_REBALANCE: dict[str, tuple[str, Reader]] = {
    "sender-min": ("sender_min", _fraction),
    "recipient-max": ("recipient_max", _fraction),
    "gap": ("gap", _fraction),
    "max-bytes-per-cycle": ("max_bytes_per_cycle", _size),
    "cool-down": ("cooldown", _duration),
    "copy-timeout": ("copy_timeout", _positive_duration),
    "drop-timeout": ("drop_timeout", _positive_duration),
}


def _rebalance(section: Any, where: Locator) -> tuple[RebalanceSettings, frozenset[str]]:
    """The ``rebalance:`` section, and the task attributes its match reads."""
    if not isinstance(section, dict):
        return RebalanceSettings(), frozenset()
    kwargs = _read_section(section, ("rebalance",), where, _REBALANCE)
    # Writing the section turns rebalancing on unless it says `enabled: false`.
    kwargs["enabled"] = section.get("enabled", True)
    if isinstance(section.get("measure"), str):
        kwargs["measure"] = section["measure"]
    depends = _match(section, ("rebalance",), where, kwargs)
    kwargs["enforcement"] = section.get("enforcement")
    return RebalanceSettings(**kwargs), depends


def _demand(section: Any, where: Locator) -> tuple[DemandSettings, frozenset[str]]:
    """The ``demand:`` section, and the task attributes its match reads."""
    if not isinstance(section, dict):
        return DemandSettings(), frozenset()
    kwargs = _read_section(section, ("demand",), where, {"hold": ("hold", _duration)})
    depends = _match(section, ("demand",), where, kwargs)
    return DemandSettings(**kwargs), depends


_PROTECT: dict[str, tuple[str, Reader]] = {
    "budget": ("budget", _budget),
    "min-recompute": ("min_recompute", _duration),
    "copies": ("copies", _shaped(int)),
}


def _protect(section: Any, where: Locator) -> ProtectSettings | None:
    """The ``protect:`` section (None when the file has none)."""
    if not isinstance(section, dict):
        return None
    kwargs = _read_section(section, ("protect",), where, _PROTECT)
    kwargs.update(kwargs.pop("budget", {}))
    if section.get("spread") == "none":
        kwargs["spread"] = None  # the default is "host"
    _match(section, ("protect",), where, kwargs)
    return ProtectSettings(**kwargs)


def _spill(section: Any) -> SpillSettings | None:
    """The ``spill:`` section (None when the file has none); the schema checked it."""
    if not isinstance(section, dict):
        return None
    return SpillSettings(
        order=section.get("order", "value"),
        drop_copies=section.get("drop-copies", False),
        prefetch=section.get("prefetch", False),
    )


_ADAPTIVE: dict[str, tuple[str, Reader]] = {
    "memory": ("memory", _shaped(bool)),
    "hold-rules": ("hold_rules", _shaped(bool)),
    "headroom": ("headroom", _headroom),
    "disk-rate": ("disk_rate", _rate),
    "balance": ("balance", _shaped(bool)),
}


def _adaptive(section: Any, where: Locator) -> AdaptiveSettings | None:
    """The ``adaptive:`` section (None when the file has none)."""
    if not isinstance(section, dict):
        return None
    return AdaptiveSettings(**_read_section(section, ("adaptive",), where, _ADAPTIVE))


#: ``after: 0`` would act on every pause, however brief (a worker pauses routinely while
#: it spills); a cool-down of 0 is none.
_PAUSED: dict[str, tuple[str, Reader]] = {
    "action": ("action", _shaped(str)),
    "max-concurrent": ("max_concurrent", _shaped(int)),
    "after": ("after", _positive_duration),
    "cool-down": ("cooldown", _duration),
    "require-unmanaged": ("require_unmanaged", _fraction),
    "max-paused-fraction": ("max_paused_fraction", _fraction),
    "max-bytes-per-cycle": ("max_bytes_per_cycle", _size),
}


def _paused_workers(section: Any, where: Locator) -> PausedWorkersSettings | None:
    """The ``paused-workers`` section (None when the file has none)."""
    if not isinstance(section, dict):
        return None
    return PausedWorkersSettings(**_read_section(section, ("paused-workers",), where, _PAUSED))


#: A check interval of 0 would look at the workers on every turn of the event loop; holds
#: without a bound could hold for ever.
_PRESSURE: dict[str, tuple[str, Reader]] = {
    "enabled": ("enabled", _shaped(bool)),
    "require-transfers": ("require_transfers", _shaped(bool)),
    "measure": ("measure", _shaped(str)),
    "saturation": ("saturation", _number),
    "threshold": ("threshold", _fraction),
    "release": ("release", _fraction),
    "check-interval": ("check_interval", _positive_duration),
    "min-hold": ("min_hold", _duration),
    "max-hold": ("max_hold", _positive_duration),
    "cool-down": ("cooldown", _duration),
}


def _memory_pressure(section: Any, where: Locator) -> MemoryPressureSettings | None:
    """The ``memory-pressure`` section (None when the file has none)."""
    if not isinstance(section, dict):
        return None
    kwargs = _read_section(section, ("memory-pressure",), where, _PRESSURE)
    _producers(section, where, kwargs)
    settings = MemoryPressureSettings(**kwargs)
    _pressure_consistency(section, settings, where)
    return settings


def _producers(section: dict[str, Any], where: Locator, kwargs: dict[str, Any]) -> None:
    """The ``producers`` expression (the default's when absent): a task expression that
    may read only what every task of a prefix shares."""
    path = ("memory-pressure", "producers")
    text = expression_text(section.get("producers", DEFAULT_PRODUCERS))
    if text is None or where.reported_under(path):
        return
    compiled = _compile(text, "task", path, where)
    if compiled is None:
        return
    other = sorted(set(compiled.depends) - PRODUCER_ATTRIBUTES)
    if other:
        names = ", ".join(f"task.{name}" for name in other)
        where.add(
            path,
            f"producers: reads {names}; it may read only task.prefix and the task.prefix_* "
            "memory-flow attributes (a whole prefix is held back, before its tasks run)",
            "wrong-context",
        )
        return
    kwargs["producers_source"] = text
    kwargs["producers"] = compiled.predicate


def _pressure_consistency(
    section: dict[str, Any], settings: MemoryPressureSettings, where: Locator
) -> None:
    """Fields that are valid alone but not together (each pair checked only when both
    fields are valid on their own)."""

    def given(*keys: str) -> bool:
        return any(k in section for k in keys) and not any(
            where.reported_under(("memory-pressure", k)) for k in keys
        )

    if given("release", "threshold") and settings.release >= settings.threshold:
        at = "release" if "release" in section else "threshold"
        where.add(
            ("memory-pressure", at),
            f"{at}: release ({format_fraction(settings.release)}) must be below threshold "
            f"({format_fraction(settings.threshold)}): holding starts above the threshold and "
            "ends below release",
            "bad-value",
        )
    if given("max-hold", "min-hold") and settings.max_hold < settings.min_hold:
        at = "max-hold" if "max-hold" in section else "min-hold"
        where.add(
            ("memory-pressure", at),
            f"{at}: max-hold ({settings.max_hold:g}s) is below min-hold ({settings.min_hold:g}s)",
            "bad-value",
        )
