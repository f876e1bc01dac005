"""The contract of a section: one feature of the engine, run in the policy's cycle.

A :class:`Section` is what the policy knows of a feature. The policy builds one of each
class listed in :data:`amm_rules.engine.sections.SECTIONS`, in that order, and then:

- ``configure(ruleset, dry_run)`` when the rules are installed (at start and on every
  reload), before the keys are classified again;
- ``attach(ctx)`` once the policy has an AMM (and so a scheduler), with the
  :class:`~amm_rules.engine.context.EngineContext`: everything a section may use; a
  section keeps the context, never the policy;
- ``run(cycle)`` once per AMM cycle, in list order: the suggestions it yields go to the
  AMM, which validates and enacts them (a section with nothing to suggest returns an
  empty tuple: each generator between the AMM and a suggestion costs a frame switch
  per suggestion);
- ``reloaded(in_memory)`` after a reload installed new rules, with the tasks in memory
  (the one pass over ``scheduler.tasks`` a reload costs, shared by every section);
- ``detach()`` when the policy leaves the AMM: every plugin, wrapper and callback the
  section installed is removed.

What a section needs of dask's and distributed's internals is in :attr:`Section.FEATURES`
(:mod:`amm_rules.engine.features`): the policy checks it at attach; a section whose own
feature (named as the section) lacks a need is neither attached nor run, and a part of
it that lacks one is in :attr:`Section.unsupported`, which the section consults
(:meth:`Section.supports`) to leave that part off.

What a section shows goes through the same list: ``status()`` is the section's entry in
``amm_rules_status`` under :attr:`Section.status_key`, ``explain(ts, now)`` its entry in
an ``explain`` answer under :attr:`Section.explain_key`, ``metrics()`` its figures for
Prometheus, described by :attr:`Section.METRICS`. Adding a feature is a new module in
this package and one entry in :data:`~amm_rules.engine.sections.SECTIONS`; status,
explain and the collector find it there (see docs/architecture.md).

Neighbours: :mod:`amm_rules.engine.policy` drives the sections;
:mod:`amm_rules.engine.context` is what they are given.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext
    from amm_rules.engine.dryrun import DryRun
    from amm_rules.engine.features import Feature
    from amm_rules.language.ruleset import Ruleset

#: A metric's definition: (name under ``dask_amm_rules_``, ``gauge`` or ``counter``, help),
#: and, for a figure that is a mapping (label value -> value), the name of its label.
MetricSpec = tuple[str, ...]


class Cycle:
    """One AMM cycle, as the sections see it."""

    __slots__ = ("ended", "full", "now", "started", "stats")

    def __init__(self, full: bool, now: float, started: float):
        #: Workers changed since the last cycle: every governed key is checked in this one.
        self.full = full
        #: ``time.perf_counter()`` when the cycle started (budgets count from there).
        self.started = started
        #: Called with ``time.perf_counter()`` when the cycle ends, even if it failed.
        self.ended: list[Callable[[float], None]] = []
        #: ``time.monotonic()`` when planning starts. The replication section sets it
        #: again after classification (which may take the cycle's budget), so that the
        #: sections after it plan at the same time as it does.
        self.now = now
        #: The cycle's counters: label -> {governed, requested, dropped, unmet, ...}.
        self.stats: defaultdict[str, Counter[str]] = defaultdict(Counter)


class Section:
    """One feature of the engine (see the module docstring). Every method has a default
    that does nothing, so a section defines only what it needs."""

    #: The section's name: its part of the rules file where it has one
    #: (``paused-workers``), else what docs/architecture.md calls it.
    name: ClassVar[str] = ""
    #: Its entry in ``amm_rules_status`` (None: :meth:`status` is not shown).
    status_key: ClassVar[str | None] = None
    #: Its entry in an ``explain`` answer (None: :meth:`explain` is not asked).
    explain_key: ClassVar[str | None] = None
    #: Its figures for Prometheus: figure of :meth:`metrics` -> :data:`MetricSpec`.
    #: A figure not listed is a gauge named ``<metric_prefix>_<figure>``.
    METRICS: ClassVar[Mapping[str, MetricSpec]] = {}
    metric_prefix: ClassVar[str] = ""

    #: Why ``amm-rules simulate`` cannot run the section on a recorded cluster, in one
    #: sentence ("" when it runs it); said in the simulation's report when the rules use
    #: the section (:meth:`in_use`).
    offline: ClassVar[str] = ""

    #: What the section and its parts need of dask's and distributed's internals: the
    #: feature named as the section is the whole section, others are parts of it.
    FEATURES: ClassVar[tuple[Feature, ...]] = ()
    #: The features of :attr:`FEATURES` off on this scheduler, with their words (set by
    #: the policy's check at attach).
    unsupported: Mapping[str, str] = {}

    #: The engine's context while attached, else None.
    ctx: EngineContext | None = None

    def supports(self, feature: str) -> bool:
        """Whether the feature (the section or one of its parts) is on here."""
        return feature not in self.unsupported

    def __repr__(self) -> str:
        return f"<{type(self).__name__} section {self.name!r}>"

    @classmethod
    def in_use(cls, ruleset: Ruleset) -> bool:
        """Whether ``ruleset`` asks anything of the section."""
        return False

    def configure(self, ruleset: Ruleset, dry_run: DryRun) -> None:
        """The rules in force changed (start or reload)."""

    def attach(self, ctx: EngineContext) -> None:
        """The policy attached to an AMM: install what the section needs."""
        self.ctx = ctx

    def detach(self) -> None:
        """The policy leaves the AMM: remove everything :meth:`attach` installed."""
        self.ctx = None

    def run(self, cycle: Cycle) -> Iterable[Any]:
        """This cycle's work; the ``Suggestion`` objects it yields go to the AMM."""
        return ()

    def reloaded(self, in_memory: list[Any]) -> None:
        """A reload installed new rules; ``in_memory``: the tasks in memory now."""

    def emptying(self) -> Collection[str]:
        """Addresses of the workers this section is emptying: their copies are about to
        vanish, so placements for other keys pass them over."""
        return ()

    def status(self) -> Any:
        """The section's entry in ``amm_rules_status`` (plain data)."""
        return None

    def explain(self, ts: Any, now: float) -> Any:
        """The section's entry in the explanation of one key (``ts``, a scheduler task,
        in memory or not; plain data, or None)."""
        return None

    def metrics(self) -> Mapping[str, Any]:
        """Counters and gauges for a metrics collector (see :attr:`METRICS`): numbers,
        or for a figure whose spec names a label, label value -> number."""
        return {}
