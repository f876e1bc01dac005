"""Prometheus metrics of the rules engine: ``dask_amm_rules_*`` on the scheduler's
``/metrics`` (docs/observe.md lists and describes each; tests/observe/test_metrics.py
keeps the two in step).

distributed serves ``/metrics`` from ``prometheus_client``'s global registry when that
package is installed. One collector per process (:class:`RulesCollector`, a
``distributed.http.prometheus.PrometheusCollector``, hence dask's namespace) is
registered there while at least one :class:`~amm_rules.engine.policy.RulesPolicy` is
attached, and removed when the last one detaches or its scheduler closes. It computes
everything at scrape time from the engine's counters and index (never in the AMM
cycle, never by scanning keys). Every sample carries a ``scheduler`` label, so that
several schedulers in one process, which share that registry, keep their own series.

Rules with series of their own are the first :data:`RULE_SERIES` of the file; the
others add up under ``rule="(other rules)"``: a file of 10,000 rules made scrapes of
8 MB that took half a second to format on the event loop, and bounded so, a scrape
costs about as much at any number of rules as at a few dozen.

Besides :data:`FAMILIES`, the collector publishes the ``metrics()`` of the engine's
sections (:mod:`amm_rules.engine.sections`), each named by its section's ``METRICS``
table, so that a new section's figures are published without a change here; and the
memory flow (:mod:`amm_rules.engine.state.flow`), per prefix for the top prefixes only
(:func:`shown_prefixes`: bounded label cardinality) and in totals over every prefix.

Neighbours: :mod:`amm_rules.observe.extension` registers and unregisters policies here;
:mod:`amm_rules.observe.conformance` computes the per-rule figures.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from distributed.http.prometheus import PrometheusCollector

from amm_rules.observe.conformance import REASONS, STATES, RuleConformance, conformance

if TYPE_CHECKING:
    from amm_rules.engine.policy import RulesPolicy

logger = logging.getLogger(__name__)

SUBSYSTEM = "amm_rules"
#: Rules with series of their own, in file order; the figures of the others add up
#: under :data:`OTHER_RULES` (bounded label cardinality, and a bounded scrape).
RULE_SERIES = 50
OTHER_RULES = "(other rules)"

_lock = threading.Lock()
#: The registered collector, while a policy is attached in this process.
_collector: RulesCollector | None = None


def available() -> bool:
    """Whether ``prometheus_client`` can be imported (without importing it twice)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def register(policy: RulesPolicy) -> bool:
    """Have ``policy``'s figures scraped (registering the collector with the first
    policy). False if ``prometheus_client`` is not installed."""
    global _collector
    if not available():
        return False
    import prometheus_client

    with _lock:
        if _collector is None:
            collector = RulesCollector()
            prometheus_client.REGISTRY.register(collector)
            _collector = collector
        if policy not in _collector.policies:
            _collector.policies.append(policy)
    return True


def unregister(policy: RulesPolicy) -> None:
    """Stop scraping ``policy`` (unregistering the collector with the last policy)."""
    global _collector
    with _lock:
        collector = _collector
        if collector is None or policy not in collector.policies:
            return
        collector.policies.remove(policy)
        if collector.policies:
            return
        _collector = None
    import prometheus_client

    with contextlib.suppress(KeyError):  # already gone (unregistered by someone else)
        prometheus_client.REGISTRY.unregister(collector)


def registered() -> RulesCollector | None:
    """The collector in the registry now, if any."""
    return _collector


class RulesCollector(PrometheusCollector):
    """Collects every attached policy's figures at scrape time (see the module doc)."""

    def __init__(self) -> None:
        super().__init__(server=None)
        self.subsystem = SUBSYSTEM
        #: Policies scraped, in the order they attached.
        self.policies: list[RulesPolicy] = []
        self._failed: set[str] = set()

    def describe(self) -> list[Any]:
        # No names announced: the registry then does not call collect() when this
        # collector is registered (that would compute every figure once for nothing).
        return []

    def collect(self) -> Iterator[Any]:
        families = _Families(self)
        for policy in list(self.policies):
            try:
                families.add(policy)
            except Exception as exc:  # a scrape must never fail because of one engine
                token = repr(exc)
                if token not in self._failed:
                    self._failed.add(token)
                    logger.exception("amm-rules: metrics of %r could not be collected", policy)
        yield from families.all()


