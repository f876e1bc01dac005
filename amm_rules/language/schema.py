"""The JSON Schema (draft 2020-12) of a rules file, version 1.

One schema serves three readers: editors (through ``amm-rules schema`` and the
``# yaml-language-server: $schema=`` line), :mod:`amm_rules.language.schema_check` (which
validates with it and rewrites jsonschema's errors for humans), and the docs. Titles
and descriptions are written for the editor's hover text. ``errorMessage`` is a
non-standard keyword that some editors show and that :mod:`amm_rules.language.schema_check`
uses for pattern failures; validators ignore it.

The schema checks shape only. Meaning (expressions, pool names, units, duplicate
rule names) is checked by :mod:`amm_rules.language.build`.
"""

from __future__ import annotations

from typing import Any

from amm_rules.language.expr.attributes import ATTRIBUTES, Context
from amm_rules.language.fields import (
    ENFORCEMENT_VALUES,
    MAX_REPLICAS,
    MOVE_VALUES,
    POOL_NAME,
    SPILL_VALUES,
    SPREAD_VALUES,
)
from amm_rules.language.ruleset import (
    ACTION_FIELDS,
    ALL,
    DEFAULT_PRODUCERS,
    LEGACY_REPLICATE_VALUES,
    MAX_CONCURRENT,
    MAX_PROTECT_COPIES,
    MAX_REBALANCE_SECONDS,
    MAX_SATURATION,
    MEASURES,
    PAUSED_ACTIONS,
    SPILL_ORDERS,
)

_POOL_NAME = {
    "type": "string",
    "pattern": POOL_NAME.pattern,
    "errorMessage": "a pool name is ASCII letters, digits, '_' and '-', starting with a letter or "
    "'_' (at most 64 characters)",
}
_COUNT = {"title": "a number of copies", "type": "integer", "minimum": 1, "maximum": MAX_REPLICAS}
#: ``all``: one copy on every eligible worker, following the workers as they come and go.
_ALL = {
    "title": "'all'",
    "type": "string",
    "pattern": f"^{ALL}$",
    "errorMessage": "expected a number of copies, 'all' (every eligible worker) or a mapping "
    "with 'min' and/or 'max'",
}
_BOUND = {"oneOf": [_COUNT, {**_ALL, "errorMessage": "expected a number of copies or 'all'"}]}
_PERCENT = {
    "title": "percentage or fraction",
    "oneOf": [
        {
            "title": "a percentage like '30%'",
            "type": "string",
            "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*%\s*$",
            "errorMessage": "expected a percentage like '30%'",
        },
        {"title": "a fraction from 0 to 1", "type": "number", "minimum": 0, "maximum": 1},
    ],
}
_SIZE = {
    "title": "size",
    "oneOf": [
        {
            "title": "a size like '512 MiB'",
            "type": "string",
            "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*[A-Za-z]*\s*$",
            "errorMessage": "expected a size like '512 MiB' (units: B, kB, MB, GB, TB, KiB, "
            "MiB, GiB, TiB)",
        },
        {"title": "a number of bytes", "type": "integer", "minimum": 1},
    ],
}
_RATE = {
    "title": "rate",
    "oneOf": [
        {
            "title": "a rate like '1 MiB/s'",
            "type": "string",
            "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*[A-Za-z]*\s*/\s*s\s*$",
            "errorMessage": "expected a rate like '1 MiB/s' (units: B, kB, MB, GB, TB, KiB, "
            "MiB, GiB, TiB)",
        },
        {"title": "a number of bytes per second", "type": "integer", "minimum": 1},
    ],
}
_DURATION_TEXT = {
    "title": "a duration like '30s'",
    "type": "string",
    # No sign: a negative duration is a shape an editor can flag. The unit is checked
    # by amm_rules.language.build, which can suggest the nearest one.
    "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*[A-Za-z]*\s*$",
    "errorMessage": "expected a duration like '30s' or '500ms' (units: ms, s, m, min, h; "
    "never negative)",
}


_ENABLED = {
    "description": "Defaults to true when the section is present.",
    "type": "boolean",
    "default": True,
}


