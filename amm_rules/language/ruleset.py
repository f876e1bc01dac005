"""The compiled, immutable form of a rules file: :class:`Ruleset` and its parts.

:mod:`amm_rules.language.loader` builds a :class:`Ruleset` from YAML (or an inline mapping);
the scheduler half (:mod:`amm_rules.engine.policy`, :mod:`amm_rules.engine.decide.plan`) only reads it.
Nothing here imports ``distributed``.

Matches and pool expressions are compiled callables (see :mod:`amm_rules.language.expr`). They
take a *facts* object: anything with the attributes of :class:`TaskFacts` (for
``match``) or :class:`WorkerFacts` (for pools). The engine adapts scheduler objects
to these; tests can pass plain instances.

How rules combine (the cascade): for each key and each action field, the first rule
in file order that matches the key and sets that field decides it. A per-key ``amm``
annotation overrides the rules field by field, and a runtime target set with
:func:`amm_rules.replicate` overrides ``replicate`` again. Every decided field keeps
its reason, so that "why" can always be answered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from amm_rules.language.records import record

#: The fields a rule (or an ``amm`` annotation) can set, in the order they are reported.
ACTION_FIELDS: tuple[str, ...] = ("replicate", "pool", "avoid", "spread", "move", "spill")

#: Task attributes a ``match`` may read (``annotations`` stands for ``annotations.NAME``).
TASK_ATTRIBUTES: tuple[str, ...] = (
    "key",
    "prefix",
    "group",
    "type",
    "nbytes",
    "replicas",
    "waiters",
    "reads",
    "annotations",
    "resources",
    "span",
    "span_done",
    "prefix_tasks",
    "prefix_produced_per_task",
    "prefix_freed_by_per_task",
    "prefix_net_per_task",
    "recompute_seconds",
)
#: Task attributes that read the memory flow of the key's prefix (what tasks of its
#: kind produced and freed so far, as the engine last published it). They are the same
#: for every key of a prefix at a given moment, and change as its tasks run.
FLOW_ATTRIBUTES: frozenset[str] = frozenset(
    {"prefix_tasks", "prefix_produced_per_task", "prefix_freed_by_per_task", "prefix_net_per_task"}
)
#: Task attributes that change as the key's dependents run (its demand): a match reading
#: one is evaluated again whenever a dependent of the key starts waiting or finishes.
DEMAND_ATTRIBUTES: frozenset[str] = frozenset({"waiters", "reads"})
#: Task attributes that read the state of the key's span (whether its computation is
#: done): the same for every key of a span at a given moment, and changing as it runs.
SPAN_STATE_ATTRIBUTES: frozenset[str] = frozenset({"span_done"})
#: Task attributes whose value is the same for every key of a (prefix, group, type,
#: annotations, resource restriction) class; a match reading only these can be
#: evaluated once per class. The flow and span-state attributes are among them: the
#: engine's classifier reads them with the class. (A task group fixes its span.)
CLASS_ATTRIBUTES: frozenset[str] = (
    frozenset({"prefix", "group", "type", "annotations", "resources", "span"})
    | FLOW_ATTRIBUTES
    | SPAN_STATE_ATTRIBUTES
)
#: Worker attributes a pool expression may read.
WORKER_ATTRIBUTES: tuple[str, ...] = (
    "address",
    "name",
    "host",
    "resources",
    "memory_limit",
    "nthreads",
    "memory",
    "memory_fraction",
)

Predicate = Callable[[Any], bool]

#: The ``enforcement`` value under which rules classify, plan and report, but act not.
DRY_RUN = "dry-run"


@record(frozen=True)
class Position:
    """1-based line and column in the rules file."""

    line: int
    column: int


#: A count of copies that follows the cluster: one copy on every eligible worker.
ALL: Final = "all"
#: A bound of a :class:`Target`: a number of copies, or :data:`ALL`.
Count = int | Literal["all"]


@dataclass(frozen=True)
class Target:
    """A replication target: keep between ``min`` and ``max`` copies.

    ``replicate: 3`` is ``Target(3, 3)``; ``{min: 2}`` is ``Target(2, None)`` (add
    copies below 2, never trim); ``{max: 5}`` is ``Target(1, 5)``. A bound may be
    :data:`ALL`: ``replicate: all`` is ``Target("all", "all")`` (a copy on every
    eligible worker), ``{min: 2, max: all}`` is ``Target(2, "all")``. What ``all``
    stands for is known only on a cluster: :meth:`bounds` turns it into a number.
    """

    min: Count
    max: Count | None

    @classmethod
    def exact(cls, n: Count) -> Target:
        return cls(n, n)

    @property
    def follows_cluster(self) -> bool:
        """True if a bound is ``all``: the target grows and shrinks with the workers."""
        return self.min == ALL or self.max == ALL

    def bounds(self, eligible: int) -> tuple[int, int | None]:
        """``(lo, hi)`` in copies, with ``all`` standing for ``eligible`` workers (at
        least 1: a key keeps its last copy even where no worker is eligible). ``hi``
        is never below ``lo``: ``{min: 3, max: all}`` on two workers wants 3 and trims
        nothing."""
        every = max(1, eligible)
        lo = every if self.min == ALL else self.min
        hi = every if self.max == ALL else self.max
        if hi is not None and hi < lo:
            hi = lo
        return lo, hi

    def __str__(self) -> str:
        if self.max == self.min:
            return str(self.min)
        if self.max is None:
            return f"{{min: {self.min}}}"
        return f"{{min: {self.min}, max: {self.max}}}"


@dataclass(frozen=True)
class TaskFacts:
    """What a ``match`` can see of a key, each attribute as
    :data:`amm_rules.language.expr.attributes.ATTRIBUTES` describes it. The engine uses
    its own adapters with the same attribute names; this class is for tests and tools."""

    key: str
    prefix: str = ""
    group: str = ""
    type: str | None = None
    nbytes: int = 0
    replicas: int = 1
    waiters: int = 0
    reads: int = 0
    annotations: Mapping[str, Any] = field(default_factory=dict)
    resources: Mapping[str, float] = field(default_factory=dict)
    span: str = "default"
    span_done: bool = False
    prefix_tasks: int | None = None
    prefix_produced_per_task: float | None = None
    prefix_freed_by_per_task: float | None = None
    prefix_net_per_task: float | None = None
    recompute_seconds: float | None = None


@dataclass(frozen=True)
class WorkerFacts:
    """What a pool expression can see of a worker (see :class:`TaskFacts`)."""

    address: str
    name: str = ""
    host: str = ""
    resources: Mapping[str, float] = field(default_factory=dict)
    memory_limit: int = 0
    nthreads: int = 1
    memory: int = 0
    memory_fraction: float = 0.0


@record(frozen=True)
class Pool:
    """A named set of workers, given by a worker expression."""

    name: str
    source: str
    predicate: Predicate
    position: Position | None = None
    #: Worker attributes the expression reads (names from :data:`WORKER_ATTRIBUTES`);
    #: the engine re-evaluates pools every cycle only if one reads ``memory*``.
    depends: frozenset[str] = frozenset(WORKER_ATTRIBUTES)

    def __repr__(self) -> str:
        return f"<Pool {self.name!r}: {self.source}>"


@record(frozen=True)
class Actions:
    """Action fields of one rule or annotation; ``None`` means "not set here"."""

    replicate: Target | None = None
    pool: tuple[str, ...] | None = None
    avoid: tuple[str, ...] | None = None
    spread: Literal["host", "none"] | None = None
    move: Literal["allowed", "never"] | None = None
    #: Where the key goes in its worker's order of eviction (the ``spill:`` section):
    #: ``"last"`` kept in memory while anything else can go, ``"first"`` given up first.
    spill: Literal["first", "last"] | None = None

    def __post_init__(self) -> None:
        # The cascade asks every rule for its set fields for every key it resolves:
        # computed once here (the dataclass is frozen, hence object.__setattr__).
        fields = tuple(f for f in ACTION_FIELDS if getattr(self, f) is not None)
        object.__setattr__(self, "_set_fields", fields)

    def set_fields(self) -> tuple[str, ...]:
        """The fields this rule or annotation sets, in :data:`ACTION_FIELDS` order."""
        return self._set_fields  # type: ignore[attr-defined]


@record(frozen=True)
class Rule:
    """One entry of ``rules:``."""

    name: str
    match_source: str
    match: Predicate
    actions: Actions
    #: Task attributes the match reads (names from :data:`TASK_ATTRIBUTES`).
    depends: frozenset[str] = frozenset(TASK_ATTRIBUTES)
    position: Position | None = None
    #: For a match ``a and b and ...``: each operand's predicate and the attributes it
    #: reads (see :attr:`amm_rules.language.expr.CompiledExpression.conjuncts`); else empty.
    conjuncts: tuple[tuple[Predicate, frozenset[str]], ...] = ()
    #: ``"enforce"`` or ``"dry-run"`` as written on the rule; None: the file's.
    enforcement: str | None = None

    def __repr__(self) -> str:
        return f"<Rule {self.name!r}: {self.match_source}>"


#: The memory measures a ``rebalance:`` section may name: attributes of
#: ``distributed.scheduler.MemoryState``, read by the engine for each worker.
MEASURES = ("process", "optimistic", "managed", "managed_total")
#: The measures whose value includes bytes spilled to disk.
MEASURES_WITH_SPILLED = frozenset({"managed_total"})


@record(frozen=True)
class RebalanceSettings:
    """The ``rebalance:`` section. Fractions are of each worker's own memory limit."""

    enabled: bool = False
    measure: str = "optimistic"
    sender_min: float = 0.30
    recipient_max: float = 0.60
    gap: float = 0.10
    max_bytes_per_cycle: int = 512 * 2**20
    match_source: str | None = None
    match: Predicate | None = None
    #: Seconds during which a key whose move finished, was abandoned or was refused is
    #: not moved again (``cool-down``; 0: no cool-down). Keeps a key from bouncing
    #: between workers while the measures catch up with the move.
    cooldown: float = 60.0
    #: Seconds after which a move whose copy has not landed is abandoned
    #: (``copy-timeout``); the sender keeps its copy.
    copy_timeout: float = 30.0
    #: Seconds after the copy landed after which a move whose sender copy could not be
    #: dropped is abandoned (``drop-timeout``); the key keeps an extra copy.
    drop_timeout: float = 30.0
    #: ``"enforce"`` or ``"dry-run"`` as written in the section; None: the file's.
    enforcement: str | None = None