#: The families of every scrape, in the order they are published: metric name, kind,
#: labels after ``scheduler``, help. Whether anything is enforced at all comes first.
FAMILIES = (
    ("amm_running", "gauge", (),
     "1 while the Active Memory Manager runs its cycles; 0 while it runs none (stopped, or "
     "start: false): nothing enforces the rules, every rule is in state not-running"),
    ("amm_running_changed_timestamp_seconds", "gauge", (),
     "When the Active Memory Manager last started or stopped running its cycles (seconds "
     "since the epoch; the policy's attach if neither since)"),
    ("governed_keys", "gauge", ("rule",), "Keys in memory governed by a rule or group"),
    ("governed_bytes", "gauge", ("rule",),
     "Bytes of one copy of the keys governed by a rule or group"),
    ("keys_met", "gauge", ("rule",), "Governed keys holding their target and placement"),
    ("keys_unmet", "gauge", ("rule", "reason"),
     "Governed keys not holding their target or placement, by reason (reasons with keys "
     "only)"),
    ("rule_state", "gauge", ("rule", "state"),
     "Conformance state of a rule or group: 1 for the current state, 0 for the others"),
    ("rules_in_state", "gauge", ("state",),
     "Rules of the file (every one, also those without series of their own) in each "
     "conformance state"),
    ("keys_met_ratio", "gauge", (),
     "Fraction of governed keys holding their target and placement"),
    ("copies_requested", "counter", ("rule",),
     "Copies requested since the policy started, by rule or group"),
    ("copies_dropped", "counter", ("rule",),
     "Copies dropped since the policy started, by rule or group"),
    ("dry_run_would_request", "gauge", ("rule",),
     "Copies the rules in dry-run would request now (held back in the last cycle)"),
    ("dry_run_would_drop", "gauge", ("rule",),
     "Copies the rules in dry-run would drop now (held back in the last cycle)"),
    ("copies_in_flight", "gauge", (), "Copies the engine asked for and has not seen land"),
    ("rebalance_moves", "counter", (), "Rebalancing moves started"),
    ("rebalance_moved_bytes", "counter", (), "Bytes copied by rebalancing moves"),
    ("rebalance_moves_in_flight", "gauge", (), "Rebalancing moves not finished"),
    ("rebalance_balancing", "gauge", (),
     "1 while rebalancing works for the adaptive section's balance, else 0"),
    ("cycle_duration_seconds", "summary", (), "Duration of the policy's AMM cycles"),
    ("last_cycle_duration_seconds", "gauge", (), "Duration of the last AMM cycle"),
    ("classification_backlog_keys", "gauge", (),
     "Keys in memory left unclassified by the last cycle's classification budget"),
    ("reloads", "counter", ("result",), "Reloads of the rules file, by result (ok, error)"),
    ("rules", "info", (),
     "The rules in force: their source, the SHA-256 of the file, when they were loaded"),
    ("rules_loaded_timestamp_seconds", "gauge", (),
     "When the rules in force were loaded (seconds since the epoch)"),
)  # fmt: skip


def _family(name: Callable[[str], str], kind: str, metric: str, doc: str, labels: Any) -> Any:
    """A family of ``kind`` (counter, summary, info; anything else a gauge) with a
    ``scheduler`` label before ``labels``."""
    from prometheus_client import core

    factory = {
        "counter": core.CounterMetricFamily,
        "summary": core.SummaryMetricFamily,
        "info": core.InfoMetricFamily,
    }.get(kind, core.GaugeMetricFamily)
    return factory(name(metric), doc, labels=["scheduler", *labels])