def _duration(*, positive: bool) -> dict[str, Any]:
    """A duration: text with a unit, or a number of seconds; at most one day, and more
    than 0 when ``positive`` (else 0 or more)."""
    seconds: dict[str, Any] = {"title": "a number of seconds", "type": "number"}
    seconds["exclusiveMinimum" if positive else "minimum"] = 0
    seconds["maximum"] = MAX_REBALANCE_SECONDS
    return {"title": "duration", "oneOf": [_DURATION_TEXT, seconds]}


#: The action fields, shared by rules (and documented for ``amm`` annotations).
ACTION_PROPERTIES: dict[str, Any] = {
    "replicate": {
        "title": "replication target",
        "description": "How many copies of each matching key to keep: a number (exact "
        "target), 'all' (one copy on every eligible worker, following workers as they join "
        "and leave) or {min, max}, where either bound may be 'all'. Without max, extra "
        "copies are never trimmed.",
        "oneOf": [
            _COUNT,
            _ALL,
            {
                "title": "a mapping with 'min' and/or 'max'",
                "type": "object",
                "properties": {
                    "min": {"description": "Add copies while there are fewer.", **_BOUND},
                    "max": {"description": "Drop copies while there are more.", **_BOUND},
                },
                "additionalProperties": False,
                "minProperties": 1,
            },
        ],
    },
    "pool": {
        "title": "allowed pools",
        "description": "Keep replicas only on workers of these pools (a name or a list).",
        "$ref": "#/$defs/poolNames",
    },
    "avoid": {
        "title": "avoided pools",
        "description": "Never keep replicas on workers of these pools (a name or a list).",
        "$ref": "#/$defs/poolNames",
    },
    "spread": {
        "title": "spread",
        "description": "'host': put replicas on distinct hosts where possible.",
        "enum": list(SPREAD_VALUES),
    },
    "move": {
        "title": "move",
        "description": "'never': amm-rules never copies, drops or rebalances the key.",
        "enum": list(MOVE_VALUES),
        "default": "allowed",
    },
    "spill": {
        "title": "spill",
        "description": "Where the key goes in its workers' order of eviction: 'last' "
        "(kept in memory while anything else can go: a lookup table) or 'first' (given up "
        "before the rest: bulky data cheap to read back). See docs/spill.md.",
        "enum": list(SPILL_VALUES),
    },
}


def _enforcement(what: str, default: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "title": "enforcement",
        "description": f"'dry-run': {what} is classified, planned and reported (status, "
        "explain, events) but makes no copy and drops none. See docs/rules.md.",
        "enum": list(ENFORCEMENT_VALUES),
    }
    if default is not None:
        out["default"] = default
    return out


def _attributes(context: Context) -> str:
    """The attributes of an expression context, for hover text: ``task.key, ...``."""
    return ", ".join(spec.display for spec in ATTRIBUTES[context].values())


