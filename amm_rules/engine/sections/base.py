"""The contract of a section: one feature of the engine. docs/architecture.md ("Sections
and the engine's context") has the table of what a section may define and when each
method is called.

A :class:`Section` is built with the :class:`~amm_rules.engine.context.EngineContext`
(``Section(ctx)``: the context exists before the sections, and a section keeps it, never
the policy), and never sees another section: what sections must agree on is on the
context (the ledger, the claims, the workers leaving). It must have a
:attr:`~Section.name` and its place in :mod:`amm_rules.engine.sections`: a step of the
cycle, run every cycle in the order written there once, or a section off the cycle,
which acts only through scheduler hooks, handlers and its reports.

Neighbours: :mod:`amm_rules.engine.sections` runs the cycle;
:mod:`amm_rules.engine.context` is what the sections are given.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Iterable, Mapping
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

    __slots__ = ("ended", "filed", "full", "now", "started", "stats")

    def __init__(self, full: bool, now: float, started: float):
        #: Workers changed since the last cycle: every governed key is checked in this one.
        self.full = full
        #: ``time.perf_counter()`` when the cycle started (budgets count from there).
        self.started = started
        #: Called with ``time.perf_counter()`` when the cycle ends, even if it failed.
        self.ended: list[Callable[[float], None]] = []
        #: The engine's clock when planning starts: taken once, after classification
        #: (which may take the cycle's budget), by the cycle itself
        #: (:func:`amm_rules.engine.sections.steps`); the steps before it see the
        #: cycle's start.
        self.now = now
        #: The cycle's counters: label -> {governed, requested, dropped, unmet, ...}.
        self.stats: defaultdict[str, Counter[str]] = defaultdict(Counter)
        #: What the classification step filed in this cycle that may need action, by
        #: plan class (:meth:`~amm_rules.engine.state.index.KeyIndex.suspects`); the
        #: replication step plans them.
        self.filed: dict[Any, list[Any]] = {}


class Section:
    """One feature of the engine, built with the engine's context (see the module
    docstring). Every method has a default that does nothing, so a section defines only
    what it needs."""

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

    #: What the section and its parts need of dask's and distributed's internals
    #: (:mod:`amm_rules.engine.features`), checked by the policy at attach: a section
    #: whose own feature (named as the section) lacks a need is neither attached nor
    #: run; a part that lacks one is in :attr:`unsupported`, and left off
    #: (:meth:`supports`).
    FEATURES: ClassVar[tuple[Feature, ...]] = ()
    #: The features of :attr:`FEATURES` off on this scheduler, with their words (set by
    #: the policy's check at attach).
    unsupported: Mapping[str, str] = {}

    def __init__(self, ctx: EngineContext) -> None:
        #: The engine's context (its scheduler and AMM valid once attached).
        self.ctx = ctx

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
        """The rules in force changed (start or reload), before the keys are classified
        again."""

    def attach(self) -> None:
        """The policy attached to an AMM (``ctx.scheduler`` is valid from here on):
        install the plugins and wrappers the section needs."""

    def detach(self) -> None:
        """The policy leaves the AMM: remove everything :meth:`attach` installed
        (``ctx.attached`` is false from then on)."""

    def run(self, cycle: Cycle) -> Iterable[Any]:
        """This cycle's work (steps of the cycle only); the ``Suggestion`` objects it
        yields go to the AMM, which validates and enacts them. A step with nothing to
        suggest returns an empty tuple: each generator between the AMM and a suggestion
        costs a frame switch per suggestion."""
        return ()

    def reloaded(self, in_memory: list[Any]) -> None:
        """A reload installed new rules; ``in_memory``: the tasks in memory now (the one
        pass over ``scheduler.tasks`` a reload costs, shared by every section)."""

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

    def counter_figures(self, counters: Mapping[str, int]) -> dict[str, float]:
        """The figures of :attr:`METRICS` that are counters, read from ``counters``
        (0 for those not counted yet)."""
        return {
            name: float(counters.get(name, 0))
            for name, spec in self.METRICS.items()
            if spec[1] == "counter"
        }

    def cycle_summary(self, into: dict[str, Any]) -> bool:
        """Add the last cycle's facts to ``into``, the section's part of the next
        ``cycle`` event (kept since the last one: flows add up, states are the
        latest); True if they are work worth an event. Asked after every cycle."""
        return False


def spawn(tasks: set[asyncio.Future[Any]], coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
    """Run ``coro`` without waiting for it, in ``tasks`` until it ends (what a section
    cancels when it leaves)."""
    task = asyncio.ensure_future(coro)
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task
