"""Reduce-replicas for the keys no rule governs: the stock ``ReduceReplicas`` arithmetic.

amm-rules removes distributed's own ``ReduceReplicas`` policy (it would undo every
replication target) and applies the same reduction here to the keys nobody governs, when
the rules file's ``reduce-replicas`` is on, sparing what the claims keep
(:mod:`amm_rules.engine.state.claims`). :meth:`ReduceReplicasSection.run` returns the
:func:`reduce_replicas` generator itself, for the policy to delegate to directly: every
suggestion passes through each generator between the AMM and the one yielding it, and
this one yields a drop per excess copy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Generator, Iterable, Mapping
from typing import Any

from distributed.active_memory_manager import Suggestion

from amm_rules.engine.adapters import kept_copies, stock_waiter_count
from amm_rules.engine.decide.plan import DEFAULT_SOURCE, reduce_replicas_excess
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.engine.state.claims import Claims
from amm_rules.engine.state.demand import DemandTracker
from amm_rules.engine.state.index import KeyIndex

if Suggestion._fields == ("op", "ts", "candidates"):
    _new_tuple = tuple.__new__

    def _drop_suggestion(ts: Any) -> Suggestion:
        """``Suggestion("drop", ts)``, built as that NamedTuple's own ``__new__`` builds
        it after binding its arguments in Python, which costs more than the rest of
        reduce-replicas' work for a key."""
        return _new_tuple(Suggestion, ("drop", ts, None))

else:  # pragma: no cover - another layout of Suggestion in a later distributed

    def _drop_suggestion(ts: Any) -> Suggestion:
        return Suggestion("drop", ts)


def reduce_replicas(
    index: KeyIndex,
    pending: Mapping[Any, Any],
    claims: Claims,
    stats: dict[str, Counter[str]],
    now: float = 0.0,
    away: Container[str] = (),
) -> Generator[Suggestion, Any, None]:
    """The stock ReduceReplicas, for keys nobody governs: keep one copy plus one per
    worker where waiters of the key run (see :func:`~amm_rules.engine.adapters.stock_waiter_count`),
    taking into account what other policies had accepted in this cycle. It walks
    the keys nobody governs that hold several copies (``index.replicated_free``),
    which is the scheduler's ``replicated_tasks`` without the governed keys.

    ``pending`` is the AMM's ``manager.pending``; ``claims`` the keys other sections
    hold (a move drops its extra copy itself); ``stats`` gets the drops, under the
    ungoverned label. Copies the ``demand:`` hold keeps at time ``now`` are never
    dropped (see :meth:`~amm_rules.engine.state.demand.DemandTracker.held_copies`);
    those a claim keeps are kept on workers that stay first (``away``: the workers the
    sections send away)."""
    replicated = index.replicated_free
    demand: DemandTracker = index.demand
    # Keys read recently (only with a demand hold): the few that need a closer look.
    last_read = demand.last_read if demand.settings.hold > 0 else None
    # Keys left over by the classification budget: a rule may yet govern them. The
    # backlog's keys are passed over until it is through (which of them were reached
    # is not known per key); all of them entered memory a few cycles ago at most.
    unclassified = index.dirty
    backlog = index.backlog
    stale = []
    dropped = 0
    # This loop runs for every replicated key each cycle (120,000 drops at a million
    # keys in the scale benchmark), so it is the stock policy's loop plus only
    # what the index needs: no copy of the table (nothing can change it while the
    # AMM drives this generator: the AMM only records suggestions), set lookups
    # only when the sets are not empty, and no candidate set (None: any holder,
    # as the stock policy; the AMM copies ``who_has`` itself and picks the most
    # loaded holder). The suggestion is built once per key (see _drop_suggestion).
    drop_suggestion = _drop_suggestion
    claimed = claims.held
    for key, ts in replicated.items():
        who_has = ts.who_has
        # (Governed keys are never here: KeyIndex.put takes them out.) Only a key in
        # memory has copies, so this also finds keys that left memory.
        if who_has is None or len(who_has) < 2:
            stale.append(key)
            continue
        kept = 0
        if claimed and key in claimed:
            kept = claims.keeps(key)
            if len(who_has) <= kept:
                # Held for no fewer copies than it has: out of the walk until it gains a
                # copy or the hold changes (either makes it touched).
                stale.append(key)
                continue
            if claims.keeping(key) is not None:
                continue  # held whole (a move drops its extra copy itself)
        if (unclassified and key in unclassified) or (backlog and key in backlog):
            continue  # not classified yet
        if ts.waiters:
            excess = reduce_replicas_excess(len(who_has), stock_waiter_count(ts))
        else:
            excess = len(who_has) - 1  # the same arithmetic, without waiters
        entry = pending.get(ts)
        if entry is not None:
            # What other policies had the AMM accept for the key in this cycle.
            excess += len(entry[0]) - len(entry[1])
        if excess <= 0:
            continue
        drop = drop_suggestion(ts)
        if kept:
            spared = kept_copies(who_has, kept, away)
            excess = min(excess, len(who_has) - len(spared))
            if excess <= 0:
                continue
            drop = Suggestion("drop", ts, {ws for ws in who_has if ws.address not in spared})
        if last_read and key in last_read:
            held = demand.held_copies(ts, now)
            if held:
                spare = {ws for ws in who_has if ws.address not in held}
                excess = min(excess, len(spare))
                drop = Suggestion("drop", ts, spare)
        for _ in range(excess):
            if (yield drop) is not None:
                dropped += 1
    index.drop_free(stale)
    if dropped:
        stats[DEFAULT_SOURCE]["dropped"] += dropped


class ReduceReplicasSection(Section):
    """The stock reduction for the keys no rule governs (see the module docstring)."""

    name = "reduce-replicas"

    def run(self, cycle: Cycle) -> Iterable[Suggestion]:
        ctx = self.ctx
        if not ctx.ruleset.reduce_replicas:
            return ()
        away = ctx.departures.workers
        return reduce_replicas(
            ctx.index, ctx.amm.pending, ctx.claims, cycle.stats, ctx.clock(), away
        )