_TASK_EXPRESSION = {
    "title": "task expression",
    "description": 'Which keys the rule applies to, e.g. task.prefix == "stage1" or '
    f"task.prefix_net_per_task > 64 MiB. Attributes: {_attributes('task')}. "
    "See docs/expressions.md.",
    "type": ["string", "boolean"],
}
_PRODUCERS_EXPRESSION = {
    "title": "producers",
    "description": "Which task prefixes are memory producers, held back under pressure; "
    "reads task.prefix and the task.prefix_* memory-flow attributes only. See "
    "docs/memory-flow.md.",
    "type": ["string", "boolean"],
    "default": DEFAULT_PRODUCERS,
}
_WORKER_EXPRESSION = {
    "title": "worker expression",
    "description": "Which workers belong to the pool, e.g. worker.resources.GPU >= 1. "
    f"Attributes: {_attributes('worker')}. See docs/expressions.md.",
    "type": ["string", "boolean"],
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "amm-rules rules file",
    "description": "Where in-memory Dask data should live and how many copies it should "
    "have. See docs/rules.md.",
    "type": "object",
    "required": ["version"],
    "additionalProperties": False,
    "properties": {
        "version": {
            "title": "format version",
            "description": "Version of the rules file format; only 1 exists.",
            "const": 1,
        },
        "pools": {
            "title": "pools",
            "description": "Named sets of workers, each given by a worker expression.",
            "type": "object",
            "propertyNames": _POOL_NAME,
            "additionalProperties": _WORKER_EXPRESSION,
        },
        "rules": {
            "title": "rules",
            "description": "For each key and each action field, the first matching rule "
            "that sets the field decides it.",
            "type": "array",
            "items": {"$ref": "#/$defs/rule"},
        },
        "rebalance": {"$ref": "#/$defs/rebalance"},
        "paused-workers": {"$ref": "#/$defs/pausedWorkers"},
        "enforcement": _enforcement("everything the file decides", "enforce"),
        "memory-pressure": {"$ref": "#/$defs/memoryPressure"},
        "reduce-replicas": {
            "title": "reduce replicas",
            "description": "Keys without a replication target keep one copy.",
            "type": "boolean",
            "default": True,
        },
        "legacy-replicate": {
            "title": "legacy replicate",
            "description": "What distributed's Client.replicate and "
            "Client.scatter(..., broadcast=...) do. 'honour': they set a lasting "
            "replication target (scatter broadcast: every worker, following the cluster). "
            "'ignore': as with the stock Active Memory Manager, their extra copies are "
            "trimmed at the next cycle.",
            "enum": list(LEGACY_REPLICATE_VALUES),
            "default": "honour",
        },
        "demand": {"$ref": "#/$defs/demand"},
        "protect": {"$ref": "#/$defs/protect"},
        "spill": {"$ref": "#/$defs/spill"},
        "adaptive": {"$ref": "#/$defs/adaptive"},
        "reload-settle": {
            "title": "reload settle",
            "description": "A rules file changed in place (the same file written again) "
            "is reloaded only once it has stayed unchanged this long, so that a file "
            "half-written is never installed; a file replaced by a rename or a "
            "Kubernetes ConfigMap update is complete and is reloaded at once. At most one "
            "day; 0 reloads at the first change seen. Read from the rules in force.",
            "default": "2s",
            **_duration(positive=False),
        },
    },
    "$defs": {
        "poolNames": {
            "oneOf": [
                {"title": "a pool name", **_POOL_NAME},
                {
                    "title": "a list of pool names",
                    "type": "array",
                    "items": _POOL_NAME,
                    "minItems": 1,
                    "uniqueItems": True,
                },
            ],
        },
        "rule": {
            "title": "rule",
            "type": "object",
            "required": ["name", "match"],
            "properties": {
                "name": {
                    "title": "rule name",
                    "description": "Unique name, shown in diagnostics and explanations.",
                    "type": "string",
                    "maxLength": 100,
                    "pattern": r"^\S(.*\S)?$",
                    "errorMessage": "a rule name is one line without leading or trailing spaces",
                },
                "match": _TASK_EXPRESSION,
                **ACTION_PROPERTIES,
                "enforcement": _enforcement("this rule (default: the file's enforcement)", None),
            },
            "additionalProperties": False,
            "anyOf": [{"required": [name]} for name in ACTION_FIELDS],
        },
        "protect": {
            "title": "protect",
            "description": "Extra copies of the keys whose loss would cost most recompute "
            "per byte, chosen greedily within a memory budget (see docs/rules.md).",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "budget": {
                    "title": "budget",
                    "description": "Memory for protection's extra copies: a percentage of "
                    "the cluster's memory limit, or a size. Never exceeded by them.",
                    "default": "10%",
                    # Text or a number: which of a percentage and a size is meant is
                    # told by amm_rules.language.build, which can say what to write.
                    "type": ["string", "number"],
                    "examples": ["10%", "4 GiB"],
                },
                "min-recompute": {
                    "description": "Keys whose recompute estimate is below this are never "
                    "protected. At most one day.",
                    "default": "30s",
                    **_duration(positive=False),
                },
                "copies": {
                    "description": "Copies a protected key holds.",
                    "type": "integer",
                    "minimum": 2,
                    "maximum": MAX_PROTECT_COPIES,
                    "default": 2,
                },
                "spread": {
                    "description": "'host': protected copies on distinct hosts where "
                    "possible; 'none': on any workers.",
                    "enum": list(SPREAD_VALUES),
                    "default": "host",
                },
                "match": {
                    **_TASK_EXPRESSION,
                    "description": "Only keys this matches are candidates (default: all), "
                    "e.g. task.prefix == 'load'.",
                },
            },
        },
        "spill": {
            "title": "spill",
            "description": "What each worker keeps in memory when it must write data to "
            "disk: chosen by value per byte rather than by age (see docs/spill.md).",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "order": {
                    "description": "'value': workers give up the key of lowest value per "
                    "byte first (what the engine knows: tasks about to read it, copies "
                    "elsewhere, costs measured on the worker, the rules' 'spill'); "
                    "'lru': least recently used first, as stock Dask does.",
                    "enum": list(SPILL_ORDERS),
                    "default": "value",
                },
                "drop-copies": {
                    "description": "A worker near its memory target drops copies that "
                    "other workers hold too (through the Active Memory Manager, never "
                    "below a rule's min, a protected copy or the last copy) rather "
                    "than writing them to disk.",
                    "type": "boolean",
                    "default": False,
                },
                "prefetch": {
                    "description": "A key on disk that a task queued on its worker reads "
                    "is read back ahead while the worker is below its memory target.",
                    "type": "boolean",
                    "default": False,
                },
            },
        },
        "adaptive": {
            "title": "adaptive",
            "description": "What adaptive scaling sees (LocalCluster.adapt, dask-kubernetes, "
            "dask-jobqueue: every deployment asks the scheduler's adaptive_target and "
            "workers_to_close): memory, and the rules. Off unless the file has the section. "
            "See docs/adaptive.md.",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "memory": {
                    "description": "The target counts memory: at least the workers that hold "
                    "the data (in memory, on disk, and what the tasks still to run are "
                    "expected to produce) under the headroom; more while workers write to "
                    "disk or read back faster than disk-rate, or while producers are held "
                    "back. Never fewer than distributed's own target.",
                    "type": "boolean",
                    "default": True,
                },
                "headroom": {
                    "description": "Share of each worker's memory limit kept free of managed "
                    "data. Below 100%.",
                    "default": "60%",
                    **_PERCENT,
                },
                "hold-rules": {
                    "description": "Scale-down never closes a worker whose leaving would put "
                    "a key below its rule's min, empty a pool a rule needs, or leave "
                    "spread: host keys on one host; it closes first the workers whose data "
                    "is cheapest to move.",
                    "type": "boolean",
                    "default": True,
                },
                "disk-rate": {
                    "description": "The target rises by a worker while the workers together "
                    "write to disk or read back faster than this.",
                    "default": "1 MiB/s",
                    **_RATE,
                },
                "balance": {
                    "description": "While adaptive scaling runs and the file's rebalance is "
                    "off, a worker holding more managed data than the headroom leaves "
                    "sends keys to a worker holding less: the workers the target adds take "
                    "data from the full ones.",
                    "type": "boolean",
                    "default": True,
                },
            },
        },
        "demand": {
            "title": "demand",
            "description": "Copies kept while dependents read them: the default trimming "
            "(reduce-replicas) spares a key's copy on a worker where a dependent read it "
            "within 'hold'.",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "hold": {
                    "description": "How long a copy is kept after a dependent last read it "
                    "on its worker (0: not at all, the stock behaviour). At most one day.",
                    "default": "0s",
                    **_duration(positive=False),
                },
                "match": {
                    **_TASK_EXPRESSION,
                    "description": "Which keys the hold applies to (default: all), e.g. "
                    "task.reads >= 100.",
                },
            },
        },
        "rebalance": {
            "title": "rebalance",
            "description": "Move keys from workers with much memory to workers with little.",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "enabled": _ENABLED,
                "measure": {
                    "description": "Which memory measure decides senders and recipients.",
                    "enum": list(MEASURES),
                    "default": "optimistic",
                },
                "sender-min": {
                    "description": "Workers above this fraction of their memory limit may send.",
                    "default": "30%",
                    **_PERCENT,
                },
                "recipient-max": {
                    "description": "Workers below this fraction of their memory limit may "
                    "receive.",
                    "default": "60%",
                    **_PERCENT,
                },
                "gap": {
                    "description": "Smallest difference from the mean that makes a worker a "
                    "sender or a recipient.",
                    "default": "10%",
                    **_PERCENT,
                },
                "max-bytes-per-cycle": {
                    "description": "Most bytes moved per AMM cycle.",
                    "default": "512 MiB",
                    **_SIZE,
                },
                "match": {
                    **_TASK_EXPRESSION,
                    "description": "Which keys may be moved (default: all).",
                },
                "enforcement": _enforcement("rebalancing (default: the file's enforcement)", None),
                "cool-down": {
                    "description": "A key whose move finished or was abandoned is not "
                    "moved again for this long (0: no cool-down). At most one day.",
                    "default": "60s",
                    **_duration(positive=False),
                },
                "copy-timeout": {
                    "description": "A move whose copy has not landed by then is abandoned; "
                    "the sender keeps its copy. At most one day.",
                    "default": "30s",
                    **_duration(positive=True),
                },
                "drop-timeout": {
                    "description": "A move whose sender copy could not be dropped by then "
                    "(after the copy landed) is abandoned; the key keeps an extra copy. At "
                    "most one day.",
                    "default": "30s",
                    **_duration(positive=True),
                },
            },
        },
        "pausedWorkers": {
            "title": "paused workers",
            "description": "What to do with a worker that stays paused (memory above its "
            "pause threshold): copy its keys away by the rules, then restart or retire it, "
            "or only report. See docs/paused-workers.md.",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "after": {
                    "description": "How long a worker must stay paused, continuously, "
                    "before anything happens. More than 0, at most one day.",
                    "default": "5m",
                    **_duration(positive=True),
                },
                "action": {
                    "description": "restart: through the worker's nanny (a worker without "
                    "one is retired); retire: retire it; report: events and metrics only.",
                    "enum": list(PAUSED_ACTIONS),
                    "default": "restart",
                },
                "require-unmanaged": {
                    "description": "Act only when the worker's unmanaged memory (not Dask's "
                    "data) is at least this share of its memory limit.",
                    "default": "50%",
                    **_PERCENT,
                },
                "max-concurrent": {
                    "description": "Workers handled at once.",
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_CONCURRENT,
                    "default": 1,
                },
                "max-paused-fraction": {
                    "description": "When more of the cluster's workers than this are paused, "
                    "only report.",
                    "default": "25%",
                    **_PERCENT,
                },
                "cool-down": {
                    "description": "A worker restarted or retired (by its name) is left alone "
                    "this long (0: no cool-down). At most one day.",
                    "default": "15m",
                    **_duration(positive=False),
                },
                "max-bytes-per-cycle": {
                    "description": "Most bytes copied off paused workers per AMM cycle.",
                    "default": "512 MiB",
                    **_SIZE,
                },
            },
        },
        "memoryPressure": {
            "title": "memory pressure",
            "description": "Hold back memory producers while workers are above a share of "
            "their memory limit with transfers in flight, by lowering the scheduler's "
            "worker-saturation (the depth of its queue of root-ish tasks). See "
            "docs/memory-flow.md.",
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "enabled": _ENABLED,
                "measure": {
                    "description": "Which memory measure is compared with the thresholds.",
                    "enum": list(MEASURES),
                    "default": "process",
                },
                "threshold": {
                    "description": "A worker at or above this share of its memory limit is "
                    "under pressure.",
                    "default": "60%",
                    **_PERCENT,
                },
                "require-transfers": {
                    "description": "Count a worker as under pressure only while it sends or "
                    "receives data (as its last heartbeat said).",
                    "type": "boolean",
                    "default": True,
                },
                "release": {
                    "description": "Holding ends once no worker is at or above this share "
                    "of its memory limit; below threshold.",
                    "default": "50%",
                    **_PERCENT,
                },
                "saturation": {
                    "description": "worker-saturation while holding: each worker is sent "
                    "queued tasks while it has fewer than max(1, ceil(saturation x threads)) "
                    "processing.",
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": MAX_SATURATION,
                    "default": 0.5,
                },
                "producers": _PRODUCERS_EXPRESSION,
                "check-interval": {
                    "description": "How often the workers are looked at. More than 0, at "
                    "most one day.",
                    "default": "500ms",
                    **_duration(positive=True),
                },
                "min-hold": {
                    "description": "Hold at least this long once started. At most one day.",
                    "default": "2s",
                    **_duration(positive=False),
                },
                "max-hold": {
                    "description": "Hold at most this long in one go, then cool down. More "
                    "than 0, at most one day.",
                    "default": "60s",
                    **_duration(positive=True),
                },
                "cool-down": {
                    "description": "After a hold that reached max-hold, do not hold again "
                    "for this long. At most one day.",
                    "default": "30s",
                    **_duration(positive=False),
                },
            },
        },
    },
}
