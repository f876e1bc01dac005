"""The rebalance section: the ``rebalance:`` part of the rules in the policy's cycle.

It runs after replication (whose copies count in the loads and whose keys stay put)
and before reduce-replicas (which must spare keys mid-move, :attr:`RebalanceSection.moving`).
The work is the :class:`~amm_rules.engine.rebalance.rebalancer.Rebalancer`'s, which lives
as long as the policy (hot reloads keep its moves in flight); its suggestions are held
back by dry-run and journalled here.

Neighbours: :mod:`amm_rules.engine.rebalance` plans and settles the moves; the
replication section defers trimming a key in :attr:`RebalanceSection.moving`.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Generator, Hashable
from typing import Any

from distributed.active_memory_manager import Suggestion

from amm_rules.engine.decide.view import key_string
from amm_rules.engine.dryrun import DryRun
from amm_rules.engine.rebalance.rebalancer import EXAMPLES_KEPT, Rebalancer
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.language.ruleset import Ruleset


class RebalanceSection(Section):
    """Rebalancing by the rules (see the module docstring)."""

    name = "rebalance"
    status_key = "rebalance"
    explain_key = "rebalance"

    def __init__(self) -> None:
        #: The ``rebalance:`` section at work; kept across reloads (moves in flight).
        self.rebalancer = Rebalancer()

    def configure(self, ruleset: Ruleset, dry_run: DryRun) -> None:
        self.rebalancer.configure(ruleset.rebalance, self._match_error)

    def _match_error(self, exc: Exception) -> None:
        if self.ctx is not None:
            self.ctx.events.rule_error("rebalance.match", exc)

    def attach(self, ctx: Any) -> None:
        super().attach(ctx)
        self.rebalancer.reads = ctx.index.demand.reads
        self.rebalancer.flow = ctx.flow.published
        self.rebalancer.costs = ctx.costs.published

    @property
    def moving(self) -> Collection[Hashable]:
        """Keys with a move in flight: other trimming must leave their copies alone."""
        return self.rebalancer.moving

    def run(self, cycle: Cycle) -> Any:
        if self.rebalancer.idle:
            if self.ctx is not None:
                self.ctx.index.moving = {}
            return ()
        return self._run(cycle)

    def _run(self, cycle: Cycle) -> Generator[Suggestion, Any, None]:
        ctx = self.ctx
        assert ctx is not None
        index = ctx.index
        rebalancer = self.rebalancer
        moves = rebalancer.run(
            ctx.scheduler,
            ctx.manager,
            now=cycle.now,
            desired=index.desired,
            inflight=index.inflight,
            cluster=ctx.cluster_view,
            stats=cycle.stats,
            adopt=self._adopt_copy,
        )
        # The journal records every move, those dry-run holds back as such (``dry-run``).
        held = ctx.dry_run.rebalance_label(index.desired)
        journaled = ctx.journal.rebalancing(moves, rebalancer.book.pending, held)
        yield from ctx.dry_run.rebalancing(journaled, index.desired, cycle.stats)
        # The moves in flight now (the book's table is a new one after each settling):
        # a copy landing wakes the policy for its drop.
        index.moving = rebalancer.book.pending

    def _adopt_copy(self, key: Hashable, worker: str) -> None:
        """A move given up after its copy landed on ``worker`` (the key's replication
        target came first): the copy is the key's own now, planned next cycle as a copy
        of the engine's that just landed, so that a trim takes it last (no drop from the
        worker a copy was just sent to)."""
        ctx = self.ctx
        assert ctx is not None
        if key in ctx.index.desired:
            deadline = ctx.clock() + ctx.inflight_timeout
            ctx.index.inflight.setdefault(key, {})[worker] = deadline

    def cycle_summary(self) -> dict[str, Any]:
        """This cycle's facts for the ``cycle`` event (see Rebalancer.cycle_summary)."""
        return self.rebalancer.cycle_summary()

    def explain(self, ts: Any, now: float) -> dict[str, Any] | None:
        """Whether the key is mid-move or cooling down; ``None`` if neither."""
        book = self.rebalancer.book
        p = book.pending.get(ts.key)
        if p is not None:
            return {
                "moving": True,
                "sender": p.sender,
                "recipient": p.recipient,
                "nbytes": p.nbytes,
                "landed": p.landed is not None,
                "seconds": round(now - p.started, 3),
            }
        if ts.key in book.cooling(now):
            return {"moving": False, "cooling": True}
        return None

    def status(self) -> dict[str, Any]:
        """The ``rebalance`` section of ``amm_rules_status``: settings, the last plan
        (roles, skipped keys by reason, why it stopped), moves in flight, totals."""
        r = self.rebalancer
        s, plan, settled, book = r.settings, r.last_plan, r.last_settlement, r.book
        out: dict[str, Any] = {
            "enabled": s.enabled,
            "measure": s.measure,
            "sender_min": s.sender_min,
            "recipient_max": s.recipient_max,
            "gap": s.gap,
            "max_bytes_per_cycle": s.max_bytes_per_cycle,
            "match": s.match_source,
            "cool_down": s.cooldown,
            "copy_timeout": s.copy_timeout,
            "drop_timeout": s.drop_timeout,
            "in_flight": len(book.pending),
            "in_flight_bytes": sum(p.nbytes for p in book.pending.values()),
            "cooling": len(book.cooling(time.monotonic())),
            "totals": dict(r.totals),
            "void_reasons": dict(r.void_reasons),
            "last_plan": None,
            "last_settle": None,
        }
        if plan is not None:
            out["last_plan"] = {
                "moves": len(plan.moves),
                "bytes": plan.bytes,
                "budget": plan.budget,
                "mean": plan.mean,
                "stopped": plan.stopped,
                "roles": dict(plan.roles),
                "skipped": dict(plan.skipped),
                "examples": [
                    {"key": key_string(e.key), "sender": e.sender, "reason": e.reason}
                    for e in plan.examples[:EXAMPLES_KEPT]
                ],
            }
        if settled is not None:
            out["last_settle"] = {
                "drops": len(settled.drops),
                "done": len(settled.done),
                "void": [
                    {
                        "key": key_string(p.key),
                        "sender": p.sender,
                        "recipient": p.recipient,
                        "reason": reason,
                    }
                    for p, reason in settled.void[:EXAMPLES_KEPT]
                ],
            }
        return out
