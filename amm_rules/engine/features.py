"""What the engine's features need of dask's and distributed's internals, and the check
of those needs when a policy attaches.

amm-rules wraps scheduler methods, adds scheduler plugins whose hooks distributed must
call, reads private attributes and builds a dashboard page from distributed's pieces.
None of that is a public interface: a release of dask or distributed may rename or
remove any of it. Each feature therefore declares what it needs (a :class:`Feature`
of :class:`Need` objects, each with what it is and the release it appeared in), and
:class:`~amm_rules.engine.policy.RulesPolicy` checks every feature when it attaches
(:func:`missing`). A feature whose needs are missing is off, and says so, in the words
of :func:`words`: one log line, one ``unsupported`` event, an entry of the status
(``unsupported``) and a line on the dashboard page, e.g.::

    memory-pressure: off: needs dask >= 2025.1 (Task._data_producer)

The version is the release the internal appeared in; for an internal present since
before the declared floor (dask and distributed 2025.1.0) it is the floor: missing
there means a later release moved it. ``amm-rules validate --dask-config`` says the
same words for the features a rules file uses (:func:`unsupported_in`), checked
against the classes of the environment it runs in.

A section lists its features in :attr:`~amm_rules.engine.sections.base.Section.FEATURES`:
the feature named as the section is the whole section (off: neither attached nor run);
any other is a part of it, which the section looks up (:meth:`Section.supports`) and
leaves off. :data:`ENGINE` and :data:`WORKER_WATCH` are the policy's own.

Neighbours: :mod:`amm_rules.engine.policy` runs the check; the sections declare.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

#: The declared floor of dask and distributed (pyproject.toml).
FLOOR = "2025.1"


@dataclass(frozen=True)
class Need:
    """One internal a feature relies on."""

    #: What it is, as the words name it: ``Task._data_producer``.
    what: str
    #: The package it comes from (``dask`` or ``distributed``) and the release it
    #: appeared in (``2025.1``; :data:`FLOOR` for anything older).
    package: str
    since: str
    #: Whether it is there: called with the scheduler (or, for ``validate``, None: the
    #: classes of the environment are checked).
    present: Callable[[Any], bool] = field(compare=False)

    @property
    def needs(self) -> str:
        return f"{self.package} >= {self.since}"


@dataclass(frozen=True)
class Feature:
    """A feature and what it needs. ``in_use(ruleset)``: whether a rules file asks for
    it (None: every rules file relies on it)."""

    name: str
    needs: tuple[Need, ...]
    in_use: Callable[[Any], bool] | None = field(default=None, compare=False)


def missing(feature: Feature, scheduler: Any = None) -> list[Need]:
    """The needs of ``feature`` that are not there (a check that raises counts as
    missing)."""
    out = []
    for need in feature.needs:
        try:
            ok = bool(need.present(scheduler))
        except Exception:
            ok = False
        if not ok:
            out.append(need)
    return out


def words(name: str, needs: Sequence[Need]) -> str:
    """``memory-pressure: off: needs dask >= 2025.1 (Task._data_producer)``; needs of
    one release are named together."""
    by_release: dict[str, list[str]] = {}
    for need in needs:
        by_release.setdefault(need.needs, []).append(need.what)
    said = ", ".join(f"{release} ({', '.join(whats)})" for release, whats in by_release.items())
    return f"{name}: off: needs {said}"


def unsupported_in(ruleset: Any, features: Iterable[Feature]) -> list[tuple[Feature, str]]:
    """The features ``ruleset`` uses whose needs this environment lacks, each with its
    words (what ``validate --dask-config`` reports)."""
    used = [f for f in features if f.in_use is not None and f.in_use(ruleset)]
    return [(f, words(f.name, lacking)) for f in used if (lacking := missing(f))]


# ---------------------------------------------------------------------------------
# How a need is checked


def _scheduler_class() -> Any:
    return import_module("distributed.scheduler").Scheduler


def _plugin() -> Any:
    return import_module("distributed.diagnostics.plugin").SchedulerPlugin


def method(name: str, *params: str) -> Callable[[Any], bool]:
    """A scheduler method taking the keyword arguments ``params``."""

    def present(scheduler: Any) -> bool:
        found = getattr(scheduler if scheduler is not None else _scheduler_class(), name, None)
        if not callable(found):
            return False
        return all(p in inspect.signature(found).parameters for p in params)

    return present


def attribute(name: str) -> Callable[[Any], bool]:
    """An attribute of the scheduler (of its class for ``validate``)."""

    def present(scheduler: Any) -> bool:
        return hasattr(scheduler if scheduler is not None else _scheduler_class(), name)

    return present


def of_class(
    load: Callable[[], Any], *names: str, params: Sequence[str] = ()
) -> Callable[[Any], bool]:
    """The class or module ``load()`` returns (it imports it: an error there is
    "missing"), with the attributes ``names``; with ``params``, its callable
    ``names[0]`` takes those keyword arguments."""

    def present(scheduler: Any) -> bool:
        found = load()
        if not all(hasattr(found, n) for n in names):
            return False
        if params:
            signature = inspect.signature(getattr(found, names[0]))
            return all(p in signature.parameters for p in params)
        return True

    return present


def _distributed(what: str, since: str, check: Callable[[Any], bool]) -> Need:
    return Need(what, "distributed", since, check)


def scheduler_methods(*names: str) -> tuple[Need, ...]:
    """Scheduler methods the engine wraps, present since before the floor."""
    return tuple(_distributed(f"Scheduler.{n}", FLOOR, method(n)) for n in names)


# ---------------------------------------------------------------------------------
# The needs, by feature (docs/deploy.md lists them)

#: The plugin hook that feeds the key index, the memory flow and demand.
TRANSITION = _distributed(
    "SchedulerPlugin.transition(stimulus_id=)",
    FLOOR,
    of_class(_plugin, "transition", params=("stimulus_id",)),
)
#: The engine itself: the key index, the memory flow and demand.
ENGINE = Feature(
    "engine",
    (
        TRANSITION,
        *scheduler_methods("add_replica", "remove_replica", "remove_all_replicas", "update_data"),
    ),
)
#: Pools that follow workers' resources and memory set at run time.
WORKER_WATCH = Feature(
    "pools following resources and memory", scheduler_methods("add_resources", "heartbeat_worker")
)
#: dask's flag of a task that produces data (read by the scheduler's ``is_rootish``).
DATA_PRODUCER = Need(
    "Task._data_producer",
    "dask",
    "2025.1",
    of_class(lambda: import_module("dask._task_spec").Task, "_data_producer"),
)
#: The scheduler's queue of root-ish tasks and its saturation.
QUEUEING = (
    _distributed("Scheduler.WORKER_SATURATION", FLOOR, attribute("WORKER_SATURATION")),
    _distributed("Scheduler.queued", FLOOR, attribute("queued")),
    *scheduler_methods("check_idle_saturated", "stimulus_queue_slots_maybe_opened"),
)
#: What retiring a worker through the AMM needs.
RETIRING = (
    _distributed(
        "RetireWorker (run, done, manager, address)",
        FLOOR,
        of_class(
            lambda: import_module("distributed.active_memory_manager").RetireWorker,
            "run",
            "done",
            "manager",
            "address",
        ),
    ),
    _distributed(
        "Scheduler.retire_workers(close_workers=, remove=)",
        FLOOR,
        method("retire_workers", "close_workers", "remove"),
    ),
)
#: The plugin hook adaptive scale-down asks which workers it may close.
DOWNSCALING = _distributed(
    "SchedulerPlugin.valid_workers_downscaling",
    "2024.4.2",
    of_class(_plugin, "valid_workers_downscaling"),
)
#: What the adaptive section wraps: adaptive scaling's questions and the retirement
#: that follows them.
ADAPTIVE_SCALING = scheduler_methods("adaptive_target", "workers_to_close", "retire_workers")
#: What the adaptive target reads of the scheduler besides: tasks still to run per
#: prefix, and the workers' disk metrics.
ADAPTIVE_READS = (
    _distributed("Scheduler.task_prefixes", FLOOR, attribute("task_prefixes")),
    _distributed(
        "Scheduler.cumulative_worker_metrics",
        FLOOR,
        lambda s: s is None or hasattr(s, "cumulative_worker_metrics"),
    ),
)
#: Restarting workers through their nannies.
RESTART_WORKERS = _distributed(
    "Scheduler.restart_workers(on_error=, stimulus_id=)",
    "2024.4.0",
    method("restart_workers", "on_error", "stimulus_id"),
)
#: distributed's collector base class (the ``dask_`` namespace of ``/metrics``).
PROMETHEUS = Feature(
    "metrics",
    (
        _distributed(
            "distributed.http.prometheus.PrometheusCollector",
            FLOOR,
            of_class(lambda: import_module("distributed.http.prometheus"), "PrometheusCollector"),
        ),
    ),
)
#: What the dashboard page is built of (checked by the preload, see amm_rules.preload).
DASHBOARD = Feature(
    "dashboard page",
    (
        _distributed(
            "distributed.dashboard.scheduler.applications",
            FLOOR,
            of_class(lambda: import_module("distributed.dashboard.scheduler"), "applications"),
        ),
        _distributed(
            "distributed.dashboard.components.scheduler.BOKEH_THEME and env",
            FLOOR,
            of_class(
                lambda: import_module("distributed.dashboard.components.scheduler"),
                "BOKEH_THEME",
                "env",
            ),
        ),
        _distributed(
            "the simple.html template",
            FLOOR,
            lambda _: _has_template("simple.html"),
        ),
        _distributed(
            "distributed.dashboard.components.DashboardComponent and add_periodic_callback",
            FLOOR,
            of_class(
                lambda: import_module("distributed.dashboard.components"),
                "DashboardComponent",
                "add_periodic_callback",
            ),
        ),
        _distributed(
            "Scheduler.http_application",
            FLOOR,
            lambda s: s is None or hasattr(s, "http_application"),
        ),
    ),
)


def _has_template(name: str) -> bool:
    from distributed.dashboard.components.scheduler import env

    env.get_template(name)
    return True