#: Longest timing a rules file may set (in ``rebalance`` and ``paused-workers``), in
#: seconds (one day). Longer is a typo (``60h`` for ``60s``) rather than a wish, and keys
#: or workers cooling down are remembered by the engine for the whole cool-down.
MAX_REBALANCE_SECONDS = 86_400


#: What ``paused-workers`` does with a worker paused for too long.
PAUSED_ACTIONS = ("restart", "retire", "report")
#: Most workers ``paused-workers`` may handle at once (``max-concurrent``).
MAX_CONCURRENT = 1_000


@record(frozen=True)
class PausedWorkersSettings:
    """The ``paused-workers:`` section. Fractions are of each worker's own memory limit,
    or of the cluster's workers (``max_paused_fraction``); durations are in seconds."""

    #: Seconds a worker must stay paused, continuously, before anything happens.
    after: float = 300.0
    #: ``restart`` (through its nanny), ``retire``, or ``report`` (events and metrics only).
    action: str = "restart"
    #: Act only when the worker's unmanaged memory is at least this fraction of its limit.
    require_unmanaged: float = 0.50
    #: Workers handled (copying their keys away, restarting, retiring) at once.
    max_concurrent: int = 1
    #: When more than this fraction of the workers is paused, only report.
    max_paused_fraction: float = 0.25
    #: Seconds during which a worker that was restarted (by its name) is left alone.
    cooldown: float = 900.0
    #: Most bytes copied off paused workers per AMM cycle.
    max_bytes_per_cycle: int = 512 * 2**20


