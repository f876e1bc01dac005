"""The protect section: the ``protect:`` part of the rules, a memory budget spent on
extra copies of the keys whose loss would cost most recompute per byte (docs/rules.md,
"protect", says what is chosen, when, and what wins).

Each cycle:

1. when the choice is due (a reload; keys the last choice passed over for want of a
   classification; or, :data:`CHOOSE_EVERY` AMM intervals after the last choice, keys
   that entered or left memory or workers that changed), choose the keys to protect
   (:class:`amm_rules.engine.decide.protect.Ranking`, fed :data:`CHOOSE_SLICE` seconds
   of each cycle until done, the choice in force holding meanwhile) among the keys in
   memory of the groups :mod:`amm_rules.engine.state.costs` keeps, never a key whose
   rules decide its copies (a replication target, ``move: never``);
2. for the protected keys short of ``copies`` copies, ask for one more on a worker
   where the key may live, with room for it (:func:`room_for`), on a host without a copy
   first: a cycle looks at the keys whose copies changed and :data:`SWEEP` more in
   turn, at most :data:`MAX_CHECKED`, within the rebalance section's
   ``max-bytes-per-cycle``, and none in dry-run.

What it protects it holds (:mod:`amm_rules.engine.state.claims`, a claim keeping
``copies`` copies): reduce-replicas and the planner spare that many copies. Its copies
in flight and back-offs are the engine's ledger's. A key that loses its protection
joins the keys whose copies changed, so that the next cycle trims it as before.

Neighbours: :mod:`amm_rules.engine.decide.protect` chooses;
:mod:`amm_rules.engine.sections.reduce_replicas` spares what is protected.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Container, Generator, Hashable, Mapping
from dataclasses import dataclass
from itertools import islice, takewhile
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from distributed.active_memory_manager import Suggestion

from amm_rules.engine.adapters import headroom
from amm_rules.engine.decide.protect import HYSTERESIS, Candidate, Choice, Ranking
from amm_rules.engine.dryrun import DryRun
from amm_rules.engine.rebalance.rebalancer import spill_thresholds
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.engine.state.claims import Claim
from amm_rules.engine.words import counted, duration
from amm_rules.language.ruleset import DRY_RUN, UNGOVERNED, ProtectSettings, Ruleset

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext

logger = logging.getLogger(__name__)

#: Counter label of the section's copies (``copies_requested_total{rule="(protect)"}``).
SOURCE = "(protect)"
#: Most keys protected at once, and most keys looked at per choice (the rest are not
#: candidates that time; the status says so).
MAX_PROTECTED = 50_000
MAX_EXAMINED = 200_000
#: A copy goes only to a worker whose memory stays below this share of its limit.
ROOM = 0.8
#: Protected keys a cycle looks at, at most: those short of their copies (or whose
#: copies are in flight) first, in the order chosen; the rest wait for the next cycle.
MAX_CHECKED = 4096
#: Protected keys a cycle looks at in turn besides (a sweep through all of them: a key
#: of ``copies: 3`` that went down to two; the figures of :attr:`ProtectSection.held`
#: follow estimates and sizes that changed): at most MAX_PROTECTED / SWEEP cycles.
SWEEP = 512
#: Seconds of a cycle a choice may spend looking at candidates: a choice among many
#: keys takes several cycles (the one in force holds meanwhile).
CHOOSE_SLICE = 0.02
#: Candidates looked at between two reads of the clock.
GATHER_CHUNK = 512
#: AMM intervals between two choices made because keys came and went (a busy cluster
#: refreshes its estimates every cycle; choosing looks at up to MAX_EXAMINED keys):
#: 5 s at the default interval of 2 s.
CHOOSE_EVERY = 2.5


@dataclass(slots=True)
class _Gathering:
    """A choice under way: its ranking, the groups still to look at (each with its
    estimate and its tasks in memory when the choice started) and the place reached in
    the last of them."""

    ranking: Ranking
    groups: list[tuple[float, list[Any]]]
    at: int = 0
    examined: int = 0
    slices: int = 0
    #: Keys were passed over for want of a classification; the examined limit cut
    #: the choice short.
    waiting: bool = False
    truncated: bool = False

    def step(
        self,
        ctx: Any,
        settings: ProtectSettings,
        matches: Callable[[Any, Any], bool],
        deadline: float,
    ) -> bool:
        """Rank candidates (see the module docstring) until ``deadline``; True once
        every group was looked at, or :data:`MAX_EXAMINED` keys."""
        index = ctx.index
        desired = index.desired
        unclassified = index.dirty
        backlog = index.backlog
        protected = ctx.claims.of(ProtectSection.name)
        match = settings.match
        add = self.ranking.add
        groups = self.groups
        while groups:
            seconds, tasks = groups[-1]
            at = self.at
            chunk = tasks[at : at + GATHER_CHUNK]
            for ts in chunk:
                if ts.state != "memory":
                    continue  # left memory since the choice started
                key = ts.key
                d = desired.get(key)
                if d is not None and (d.replicate is not None or d.move == "never"):
                    continue  # its rules decide its copies
                if (unclassified and key in unclassified) or (backlog and key in backlog):
                    self.waiting = True
                    continue  # what its rules want is not known yet
                if match is not None and not matches(match, ts):
                    continue
                add(Candidate(key, max(0, ts.nbytes), seconds, key in protected))
            self.examined += len(chunk)
            if at + len(chunk) >= len(tasks):
                groups.pop()
                self.at = 0
            else:
                self.at = at + len(chunk)
            if self.examined >= MAX_EXAMINED:
                self.truncated = bool(groups)
                return True
            if groups and time.perf_counter() >= deadline:
                self.slices += 1
                return False
        return True


def room_for(
    workers: Any,
    cluster: Any,
    nbytes: int,
    added: dict[str, int],
    thresholds: tuple[float | None, float | None],
) -> Callable[[str], bool]:
    """Whether a worker has room for a protection copy of ``nbytes``: its memory stays
    below :data:`ROOM` of its limit, and the copy fits in its headroom below the spill
    thresholds, less the ``added`` bytes of this cycle's copies (a copy that pushes as
    many bytes to disk costs a spilling cluster what it protects)."""

    def room(address: str) -> bool:
        ws = workers.get(address)
        limit = getattr(ws, "memory_limit", 0) or 0
        if not limit:
            return True
        if cluster.memory[address] + nbytes > ROOM * limit:
            return False
        left = headroom(ws.memory, limit, thresholds, added.get(address, 0))
        return left is None or nbytes <= left

    return room


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

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        self.settings: ProtectSettings | None = None
        self.dry_run = False
        #: The last choice, its budget, and the worth per byte of the last key chosen.
        self.last: Choice | None = None
        self.budget = 0
        self.cutoff: float | None = None
        self.truncated = False
        #: Copies asked for (accepted) and held back in dry-run, since the start.
        self.copies = 0
        self.would_copy = 0
        self.exhausted = False
        #: As of the last look at each: protected keys holding two copies or more,
        #: their recompute seconds, and the bytes of the extra copies they hold.
        self.held = (0, 0.0, 0)
        #: Protected keys to look at (short of their copies, or in flight), in order.
        self.short: dict[Hashable, None] = {}
        #: Protected keys short of copies that no worker could take: key -> the time
        #: they are looked at again (sooner if the workers change).
        self.later: dict[Hashable, float] = {}
        #: key -> (seconds, extra bytes) of the protected keys holding two copies or
        #: more, as of the last look at each (what :attr:`held` adds up).
        self._holding: dict[Hashable, tuple[float, int]] = {}
        self._holding_seconds = 0.0
        self._holding_bytes = 0
        #: The sweep: a list of the protected keys and the place reached in it.
        self._sweep: list[Hashable] = []
        self._swept = 0
        #: The choice under way (gathered a slice per cycle), and the cycles the last
        #: one took.
        self._gathering: _Gathering | None = None
        self.slices = 0
        self._seen_refresh = -1
        self._stale = True
        self._chosen_at = float("-inf")
        #: The last choice passed over keys not classified yet.
        self._waiting = False

    @classmethod
    def in_use(cls, ruleset: Ruleset) -> bool:
        return ruleset.protect is not None

    def configure(self, ruleset: Ruleset, dry_run: DryRun) -> None:
        self.settings = ruleset.protect
        self.dry_run = ruleset.enforcement == DRY_RUN
        self._stale = True

    @property
    def protected(self) -> Mapping[Hashable, Claim]:
        """The keys protected: key -> the section's claim (``keeps``: its copies)."""
        return self.ctx.claims.of(self.name)

    def detach(self) -> None:
        self._release(list(self.protected))
        self.ctx.costs.reduced = None

    # ------------------------------------------------------------------ the cycle

    def run(self, cycle: Cycle) -> Any:
        ctx = self.ctx
        costs = ctx.costs
        if self.settings is None:
            costs.reduced = None  # nobody to tell
            self._gathering = None
            if self.protected:
                self._release(list(self.protected))
            return ()
        if costs.reduced is None:
            costs.reduced = set()
        now = ctx.clock()
        gap = CHOOSE_EVERY * ctx.amm.interval
        due = now - self._chosen_at >= gap
        changed = costs.refreshes != self._seen_refresh
        # Keys passed over for want of a classification are looked at again as soon as
        # none waits (at attach, after a reload), and every `gap` while some still do:
        # on a quiet cluster no key entering memory would bring another choice.
        waited = self._waiting and (due or not ctx.index.unclassified)
        if self._stale or (
            self._gathering is None and (waited or (due and (changed or cycle.full)))
        ):
            self._seen_refresh = costs.refreshes
            self._stale = False
            self._chosen_at = now
            self._start_choice()
        gathering = self._gathering
        if gathering is not None:
            done = gathering.step(
                ctx, self.settings, self._matches, time.perf_counter() + CHOOSE_SLICE
            )
            self._waiting = self._waiting or gathering.waiting
            if done:
                self.truncated = gathering.truncated
                self._finish_choice()
        if not self.protected:
            self._clear_holding()
            return ()
        return self._copies(cycle)

    def _start_choice(self) -> None:
        """Start a choice (step 1 of the module docstring): the candidate groups, as
        they are now, dearest first (a choice that reaches :data:`MAX_EXAMINED` keys
        leaves out the cheapest)."""
        ctx = self.ctx
        settings = self.settings
        assert settings is not None
        floor = settings.min_recompute / HYSTERESIS
        groups = [
            (seconds, list(entry.keys.values()))
            for entry in ctx.costs.groups.values()
            if (seconds := entry.published) is not None and seconds >= floor and entry.keys
        ]
        groups.sort(key=itemgetter(0))  # cheapest first: taken from the end
        self._gathering = _Gathering(Ranking(settings.min_recompute), groups)
        self._waiting = False

    def _finish_choice(self) -> None:
        """The choice gathered: protect its keys, release the others."""
        ctx = self.ctx
        settings = self.settings
        gathering = self._gathering
        assert settings is not None and gathering is not None
        self._gathering = None
        self.slices = gathering.slices + 1
        memory = sum(max(0, ws.memory_limit or 0) for ws in ctx.scheduler.workers.values())
        self.budget = settings.budget(memory)
        choice = gathering.ranking.pick(self.budget, settings.copies, MAX_PROTECTED)
        chosen = set(choice.keys)
        protected = self.protected
        self._release([key for key in protected if key not in chosen])
        short = self.short
        index = ctx.index
        claims = ctx.claims
        copies = settings.copies
        why = f"protect keeps {copies} copies: dear to compute again"
        for key in choice.keys:
            before = protected.get(key)
            if before is None or before.keeps != copies:
                claims.hold(key, self.name, why, alone=False, keeps=copies)
                short[key] = None
                if before is not None:
                    index.touch((key,))  # fewer copies now: back in reduce-replicas' walk
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

    def _matches(self, match: Any, ts: Any) -> bool:
        ctx = self.ctx
        try:
            return bool(match(ctx.facts(ts)))
        except Exception as exc:
            ctx.events.rule_error("protect.match", exc)
            return False

    def _release(self, keys: list[Hashable]) -> None:
        """Stop protecting ``keys``: their extra copies are trimmed as before."""
        for key in keys:
            self._forget(key)
        self.ctx.index.touch(keys)

    def _forget(self, key: Hashable) -> None:
        self.ctx.claims.release(self.name, (key,))
        self.short.pop(key, None)
        self.later.pop(key, None)
        self._count(key, None, 0)

    def _count(self, key: Hashable, ts: Any, copies: int) -> None:
        """Count ``key`` in :attr:`held` as it is now (``ts``: None when it is gone)."""
        before = self._holding.pop(key, None)
        if before is not None:
            self._holding_seconds -= before[0]
            self._holding_bytes -= before[1]
        n = len(ts.who_has) if ts is not None and ts.who_has else 0
        if n >= 2:
            seconds = self.ctx.costs.estimate(ts.group) or 0.0
            extra = max(0, ts.nbytes) * (min(n, copies) - 1)
            self._holding[key] = (seconds, extra)
            self._holding_seconds += seconds
            self._holding_bytes += extra
        self.held = (len(self._holding), max(0.0, self._holding_seconds), self._holding_bytes)

    def _clear_holding(self) -> None:
        self._holding.clear()
        self._holding_seconds, self._holding_bytes = 0.0, 0
        self.held = (0, 0.0, 0)
        self.short.clear()
        self.later.clear()
        self._sweep, self._swept = [], 0

    def _to_look_at(self, full: bool, now: float, leaving: Container[str]) -> list[Hashable]:
        """The protected keys this cycle looks at (step 2 of the module docstring);
        ``full``: the workers changed (the keys no worker could take are tried again);
        ``leaving``: workers whose copies do not count."""
        ctx = self.ctx
        protected = self.protected
        short = self.short
        later = self.later
        if later:
            # In the order they were put off, all for the same time: the first not due
            # ends the walk.
            due = list(later) if full else list(takewhile(lambda k: later[k] <= now, later))
            for key in due:
                del later[key]
                if key in protected:
                    short[key] = None
        reduced = ctx.costs.reduced
        if reduced:
            for key in reduced:
                if key in protected:
                    short[key] = None
            reduced.clear()
        if self._swept >= len(self._sweep):
            self._sweep, self._swept = list(protected), 0
        turn = self._sweep[self._swept : self._swept + SWEEP]
        self._swept += len(turn)
        tasks = ctx.scheduler.tasks
        for key in turn:
            claim = protected.get(key)
            if claim is None or key in short or key in later:
                continue
            copies = claim.keeps
            ts = tasks.get(key)
            n = sum(ws.address not in leaving for ws in ts.who_has or ()) if ts is not None else 0
            if n < copies:
                short[key] = None  # short, or gone: looked at below
            else:
                self._count(key, ts, copies)
        return list(islice(short, MAX_CHECKED))

    def _copies(self, cycle: Cycle) -> Generator[Suggestion, Any, None]:
        """Step 2: one more copy of each protected key short of its copies."""
        ctx = self.ctx
        settings = self.settings
        assert settings is not None
        tasks = ctx.scheduler.tasks
        workers = ctx.scheduler.workers
        now = ctx.clock()
        timeout = ctx.inflight_timeout
        allowance = ctx.ruleset.rebalance.max_bytes_per_cycle
        moved = 0
        cluster = None
        spent = False
        #: Bytes of this cycle's copies per recipient, and the spill thresholds.
        added: dict[str, int] = {}
        thresholds = spill_thresholds()
        protected = self.protected
        ledger = ctx.ledger
        short = self.short
        # Copies on workers on their way out do not count, as the planner counts them.
        leaving = ctx.leaving().keys()
        for key in self._to_look_at(cycle.full, now, leaving):
            ts = tasks.get(key)
            claim = protected.get(key)
            copies = claim.keeps if claim is not None else 0
            if ts is None or ts.state != "memory" or not ts.who_has or not copies:
                self._forget(key)
                continue
            self._count(key, ts, copies)
            # Looked at: to the end of the line (the keys left over go first next time).
            del short[key]
            if spent:
                short[key] = None
                continue
            nbytes = max(0, ts.nbytes)
            holders = {ws.address for ws in ts.who_has} - leaving
            flying = ledger.in_flight(key)
            if len(holders) >= copies:
                continue  # held: looked at again if its copies fall (or in the sweep)
            short[key] = None
            if len(holders) + len(flying) >= copies:
                continue
            if moved and moved + nbytes > allowance:
                spent = True  # the movement budget of the cycle is spent
                continue
            if cluster is None:
                cluster = ctx.cluster_view()
            room = room_for(workers, cluster, nbytes, added, thresholds)
            target = self._recipient(
                ts, cluster, holders | set(flying), settings, now, leaving, room
            )
            if target is None:
                # No worker can take it now: looked at again in a while, or when the
                # workers change.
                del short[key]
                self.later[key] = now + timeout
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
                f"protect: recompute ≈ {duration(seconds)}, {counted(copies, 'copy')}",
                SOURCE,
            )
            if accepted:
                moved += nbytes
                self.copies += 1
                cycle.stats[SOURCE]["requested"] += 1
                ledger.record(key, target, self.name, now + timeout, nbytes)
                cluster.add_memory(target, nbytes)
                added[target] = added.get(target, 0) + nbytes

    def _recipient(
        self,
        ts: Any,
        cluster: Any,
        taken: set[str],
        settings: ProtectSettings,
        now: float,
        leaving: Collection[str],
        room: Callable[[str], bool],
    ) -> str | None:
        """Where the key's next copy goes: the least loaded running worker where its
        rules let it live, with ``room`` for it, not holding it, not leaving, not backing
        off, on a host without a copy (``taken``: those that count) if one can take it
        (``spread: host``)."""
        ctx = self.ctx
        d = ctx.index.desired.get(ts.key, UNGOVERNED)
        backoff = {a for a, until in ctx.ledger.backing_off(ts.key).items() if until > now}
        exclude = taken | backoff | {ws.address for ws in ts.who_has} | set(leaving)
        if settings.spread == "host":
            hosts = {cluster.host(a) for a in taken if a in cluster.workers}
            choice = cluster.least_loaded(
                d.pool, d.avoid, exclude, lambda a: room(a) and cluster.host(a) not in hosts
            )
            if choice is not None:
                return choice
        return cluster.least_loaded(d.pool, d.avoid, exclude, room)

    # ------------------------------------------------------------------ showing it

    def status(self) -> dict[str, Any] | None:
        """Keys and bytes protected, the budget and its use, the seconds protected and
        those still at risk."""
        ctx = self.ctx
        settings = self.settings
        if settings is None:
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
            "keys": len(self.protected),
            "reserved_bytes": choice.spent if choice is not None else 0,
            "held_bytes": held,
            "keys_held": keys,
            "seconds_protected": round(seconds, 3),
            "seconds_at_risk": round(ctx.costs.total_at_risk(), 3),
            "left_out": choice.left_out if choice is not None else 0,
            "left_out_seconds": round(choice.left_out_seconds, 3) if choice else 0.0,
            "budget_exhausted": self.exhausted,
            "examined_limit_reached": self.truncated,
            "choosing": self._gathering is not None,
            "choice_cycles": self.slices,
            "in_flight": len(ctx.ledger.asked_by(self.name)),
            "copies_requested": self.copies,
            "would_copy": self.would_copy,
            "dry_run": self.dry_run,
        }

    def explain(self, ts: Any, now: float) -> dict[str, Any] | None:
        """Whether the key is protected, and if not, why."""
        if self.settings is None:
            return None
        key = ts.key
        claim = self.protected.get(key)
        if claim is not None:
            flying = self.ctx.ledger.in_flight(key)
            return {
                "protected": True,
                "copies": claim.keeps,
                "in_flight": sorted(a for a, c in flying.items() if c.by == self.name),
            }
        return {"protected": False, "why": self._why_not(ts)}

    def _why_not(self, ts: Any) -> str:
        ctx = self.ctx
        settings = self.settings
        assert settings is not None
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
                f"recompute ≈ {duration(seconds)}, below min-recompute "
                f"{duration(settings.min_recompute)}"
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
        _, seconds, _ = self.held
        return {
            "keys": float(len(self.protected)),
            "bytes": float(self.last.spent if self.last is not None else 0),
            "budget_bytes": float(self.budget),
            "seconds": seconds,
            "copies": float(self.copies),
        }


__all__ = ["ProtectSection", "SOURCE"]
