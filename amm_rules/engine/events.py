"""Events of the rules engine in the scheduler's event log, topic ``amm-rules``.

Clients read them with ``client.get_events("amm-rules")``. Every event is a dict with an
``"action"``: docs/policy.md ("Events") lists the engine's actions and their fields, and
a section's page its own (``memory-pressure``: docs/memory-flow.md).

Rate limits: an identical error is logged once (:meth:`EventLog.once`); cycle summaries
at most once per ``summary_interval`` seconds, adding up what happened in between. Texts
longer than :data:`TEXT_LIMIT` characters are clipped, with a marker, before they are
logged: the scheduler keeps its events in memory.

Anyone can log to the topic (``client.log_event("amm-rules", ...)``): what the engine
wrote itself is :attr:`EventLog.recent`, which is what status reports and the dashboard
show.
:mod:`amm_rules.engine.policy` owns the instance; nothing here knows about rules.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, Protocol

logger = logging.getLogger(__name__)

TOPIC = "amm-rules"
#: At most this many distinct "once" tokens are remembered; then the memory is reset
#: (so a flood of distinct errors costs bounded memory and is still rate-limited).
ONCE_LIMIT = 10_000
COUNTERS = ("governed", "requested", "dropped", "unmet")
#: Counters of suggestions held back by dry-run (see amm_rules.engine.dryrun).
DRY_RUN_COUNTERS = ("would_request", "would_drop")
#: Longest text field of an event (an error's diagnostics); longer ones are clipped.
TEXT_LIMIT = 10_000
#: Events other than ``cycle`` kept in :attr:`EventLog.recent`.
RECENT_KEPT = 50


def clip_text(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text``, or its first ``limit`` characters and a marker saying how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [clipped: {len(text):,} characters]"


def dry_run_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """The dry-run counters of one label that are not zero."""
    return {c: counts[c] for c in DRY_RUN_COUNTERS if counts.get(c)}


#: Longest text taken from a client's value into an event or a log line.
CLIP = 300


def clip(text: str, limit: int = CLIP) -> str:
    """``text``, or its first ``limit`` characters and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class Part(Protocol):
    """What adds its own facts to the ``cycle`` event (a section)."""

    @property
    def name(self) -> str: ...

    def cycle_summary(self, into: dict[str, Any]) -> bool: ...


class EventLog:
    """Writes ``amm-rules`` events to a scheduler (or anything with ``log_event``)."""

    def __init__(self, summary_interval: float = 10.0):
        #: Where events go; None until the policy is attached (events are then dropped).
        self.scheduler: Any = None
        #: Minimum seconds between two ``cycle`` events.
        self.summary_interval = summary_interval
        self._seen: set[Hashable] = set()
        self._last_summary = float("-inf")
        self._pending: dict[str, dict[str, int]] = {}
        self._pending_work = False
        #: Each part's facts since the last ``cycle`` event (see :meth:`summary`).
        self._parts: dict[str, dict[str, Any]] = {}
        self._dry_run: dict[str, dict[str, int]] = {}
        #: The latest events this log wrote, but cycle summaries, as ``(time, event)``,
        #: oldest first: the engine's own, whatever clients log to the same topic.
        self.recent: deque[tuple[float, dict[str, Any]]] = deque(maxlen=RECENT_KEPT)

    def emit(self, action: str, **fields: Any) -> None:
        msg = {
            "action": action,
            **{k: clip_text(v) if isinstance(v, str) else v for k, v in fields.items()},
        }
        if self.scheduler is None:
            logger.debug("amm-rules event before attach: %s", msg)
            return
        try:
            self.scheduler.log_event(TOPIC, msg)
        except Exception:  # an event must never break a cycle
            logger.exception("amm-rules: could not log event %r", action)
            return
        if action != "cycle":
            self.recent.append((time.time(), msg))

    def once(self, token: Hashable, action: str, **fields: Any) -> bool:
        """Emit unless an event with the same ``token`` was emitted before."""
        if token in self._seen:
            return False
        if len(self._seen) >= ONCE_LIMIT:
            self._seen.clear()
        self._seen.add(token)
        self.emit(action, **fields)
        return True

    # -- errors reported by the parts of the engine, each once ----------------------

    def rule_error(self, where: str, exc: Exception) -> None:
        """A match or pool expression raised (``where``: a rule's name, ``pools.NAME``,
        ``rebalance.match``, ``demand.match``): reported once per place."""
        self.once(("rule-error", where), "rule-error", rule=where, error=repr(exc))

    def invalid_annotation(
        self, value: Any, exc: Exception, key: Hashable, name: str = "amm"
    ) -> None:
        """An annotation that cannot be used (``name``: ``amm``, or ``replicate``, its
        shorthand); its keys follow the rules. The value comes from a client and may be
        megabytes, or a few bytes standing for millions of shared values: the log line,
        the event (kept in the scheduler's memory) and the rate-limit token get a bounded
        repr; the warning is logged once per event, not once per key."""
        from amm_rules.engine.adapters import bounded_repr

        shown, error = bounded_repr(value, CLIP), clip(str(exc))
        if self.once(
            ("invalid-annotation", name, shown),
            "invalid-annotation",
            name=name,
            annotation=shown,
            error=error,
            example_key=clip(str(key)),
        ):
            logger.warning("amm-rules: ignoring invalid %s annotation %s: %s", name, shown, error)

    def summary(
        self,
        per_rule: Mapping[str, Mapping[str, int]],
        now: float,
        parts: Iterable[Part] = (),
    ) -> bool:
        """Add one cycle's counters; emit a ``cycle`` event if the interval has passed
        and something was requested or dropped since the last one. ``parts``: what
        adds its own facts to the event, under its name (the sections: see
        :meth:`Section.cycle_summary <amm_rules.engine.sections.base.Section.cycle_summary>`)."""
        for part in parts:
            known = self._parts.get(part.name)
            into = {} if known is None else known
            if part.cycle_summary(into):
                self._pending_work = True
            if known is None and into:
                self._parts[part.name] = into
        for label, counts in per_rule.items():
            acc = self._pending.setdefault(label, dict.fromkeys(COUNTERS, 0))
            acc["requested"] += counts.get("requested", 0)
            acc["dropped"] += counts.get("dropped", 0)
            # Governed and unmet are states, not flows: report the latest.
            acc["governed"] = counts.get("governed", 0)
            acc["unmet"] = counts.get("unmet", 0)
            if counts.get("requested", 0) or counts.get("dropped", 0):
                self._pending_work = True
        # Held back by dry-run: a state (what enforcing would do now), the latest cycle's.
        dry_run = {
            label: would for label, counts in per_rule.items() if (would := dry_run_counts(counts))
        }
        if dry_run:
            self._dry_run = dry_run
            self._pending_work = True
        if not self._pending_work or now - self._last_summary < self.summary_interval:
            return False
        rules = {k: v for k, v in self._pending.items() if v["requested"] or v["dropped"]}
        extra: dict[str, Any] = {name: facts for name, facts in self._parts.items() if facts}
        if self._dry_run:
            extra["dry_run"] = self._dry_run
        self.emit(
            "cycle",
            rules=rules,
            requested=sum(v["requested"] for v in rules.values()),
            dropped=sum(v["dropped"] for v in rules.values()),
            **extra,
        )
        self._last_summary = now
        self._pending = {}
        self._pending_work = False
        self._parts = {}
        self._dry_run = {}
        return True