#: The values of the top-level ``legacy-replicate``: what distributed's own
#: ``Client.replicate`` and ``Client.scatter(..., broadcast=...)`` do under amm-rules.
#: ``honour``: they set a lasting runtime target (and make their first copies as
#: before); ``ignore``: they behave as with the stock AMM (their copies are trimmed by
#: reduce-replicas at the next cycle).
LEGACY_REPLICATE_VALUES: tuple[str, ...] = ("honour", "ignore")


@record(frozen=True)
class DemandSettings:
    """The ``demand:`` section: copies kept while dependents read them.

    With ``hold`` above 0, the default trimming (reduce-replicas, for keys without a
    replication target) keeps a key's copy on a worker where a dependent of the key
    finished reading it less than ``hold`` seconds ago, for keys that ``match``
    selects (all keys when None).
    """

    hold: float = 0.0
    match_source: str | None = None
    match: Predicate | None = None

    @property
    def enabled(self) -> bool:
        return self.hold > 0


#: ``spill.order``: by value per byte (the engine's), or least recently used (stock).
SPILL_ORDERS = ("value", "lru")


@record(frozen=True)
class SpillSettings:
    """The ``spill:`` section: what each worker keeps in memory, chosen by value (see
    docs/spill.md)."""

    #: ``"value"``: workers give up the key of lowest value per byte first; ``"lru"``:
    #: the least recently used, as stock does.
    order: str = "value"
    #: A worker near its target drops copies that other workers hold too, through the
    #: AMM, rather than writing them to disk.
    drop_copies: bool = False
    #: Keys on disk that a task of their worker is about to read are read back ahead
    #: while the worker is below its target.
    prefetch: bool = False