class _Families:
    """The metric families of one scrape, filled policy by policy."""

    def __init__(self, collector: RulesCollector):
        self._name = collector.build_name
        #: :data:`FAMILIES`, by metric name.
        self.fixed = {
            metric: _family(self._name, kind, metric, doc, labels)
            for metric, kind, labels, doc in FAMILIES
        }
        self.flow = _FlowFamilies(self._name)
        #: Families of the engine's sections, by name, made when first met.
        self._extra: dict[str, Any] = {}

    def add(self, policy: RulesPolicy) -> None:
        f = self.fixed
        where = [_scheduler_label(policy)]
        c = conformance(policy)
        f["amm_running"].add_metric(where, float(c.running))
        if c.since is not None:
            f["amm_running_changed_timestamp_seconds"].add_metric(where, c.since)
        shown, other = _shown_rows(c.rules)
        for r in shown:
            self._rule(where, r)
            for state in STATES:
                f["rule_state"].add_metric([*where, r.name, state], float(r.state == state))
        if other is not None:
            self._rule(where, other)
        by_state = Counter(dict.fromkeys(STATES, 0))
        by_state.update(r.state for r in c.rules if r.kind == "rule")
        for state, n in by_state.items():
            f["rules_in_state"].add_metric([*where, state], n)
        f["keys_met_ratio"].add_metric(where, c.fraction)
        label_of = _labels(shown, c.rules)
        totals: dict[str, list[int]] = {}
        for label, counts in sorted(policy.totals.items()):
            acc = totals.setdefault(label_of(label), [0, 0])
            acc[0] += counts["requested"]
            acc[1] += counts["dropped"]
        for label, (requested, dropped) in totals.items():
            f["copies_requested"].add_metric([*where, label], requested)
            f["copies_dropped"].add_metric([*where, label], dropped)
        # Every rule and group shown (0 when not in dry-run), and any other label
        # holding back (the rules without series of their own add up).
        last = policy.last_cycle
        held: dict[str, list[int]] = {r.name: [0, 0] for r in shown}
        if other is not None:
            held[OTHER_RULES] = [0, 0]
        for label, cycle in last.items():
            if "would_request" in cycle or "would_drop" in cycle or label in held:
                acc = held.setdefault(label_of(label), [0, 0])
                acc[0] += cycle.get("would_request", 0)
                acc[1] += cycle.get("would_drop", 0)
        for label, (would_request, would_drop) in held.items():
            f["dry_run_would_request"].add_metric([*where, label], would_request)
            f["dry_run_would_drop"].add_metric([*where, label], would_drop)
        f["copies_in_flight"].add_metric(where, len(policy.ctx.ledger))
        rebalancer = policy.rebalancer
        f["rebalance_moves"].add_metric(where, rebalancer.totals["moves"])
        f["rebalance_moved_bytes"].add_metric(where, rebalancer.totals["bytes"])
        f["rebalance_moves_in_flight"].add_metric(where, len(rebalancer.book.pending))
        f["rebalance_balancing"].add_metric(where, float(policy.balancing))
        journal = policy.journal
        f["cycle_duration_seconds"].add_metric(where, journal.cycles, journal.cycle_seconds_total)
        f["last_cycle_duration_seconds"].add_metric(where, policy.last_cycle_seconds)
        f["classification_backlog_keys"].add_metric(where, journal.backlog)
        for result in ("ok", "error"):
            f["reloads"].add_metric([*where, result], journal.reloads[result])
        ruleset = policy.ruleset
        f["rules"].add_metric(
            where,
            {
                "source": policy.path if policy.path is not None else ruleset.source,
                "sha256": ruleset.sha256 or "",
                "loaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(policy.loaded_at)),
            },
        )
        f["rules_loaded_timestamp_seconds"].add_metric(where, policy.loaded_at)
        self.flow.add(policy, where)
        self._sections(policy, where)

    def _rule(self, where: list[str], r: RuleConformance) -> None:
        at = [*where, r.name]
        self.fixed["governed_keys"].add_metric(at, r.keys)
        self.fixed["governed_bytes"].add_metric(at, r.bytes)
        self.fixed["keys_met"].add_metric(at, r.met)
        # Only the reasons that have keys: with every reason of every rule at zero,
        # formatting the scrape would cost more than computing it.
        for reason in REASONS:
            n = r.unmet.get(reason, 0)
            if n:
                self.fixed["keys_unmet"].add_metric([*at, reason], n)

    def _sections(self, policy: RulesPolicy, where: list[str]) -> None:
        """The figures of the engine's sections (see Section.metrics and METRICS)."""
        for section in policy.sections:
            figures = section.metrics()
            if not figures:
                continue
            known = section.METRICS
            for figure, value in figures.items():
                spec = known.get(
                    figure,
                    (f"{section.metric_prefix}_{figure}", "gauge", f"{section.name}: {figure}"),
                )
                name, kind, doc = spec[:3]
                # A figure that is a mapping has a series per key, under the spec's label.
                label = spec[3] if len(spec) > 3 else None
                family = self._extra.get(name)
                if family is None:
                    labels = () if label is None else (label,)
                    family = self._extra[name] = _family(self._name, kind, name, doc, labels)
                if label is None:
                    family.add_metric(where, value)
                else:
                    for at, v in value.items():
                        family.add_metric([*where, str(at)], v)

    def all(self) -> Iterator[Any]:
        return iter([*self.fixed.values(), *self.flow.all(), *self._extra.values()])


#: Prefixes with their own series: those that produced the most bytes, then those with
#: the most bytes in memory now (bounded label cardinality; the totals count them all).
FLOW_PREFIXES_BY_PRODUCED = 10
FLOW_PREFIXES_BY_LIVE = 5


