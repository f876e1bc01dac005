"""The protect section: the ``protect:`` part of the rules, a memory budget spent on
extra copies of the keys whose loss would cost most recompute per byte.

Each cycle:

1. if keys entered or left memory since the last choice (the recompute costs were
   refreshed) and :data:`CHOOSE_EVERY` AMM intervals passed since it, or the workers changed
   (so did the budget), or the rules were reloaded: choose the keys to protect (:func:`amm_rules.engine.decide.protect.choose`) among
   the keys in memory of the groups whose estimate is at least ``min-recompute``
   (:mod:`amm_rules.engine.state.costs` keeps them by group while the section is in
   the rules), that ``match`` selects, whose rules leave their copies free: a key with
   a replication target of its own (rule, annotation or runtime) or ``move: never`` is
   never a candidate; a key that is not classified yet waits;
2. for every protected key holding fewer than ``copies`` copies (landed or in flight),
   ask for one more: on the least loaded running worker where the key may live (its
   rules' ``pool`` and ``avoid``), with room for it, not holding it, on a host without
   a copy where there is one (``spread: host``); at most the rebalance section's
   ``max-bytes-per-cycle`` per cycle (the first copy of a cycle may exceed it), and
   none in dry-run.

What it protects is :attr:`EngineContext.protected
<amm_rules.engine.context.EngineContext.protected>` (key -> copies): reduce-replicas and
the planner (for keys without a replication target) spare that many copies. A key that
loses its protection joins the keys whose copies changed, so that the next cycle trims
it as before.

Neighbours: :mod:`amm_rules.engine.decide.protect` chooses;
:mod:`amm_rules.engine.sections.reduce_replicas` spares what is protected.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Hashable, Iterator
from typing import Any

from distributed.active_memory_manager import Suggestion

from amm_rules.engine.adapters import TaskFactsAdapter
from amm_rules.engine.decide.protect import HYSTERESIS, Candidate, Choice, choose
from amm_rules.engine.decide.units import format_seconds
from amm_rules.engine.dryrun import DryRun
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.language.ruleset import DRY_RUN, UNGOVERNED, ProtectSettings, Ruleset

logger = logging.getLogger(__name__)

#: Counter label of the section's copies (``copies_requested_total{rule="(protect)"}``).
SOURCE = "(protect)"
#: Most keys protected at once, and most keys looked at per choice (the rest are not
#: candidates that time; the status says so).
MAX_PROTECTED = 50_000
MAX_EXAMINED = 200_000
#: A copy goes only to a worker whose memory stays below this share of its limit.
ROOM = 0.8
#: AMM intervals between two choices made because keys came and went (a busy cluster
#: refreshes its estimates every cycle; choosing looks at up to MAX_EXAMINED keys):
#: 5 s at the default interval of 2 s.
CHOOSE_EVERY = 2.5


class ProtectSection(Section):
    """Protection of the dearest keys (see the module docstring)."""

    name = "protect"
    status_key = "protect"
    explain_key = "protect"
    metric_prefix = "protect"
    METRICS = {
        "keys": ("protect_keys", "gauge", "Keys the protect section keeps extra copies of"),
        "bytes": ("protect_bytes", "gauge", "Bytes of the extra copies protection reserves"),
        "budget_bytes": ("protect_budget_bytes", "gauge", "The protect section's budget"),
        "seconds": (
            "protect_seconds",
            "gauge",
            "Recompute seconds of the keys protected that hold their copies",
        ),
        "copies": ("protect_copies", "counter", "Copies the protect section asked for"),
    }

    def __init__(self) -> None:
        self.settings: ProtectSettings | None = None
        self.dry_run = False
        #: Copies asked for and not seen landing: key -> {address: deadline}.
        self.inflight: dict[Hashable, dict[str, float]] = {}
        #: Workers not to ask again for a key before a time (a copy timed out).
        self.backoff: dict[Hashable, dict[str, float]] = {}
        #: The last choice, its budget, and the worth per byte of the last key chosen.
        self.last: Choice | None = None
        self.budget = 0
        self.cutoff: float | None = None
        self.truncated = False
        #: Copies asked for (accepted) and held back in dry-run, since the start.
        self.copies = 0
        self.would_copy = 0
        self.exhausted = False
        #: As of the last cycle: protected keys holding their copies, their recompute
        #: seconds, and the bytes of the extra copies they hold.
        self.held = (0, 0.0, 0)
        self._seen_refresh = -1
        self._stale = True
        self._chosen_at = float("-inf")

    @classmethod
    def in_use(cls, ruleset: Ruleset) -> bool:
        return ruleset.protect is not None

    def configure(self, ruleset: Ruleset, dry_run: DryRun) -> None:
        self.settings = ruleset.protect
        self.dry_run = ruleset.enforcement == DRY_RUN
        self._stale = True

    def detach(self) -> None:
        if self.ctx is not None:
            self._release(list(self.ctx.protected))
        super().detach()

    # ------------------------------------------------------------------ the cycle

    def run(self, cycle: Cycle) -> Any:
        ctx = self.ctx
        assert ctx is not None
        if self.settings is None:
            if ctx.protected:
                self._release(list(ctx.protected))
            return ()
        costs = ctx.costs
        now = ctx.clock()
        gap = CHOOSE_EVERY * (ctx.manager.interval if ctx.manager is not None else 2.0)
        changed = costs.refreshes != self._seen_refresh and now - self._chosen_at >= gap
        if self._stale or cycle.full or changed:
            self._seen_refresh = costs.refreshes
            self._stale = False
            self._chosen_at = now
            self._choose()
        if not ctx.protected:
            self.held = (0, 0.0, 0)
            return ()
        return self._copies(cycle)

    def _choose(self) -> None:
        """Choose the keys to protect (step 1 of the module docstring)."""
        ctx = self.ctx
        settings = self.settings
        assert ctx is not None and settings is not None
        memory = sum(max(0, ws.memory_limit or 0) for ws in ctx.scheduler.workers.values())
        self.budget = settings.budget(memory)
        self.truncated = False
        choice = choose(
            self._candidates(settings),
            self.budget,
            settings.copies,
            settings.min_recompute,
            MAX_PROTECTED,
        )
        chosen = set(choice.keys)
        protected = ctx.protected
        self._release([key for key in protected if key not in chosen])
        for key in choice.keys:
            protected[key] = settings.copies
        self.last = choice
        self.cutoff = None
        if choice.keys:
            ts = ctx.scheduler.tasks.get(choice.keys[-1])
            seconds = ctx.costs.estimate(ts.group) if ts is not None else None
            if ts is not None and seconds is not None:
                self.cutoff = seconds / max(1, ts.nbytes)
        exhausted = choice.no_room > 0
        if exhausted and not self.exhausted:
            ctx.events.emit(
                "protect-budget-exhausted",
                keys=len(choice.keys),
                bytes=choice.spent,
                budget=self.budget,
                left_out=choice.left_out,
                left_out_seconds=round(choice.left_out_seconds, 1),
            )
        self.exhausted = exhausted

    def _candidates(self, settings: ProtectSettings) -> Iterator[Candidate]:
        """Keys that may be protected (see the module docstring), at most
        :data:`MAX_EXAMINED` of them looked at."""
        ctx = self.ctx
        assert ctx is not None
        index = ctx.index
        desired = index.desired
        unclassified = index.dirty
        backlog = index.backlog
        protected = ctx.protected
        match = settings.match
        floor = settings.min_recompute / HYSTERESIS
        costs = ctx.costs
        examined = 0
        # (Nothing changes these tables while the choice consumes the candidates.)
        for entry in costs.groups.values():
            seconds = entry.published
            if seconds is None or seconds < floor or not entry.keys:
                continue
            for key, ts in entry.keys.items():
                examined += 1
                if examined > MAX_EXAMINED:
                    self.truncated = True
                    return
                d = desired.get(key)
                if d is not None and (d.replicate is not None or d.move == "never"):
                    continue  # its rules decide its copies
                if (unclassified and key in unclassified) or (backlog and key in backlog):
                    continue  # what its rules want is not known yet
                if match is not None and not self._matches(match, ts):
                    continue
                yield Candidate(key, max(0, ts.nbytes), seconds, key in protected)

    def _matches(self, match: Any, ts: Any) -> bool:
        ctx = self.ctx
        assert ctx is not None
        facts = TaskFactsAdapter(
            ts, ctx.index.demand.reads, ctx.flow.published, ctx.spans, ctx.costs.published
        )
        try:
            return bool(match(facts))
        except Exception as exc:
            ctx.events.rule_error("protect.match", exc)
            return False

    def _release(self, keys: list[Hashable]) -> None:
        """Stop protecting ``keys``: their extra copies are trimmed as before."""
        ctx = self.ctx
        if ctx is None:
            return
        for key in keys:
            ctx.protected.pop(key, None)
            self.inflight.pop(key, None)
            self.backoff.pop(key, None)
            ctx.index.touched.add(key)

    def _copies(self, cycle: Cycle) -> Generator[Suggestion, Any, None]:
        """Step 2: one more copy of each protected key short of its copies."""
        ctx = self.ctx
        settings = self.settings
        assert ctx is not None and settings is not None and ctx.manager is not None
        tasks = ctx.scheduler.tasks
        workers = ctx.scheduler.workers
        now = ctx.clock()
        timeout = ctx.inflight_timeout
        allowance = ctx.ruleset.rebalance.max_bytes_per_cycle
        moved = 0
        cluster = None
        gone = []
        held_keys, held_seconds, held_bytes = 0, 0.0, 0
        spent = False
        for key, copies in ctx.protected.items():
            ts = tasks.get(key)
            if ts is None or ts.state != "memory" or not ts.who_has:
                gone.append(key)
                continue
            nbytes = max(0, ts.nbytes)
            if len(ts.who_has) >= 2:
                held_keys += 1
                held_seconds += ctx.costs.estimate(ts.group) or 0.0
                held_bytes += nbytes * (min(len(ts.who_has), copies) - 1)
            if spent:
                continue
            holders = {ws.address for ws in ts.who_has}
            flying = self._in_flight(key, holders, workers, now, timeout)
            if len(holders) + len(flying) >= copies:
                continue
            if moved and moved + nbytes > allowance:
                spent = True  # the movement budget of the cycle is spent
                continue
            if cluster is None:
                cluster = ctx.cluster_view()
            target = self._recipient(ts, cluster, holders | set(flying), settings, now)
            if target is None:
                continue
            if self.dry_run:
                self.would_copy += 1
                cycle.stats[SOURCE]["would_request"] += 1
                continue
            choice = yield Suggestion("replicate", ts, {workers[target]})
            accepted = choice is not None
            seconds = ctx.costs.estimate(ts.group)
            ctx.journal.decision(
                key,
                "replicate",
                target,
                "accepted" if accepted else "refused",
                f"protect: recompute ≈ {format_seconds(seconds)}, {copies} copies",
                SOURCE,
            )
            if accepted:
                moved += nbytes
                self.copies += 1
                cycle.stats[SOURCE]["requested"] += 1
                self.inflight.setdefault(key, {})[target] = now + timeout
                cluster.add_memory(target, nbytes)
        for key in gone:
            ctx.protected.pop(key, None)
            self.inflight.pop(key, None)
            self.backoff.pop(key, None)
        self.held = (held_keys, held_seconds, held_bytes)

    def _in_flight(
        self, key: Hashable, holders: set[str], workers: Any, now: float, timeout: float
    ) -> dict[str, float]:
        """The key's copies still in flight; those that landed or whose worker left are
        forgotten, those past their deadline too, their worker backed off from."""
        entry = self.inflight.get(key)
        if not entry:
            return {}
        live = {}
        for address, deadline in entry.items():
            if address in holders or address not in workers:
                continue
            if deadline <= now:
                self.backoff.setdefault(key, {})[address] = now + timeout
                continue
            live[address] = deadline
        if live:
            self.inflight[key] = live
        else:
            del self.inflight[key]
        return live

    def _recipient(
        self, ts: Any, cluster: Any, taken: set[str], settings: ProtectSettings, now: float
    ) -> str | None:
        """Where the key's next copy goes: the least loaded running worker where its
        rules let it live, with room for it, not holding it or backing off, on a new
        host if one can take it (``spread: host``)."""
        ctx = self.ctx
        assert ctx is not None
        d = ctx.index.desired.get(ts.key, UNGOVERNED)
        nbytes = max(0, ts.nbytes)
        backoff = {a for a, until in self.backoff.get(ts.key, {}).items() if until > now}
        exclude = taken | backoff
        workers = ctx.scheduler.workers

        def room(address: str) -> bool:
            limit = getattr(workers.get(address), "memory_limit", 0) or 0
            return not limit or cluster.memory[address] + nbytes <= ROOM * limit

        if settings.spread == "host":
            hosts = {cluster.host(a) for a in taken if a in cluster.workers}
            choice = cluster.least_loaded(
                d.pool, d.avoid, exclude, lambda a: room(a) and cluster.host(a) not in hosts
            )
            if choice is not None:
                return choice  # type: ignore[no-any-return]
        return cluster.least_loaded(d.pool, d.avoid, exclude, room)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ showing it

    def status(self) -> dict[str, Any] | None:
        """Keys and bytes protected, the budget and its use, the seconds protected and
        those still at risk."""
        ctx = self.ctx
        settings = self.settings
        if ctx is None or settings is None:
            return None
        choice = self.last
        keys, seconds, held = self.held
        return {
            "budget": settings.budget_text,
            "budget_bytes": self.budget,
            "min_recompute": settings.min_recompute,
            "copies": settings.copies,
            "spread": settings.spread or "none",
            "match": settings.match_source,
            "keys": len(ctx.protected),
            "reserved_bytes": choice.spent if choice is not None else 0,
            "held_bytes": held,
            "keys_held": keys,
            "seconds_protected": round(seconds, 3),
            "seconds_at_risk": round(ctx.costs.total_at_risk(), 3),
            "left_out": choice.left_out if choice is not None else 0,
            "left_out_seconds": round(choice.left_out_seconds, 3) if choice else 0.0,
            "budget_exhausted": self.exhausted,
            "examined_limit_reached": self.truncated,
            "in_flight": sum(len(v) for v in self.inflight.values()),
            "copies_requested": self.copies,
            "would_copy": self.would_copy,
            "dry_run": self.dry_run,
        }

    def explain(self, ts: Any, now: float) -> dict[str, Any] | None:
        """Whether the key is protected, and if not, why."""
        ctx = self.ctx
        settings = self.settings
        if ctx is None or settings is None:
            return None
        key = ts.key
        if key in ctx.protected:
            return {
                "protected": True,
                "copies": ctx.protected[key],
                "in_flight": sorted(self.inflight.get(key, {})),
            }
        return {"protected": False, "why": self._why_not(ts)}

    def _why_not(self, ts: Any) -> str:
        ctx = self.ctx
        settings = self.settings
        assert ctx is not None and settings is not None
        d = ctx.index.desired.get(ts.key)
        if d is not None and d.replicate is not None:
            return f"its replication target decides its copies ({d.reasons['replicate']})"
        if d is not None and d.move == "never":
            return f"move: never ({d.reasons['move']})"
        seconds = ctx.costs.estimate(getattr(ts, "group", None))
        if seconds is None:
            return "its recompute estimate is unknown"
        if seconds < settings.min_recompute:
            return (
                f"recompute ≈ {format_seconds(seconds)}, below min-recompute "
                f"{format_seconds(settings.min_recompute)}"
            )
        if settings.match is not None and not self._matches(settings.match, ts):
            return f"protect.match does not select it ({settings.match_source})"
        if ts.state != "memory":
            return "not in memory"
        worth = seconds / max(1, ts.nbytes)
        if self.cutoff is not None and worth < self.cutoff:
            return (
                "the budget is spent on keys worth more recompute per byte "
                f"({worth:.3g} s per byte, the last key protected {self.cutoff:.3g})"
            )
        return "not chosen yet (chosen again when keys enter or leave memory)"

    def metrics(self) -> dict[str, float]:
        """Zeros without a protect section (the series exist whatever the rules)."""
        ctx = self.ctx
        if ctx is None:
            return {}
        _, seconds, _ = self.held
        return {
            "keys": float(len(ctx.protected)),
            "bytes": float(self.last.spent if self.last is not None else 0),
            "budget_bytes": float(self.budget),
            "seconds": seconds,
            "copies": float(self.copies),
        }


__all__ = ["ProtectSection", "SOURCE"]