@record(frozen=True)
class AdaptiveSettings:
    """The ``adaptive:`` section: what the scheduler's ``adaptive_target`` and
    ``workers_to_close`` see, which every adaptive deployment of Dask asks (see
    docs/adaptive.md)."""

    #: The target counts memory (bytes in memory, on disk and expected from the tasks
    #: still to run), not only CPU.
    memory: bool = True
    #: Share of each worker's memory limit kept free of managed data: the target asks
    #: for enough workers to hold the data below the rest.
    headroom: float = 0.60
    #: Scale-down never breaks a rule's minimum, pool or spread.
    hold_rules: bool = True
    #: Bytes per second the workers write to disk or read back (all together) above
    #: which the target rises by a worker.
    disk_rate: int = 2**20
    #: While adaptive scaling runs, a worker holding more than its share under the
    #: headroom sends keys to one holding less (the workers the target adds take data
    #: from the full ones), when the file's own ``rebalance`` is off: :meth:`balancing`.
    balance: bool = True

    def balancing(self) -> RebalanceSettings:
        """The rebalancing of ``balance``: senders from, and recipients up to, the share
        of the limit the headroom leaves, measured in managed memory; the rest at the
        ``rebalance`` section's defaults."""
        room = 1.0 - self.headroom
        return RebalanceSettings(
            enabled=True, measure="managed", sender_min=room, recipient_max=room
        )


#: The most copies ``protect`` may hold of a key.
MAX_PROTECT_COPIES = 8


@record(frozen=True)
class ProtectSettings:
    """The ``protect:`` section: a memory budget spent on extra copies of the keys whose
    loss would cost most recompute per byte (see docs/rules.md, "protect")."""

    #: The budget: a fraction of the cluster's memory limit (``budget_fraction``), or
    #: a size in bytes (``budget_bytes``); exactly one is set.
    budget_fraction: float | None = 0.10
    budget_bytes: int | None = None
    #: Keys whose recompute estimate is below this (seconds) are never protected.
    min_recompute: float = 30.0
    #: Copies a protected key holds.
    copies: int = 2
    #: ``"host"``: protected copies on distinct hosts where possible; None: anywhere.
    spread: str | None = "host"
    #: Only keys this expression matches are candidates (None: every key).
    match_source: str | None = None
    match: Predicate | None = None
    #: The text of ``budget`` as written, for status and explain.
    budget_text: str = "10%"

    def budget(self, cluster_memory: int) -> int:
        """Bytes the section may spend, for a cluster of ``cluster_memory`` bytes."""
        if self.budget_bytes is not None:
            return self.budget_bytes
        return int((self.budget_fraction or 0.0) * max(cluster_memory, 0))