class _FlowFamilies:
    """The memory flow (:mod:`amm_rules.engine.state.flow`): per prefix for the top prefixes
    only, and totals over every prefix."""

    PER_PREFIX = (
        ("produced", "counter", "memory_flow_produced_bytes", "Bytes produced by the prefix's tasks"),
        ("freed", "counter", "memory_flow_freed_bytes", "Bytes of the prefix's keys freed (each key once)"),
        ("freed_by", "counter", "memory_flow_freed_by_bytes", "Bytes of inputs freed because a task of the prefix finished"),
        ("tasks", "counter", "memory_flow_tasks", "Tasks of the prefix finished"),
        ("live", "gauge", "memory_flow_live_bytes", "Bytes of the prefix's keys in memory now"),
        ("net_per_task", "gauge", "memory_flow_net_per_task_bytes", "(produced - freed_by) / tasks of the prefix"),
    )  # fmt: skip
    TOTALS = (
        ("produced", "counter", "memory_produced_bytes", "Bytes produced by tasks"),
        ("freed", "counter", "memory_freed_bytes", "Bytes of keys freed (each key once)"),
        ("freed_by", "counter", "memory_freed_by_bytes", "Bytes of inputs freed by tasks finishing"),
        ("tasks", "counter", "memory_tasks", "Tasks finished"),
        ("live", "gauge", "memory_live_bytes", "Bytes of keys in memory now (each key once)"),
    )  # fmt: skip

    def __init__(self, name: Callable[[str], str]) -> None:
        self.per_prefix = {
            field: _family(name, kind, metric, doc, ("prefix",))
            for field, kind, metric, doc in self.PER_PREFIX
        }
        self.totals = {
            field: _family(name, kind, metric, doc, ()) for field, kind, metric, doc in self.TOTALS
        }
        self.prefixes = _family(
            name, "gauge", "memory_flow_prefixes", "Task prefixes whose memory flow is kept", ()
        )

    def add(self, policy: RulesPolicy, where: list[str]) -> None:
        flow = getattr(policy, "flow", None)
        if flow is None:
            return
        for name, entry in shown_prefixes(flow):
            figures = entry.as_dict()
            for field, family in self.per_prefix.items():
                value = figures[field]
                if value is not None:
                    family.add_metric([*where, name], value)
        for field, value in flow.totals().items():
            self.totals[field].add_metric(where, value)
        self.prefixes.add_metric(where, len(flow.prefixes))

    def all(self) -> list[Any]:
        return [*self.per_prefix.values(), *self.totals.values(), self.prefixes]


def shown_prefixes(flow: Any) -> list[tuple[str, Any]]:
    """The prefixes with their own series (see :data:`FLOW_PREFIXES_BY_PRODUCED`)."""
    chosen = flow.top(FLOW_PREFIXES_BY_PRODUCED, "produced")
    names = {name for name, _ in chosen}
    for name, entry in flow.top(FLOW_PREFIXES_BY_LIVE + len(names), "live"):
        if len(chosen) >= FLOW_PREFIXES_BY_PRODUCED + FLOW_PREFIXES_BY_LIVE:
            break
        if name not in names and entry.live > 0:
            chosen.append((name, entry))
            names.add(name)
    return chosen


def _shown_rows(
    rows: list[RuleConformance],
) -> tuple[list[RuleConformance], RuleConformance | None]:
    """The rows with series of their own (the first :data:`RULE_SERIES` rules, and the
    groups), and the sum of the other rules' rows (None if there are none)."""
    shown: list[RuleConformance] = []
    other: RuleConformance | None = None
    rules = 0
    for r in rows:
        if r.kind != "rule":
            shown.append(r)
            continue
        rules += 1
        if rules <= RULE_SERIES:
            shown.append(r)
            continue
        if other is None:
            other = RuleConformance(OTHER_RULES, "rule")
        other.keys += r.keys
        other.bytes += r.bytes
        other.unmet.update(r.unmet)
    return shown, other


def _labels(shown: list[RuleConformance], rows: list[RuleConformance]) -> Any:
    """The label a counter of ``label`` is published under: its own if its row is
    shown or it is a group of the engine's own (``(reduce-replicas)``...), else
    :data:`OTHER_RULES`."""
    names = {r.name for r in shown}
    rules = {r.name for r in rows if r.kind == "rule"}

    def label_of(label: str) -> str:
        if label in names or (label not in rules and label.startswith("(")):
            return label
        return OTHER_RULES

    return label_of


def _scheduler_label(policy: RulesPolicy) -> str:
    try:
        scheduler = policy.scheduler
    except AttributeError:
        return ""
    try:
        return str(scheduler.address)
    except ValueError:  # not listening yet
        return str(getattr(scheduler, "id", ""))