#: The attributes a ``memory-pressure`` ``producers`` expression may read: what is the
#: same for every task of a prefix (a prefix is held back, never a single key).
PRODUCER_ATTRIBUTES: frozenset[str] = frozenset({"prefix"}) | FLOW_ATTRIBUTES
#: Largest ``saturation`` a ``memory-pressure`` section may set (distributed's default
#: is 1.1; far above it, holding would queue nothing).
MAX_SATURATION = 100.0
#: The ``producers`` expression of a ``memory-pressure`` section that does not set one.
#: Kinds whose tasks add memory, and kinds not measured yet (their first tasks, and any
#: task without dependencies, which frees nothing).
DEFAULT_PRODUCERS = "task.prefix_net_per_task > 0 or not task.prefix_tasks"


@record(frozen=True)
class MemoryPressureSettings:
    """The ``memory-pressure:`` section. Fractions are of each worker's own memory
    limit; durations are in seconds. See docs/memory-flow.md."""

    #: False: the section is written but does nothing (``enabled: false``).
    enabled: bool = True
    #: The memory measure compared with the thresholds (one of :data:`MEASURES`).
    measure: str = "process"
    #: A worker is under pressure at or above this fraction of its memory limit ...
    threshold: float = 0.60
    #: ... while it sends or receives data (``require-transfers``).
    require_transfers: bool = True
    #: Holding ends once no worker is at or above this fraction (hysteresis).
    release: float = 0.50
    #: ``worker-saturation`` while holding: each worker is sent queued (root-ish) tasks
    #: only while it has fewer than max(1, ceil(saturation x threads)) processing.
    saturation: float = 0.5
    #: Which prefixes are producers: held back only while the queue's head holds some.
    producers_source: str = DEFAULT_PRODUCERS
    producers: Predicate | None = None
    #: Seconds between two looks at the workers.
    check_interval: float = 0.5
    #: Hold at least this long once started (hysteresis) ...
    min_hold: float = 2.0
    #: ... and at most this long in one go; then not again for ``cooldown`` seconds.
    max_hold: float = 60.0
    cooldown: float = 30.0


@dataclass(frozen=True)
class Reason:
    """Where a decided field came from."""

    #: ``"rule"``, ``"annotation"``, or the origin of a runtime target (one of
    #: :data:`RUNTIME_ORIGINS`: ``"runtime"``, ``"client.replicate"``,
    #: ``"scatter broadcast"``).
    kind: str
    #: The rule's name, for ``kind == "rule"``.
    rule: str | None = None

    @property
    def who(self) -> str | None:
        """The rule's name for a rule, else the kind (``annotation``, ``runtime``...)."""
        return self.rule if self.kind == "rule" else self.kind

    def __str__(self) -> str:
        if self.kind == "rule":
            return f"rule {self.rule}"
        # "client.replicate", "scatter broadcast": the call itself
        return {"runtime": "runtime target", "annotation": "amm annotation"}.get(
            self.kind, self.kind
        )


#: Where a runtime target can come from: :func:`amm_rules.replicate` (``"runtime"``),
#: distributed's ``Client.replicate``, and ``Client.scatter(..., broadcast=...)``.
RUNTIME_ORIGINS: tuple[str, ...] = ("runtime", "client.replicate", "scatter broadcast")


@dataclass(frozen=True)
class RuntimeTarget:
    """A replication target set at run time on keys in memory, with its origin (one
    of :data:`RUNTIME_ORIGINS`), which explanations and counters name; and, set with
    it by :func:`amm_rules.persist`, other action fields (``pool``, ``avoid``,
    ``spread``, ``move``), which override the ``amm`` annotation and the rules as the
    target overrides ``replicate``. ``target`` is None when only those are set."""

    target: Target | None
    origin: str = "runtime"
    actions: Actions | None = None

    def fields(self) -> dict[str, Any]:
        """The fields it decides, in :data:`ACTION_FIELDS` order."""
        out: dict[str, Any] = {}
        if self.target is not None:
            out["replicate"] = self.target
        if self.actions is not None:
            for name in self.actions.set_fields():
                out.setdefault(name, getattr(self.actions, name))
        return out

    def __str__(self) -> str:
        parts = [f"{name}={_plain(value)}" for name, value in self.fields().items()]
        if self.target is not None and len(parts) == 1:
            return f"{self.target} ({self.origin})"
        return f"{', '.join(parts)} ({self.origin})"


def _plain(value: Any) -> str:
    return ",".join(value) if isinstance(value, tuple) else str(value)


@dataclass(frozen=True)
class Desired:
    """The resolved wishes for one key, each decided field with its reason."""

    replicate: Target | None = None
    pool: tuple[str, ...] | None = None
    avoid: tuple[str, ...] | None = None
    spread: str | None = None
    move: str | None = None
    spill: str | None = None
    reasons: Mapping[str, Reason] = field(default_factory=dict)

    @property
    def governed(self) -> bool:
        """True if anything beyond the defaults applies to the key."""
        return bool(self.reasons)

    def explain(self) -> str:
        """``"replicate=3 from rule stage-one, pool=gpu from rule device-arrays"``."""
        parts = [
            f"{name}={_plain(getattr(self, name))} from {self.reasons[name]}"
            for name in ACTION_FIELDS
            if getattr(self, name) is not None
        ]
        return ", ".join(parts) or "no rule applies"


def overrides(
    annotation: Actions | None, runtime: Target | RuntimeTarget | None
) -> tuple[dict[str, Any], dict[str, Reason]]:
    """The fields decided before any rule is looked at: a runtime target decides
    ``replicate`` (and the fields set with it), then the ``amm`` annotation decides the
    fields it sets."""
    decided: dict[str, Any] = {}
    reasons: dict[str, Reason] = {}
    if isinstance(runtime, Target):
        runtime = RuntimeTarget(runtime)
    if runtime is not None:
        decided = runtime.fields()
        reasons = dict.fromkeys(decided, Reason(runtime.origin))
    if annotation is not None:
        for name in annotation.set_fields():
            if name not in decided:
                decided[name] = getattr(annotation, name)
                reasons[name] = Reason("annotation")
    return decided, reasons


#: The :class:`Desired` of a key no rule, annotation or runtime target governs.
UNGOVERNED = Desired()


#: The default ``reload-settle`` (seconds).
RELOAD_SETTLE = 2.0


@record(frozen=True)
class Ruleset:
    """A compiled rules file."""

    pools: Mapping[str, Pool] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    rebalance: RebalanceSettings = field(default_factory=RebalanceSettings)
    #: The ``paused-workers:`` section, or None when the file has none (nothing is done).
    paused_workers: PausedWorkersSettings | None = None
    #: The ``memory-pressure:`` section, or None when the file has none (nothing is held).
    memory_pressure: MemoryPressureSettings | None = None
    reduce_replicas: bool = True
    #: ``legacy-replicate``: one of :data:`LEGACY_REPLICATE_VALUES`.
    legacy_replicate: str = "honour"
    demand: DemandSettings = field(default_factory=DemandSettings)
    #: Task attributes the ``demand`` section's match reads.
    demand_depends: frozenset[str] = frozenset()
    #: Task attributes the ``rebalance`` section's match reads.
    rebalance_depends: frozenset[str] = frozenset()
    #: The ``protect:`` section, or None when the file has none (nothing is protected).
    protect: ProtectSettings | None = None
    #: The ``spill:`` section, or None when the file has none (stock order, unless a
    #: rule sets ``spill``: see :attr:`spill_settings`).
    spill: SpillSettings | None = None
    #: The ``adaptive:`` section, or None when the file has none (adaptive scaling as
    #: distributed does it, with the retirement's guard of pools and ``move: never``).
    adaptive: AdaptiveSettings | None = None
    #: Where the rules came from: a path, or ``"<rules>"`` for an inline mapping.
    source: str = "<rules>"
    version: int = 1
    #: The text the rules were read from (an inline mapping: its canonical JSON), and
    #: the SHA-256 of the file's bytes (of that JSON for a mapping), as hex. Set by
    #: :func:`~amm_rules.language.loader.load_ruleset`; None for a Ruleset built by hand.
    #: Status, metrics and cluster dumps name the rules in force by this digest.
    text: str | None = field(default=None, compare=False, repr=False)
    sha256: str | None = field(default=None, compare=False, repr=False)
    #: The file's ``enforcement``: ``"enforce"``, or ``"dry-run"`` (nothing the file
    #: decides is enacted, unless a rule or the rebalance section says ``enforce``).
    enforcement: str = "enforce"
    #: ``reload-settle``, in seconds: how long a rules file changed in place must stay
    #: unchanged before it is reloaded (see :mod:`amm_rules.engine.rules_file`).
    reload_settle: float = RELOAD_SETTLE

    @property
    def dry_run_rules(self) -> frozenset[str]:
        """Names of the rules in dry-run: by their own ``enforcement``, else the file's."""
        return frozenset(
            r.name for r in self.rules if (r.enforcement or self.enforcement) == DRY_RUN
        )

    @property
    def rebalance_dry_run(self) -> bool:
        """Whether rebalancing plans and reports without moving anything."""
        return (self.rebalance.enforcement or self.enforcement) == DRY_RUN

    @property
    def balance(self) -> RebalanceSettings | None:
        """The rebalancing ``adaptive: balance`` asks for while adaptive scaling runs
        (:meth:`AdaptiveSettings.balancing`); None when the file's own rebalancing is on,
        or the section is absent or does not ask (``balance`` or ``memory`` off)."""
        adaptive = self.adaptive
        if adaptive is None or not (adaptive.memory and adaptive.balance):
            return None
        return None if self.rebalance.enabled else adaptive.balancing()

    @property
    def sections_on(self) -> tuple[str, ...]:
        """The sections of the file that act, by their names in the file (a
        ``memory-pressure`` or ``rebalance`` written with ``enabled: false`` does not)."""
        on = {
            "rebalance": self.rebalance.enabled,
            "memory-pressure": self.memory_pressure is not None and self.memory_pressure.enabled,
            "protect": self.protect is not None,
            "spill": self.spill is not None,
            "paused-workers": self.paused_workers is not None,
            "adaptive": self.adaptive is not None,
        }
        return tuple(name for name, acts in on.items() if acts)

    @property
    def depends(self) -> frozenset[str]:
        """Every task attribute any rule's match reads."""
        return frozenset().union(*(rule.depends for rule in self.rules))

    @property
    def reads_demand(self) -> bool:
        """True if a rule's match or the demand section reads a demand attribute, or
        the demand section holds copies: the engine then follows each key's readers."""
        return (
            not DEMAND_ATTRIBUTES.isdisjoint(self.depends | self.demand_depends)
            or self.demand.enabled
        )

    @property
    def spill_settings(self) -> SpillSettings | None:
        """What workers are asked about eviction: the ``spill:`` section; else, when a
        rule sets ``spill``, the section's defaults (``order: value``); else None."""
        if self.spill is not None:
            return self.spill
        if any(rule.actions.spill is not None for rule in self.rules):
            return SpillSettings()
        return None

    @property
    def reads_span_state(self) -> bool:
        """True if some rule's match reads ``task.span_done``."""
        return not self.depends.isdisjoint(SPAN_STATE_ATTRIBUTES)

    @property
    def follows_spans(self) -> bool:
        """True if a rule's match, or the ``demand`` or ``rebalance`` section's, reads
        ``task.span_done``: the engine then follows the spans' states."""
        return self.reads_span_state or not SPAN_STATE_ATTRIBUTES.isdisjoint(
            self.demand_depends | self.rebalance_depends
        )

    @property
    def reads_flow(self) -> bool:
        """True if some rule's match reads a memory-flow attribute (``task.prefix_*``)."""
        return not self.depends.isdisjoint(FLOW_ATTRIBUTES)

    @property
    def reads_costs(self) -> bool:
        """True if some rule's match reads ``task.recompute_seconds``: keys are then
        classified again when their group's estimate moves."""
        return "recompute_seconds" in self.depends

    def resolve(
        self,
        task: Any,
        annotation: Actions | None = None,
        runtime: Target | RuntimeTarget | None = None,
    ) -> Desired:
        """Apply the cascade to one key.

        ``task`` has the attributes of :class:`TaskFacts`. A rule's match is evaluated
        only if the rule could still decide a field; evaluation stops once every field
        is decided.
        """
        decided, reasons = overrides(annotation, runtime)
        for rule in self.rules:
            if len(decided) == len(ACTION_FIELDS):
                break
            fields = [f for f in rule.actions.set_fields() if f not in decided]
            if not fields or not rule.match(task):
                continue
            for name in fields:
                decided[name] = getattr(rule.actions, name)
                reasons[name] = Reason("rule", rule.name)
        if not decided:
            return UNGOVERNED
        return Desired(reasons=reasons, **decided)
