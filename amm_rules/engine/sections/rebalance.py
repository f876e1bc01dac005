"""The rebalance section: the ``rebalance:`` part of the rules in the policy's cycle.

The work is the :class:`~amm_rules.engine.rebalance.rebalancer.Rebalancer`'s, which lives
as long as the policy (hot reloads keep its moves in flight, in the engine's ledger);
its suggestions are held back by dry-run and journalled here. The section holds the key
of each move in flight (:mod:`amm_rules.engine.state.claims`: its copies stay, so that
no other section drops the new copy and undoes the move) until the move settles.

The section also rebalances for ``adaptive: balance`` (:attr:`Ruleset.balance
<amm_rules.language.ruleset.Ruleset.balance>`) while adaptive scaling asked the target
within :data:`ADAPTING_SECONDS` (the adaptive section records when, in the context): the
rebalancer then works with the settings the headroom gives, and with the file's again
once adaptive scaling stopped asking.

Neighbours: :mod:`amm_rules.engine.rebalance` plans and settles the moves.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Hashable
from typing import TYPE_CHECKING, Any

from distributed.active_memory_manager import Suggestion

from amm_rules.engine.decide.view import key_string
from amm_rules.engine.dryrun import DryRun
from amm_rules.engine.rebalance.rebalancer import EXAMPLES_KEPT, Rebalancer
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.language.ruleset import RebalanceSettings, Ruleset

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext

#: Seconds since adaptive scaling last asked the scheduler its target within which
#: ``adaptive: balance`` rebalances (adaptive asks every second by default).
ADAPTING_SECONDS = 30.0


class RebalanceSection(Section):
    """Rebalancing by the rules (see the module docstring)."""

    name = "rebalance"
    status_key = "rebalance"
    explain_key = "rebalance"

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        #: The ``rebalance:`` section at work; kept across reloads (moves in flight,
        #: kept in the ledger).
        self.rebalancer = rebalancer = Rebalancer(ctx.ledger.moves)
        rebalancer.reads = ctx.index.demand.reads
        rebalancer.flow = ctx.flow.published
        rebalancer.costs = ctx.costs.published
        rebalancer.spans = ctx.spans
        #: The file's ``rebalance:`` settings, and those of ``adaptive: balance`` (None:
        #: the file's rebalancing is on, or the adaptive section does not balance).
        self.settings = RebalanceSettings()
        self.balance: RebalanceSettings | None = None
        #: The rebalancer works with :attr:`balance` (adaptive scaling is running).
        self.balancing = False

    def configure(self, ruleset: Ruleset, dry_run: DryRun) -> None:
        self.settings, self.balance = ruleset.rebalance, ruleset.balance
        self._follow_adaptive(self.ctx.clock(), reloaded=True)

    def wants_balance(self, now: float) -> bool:
        """The rules balance for the adaptive section, and adaptive scaling asked the
        target within :data:`ADAPTING_SECONDS`."""
        at = self.ctx.adapting_at
        return self.balance is not None and at is not None and now - at <= ADAPTING_SECONDS

    def _follow_adaptive(self, now: float, reloaded: bool = False) -> None:
        """Work with ``adaptive: balance``'s settings while adaptive scaling asks the
        target, with the file's otherwise (``reloaded``: the settings are new); an
        event says when balancing starts or stops."""
        balance = self.balance
        on = self.wants_balance(now)
        changed = on != self.balancing
        if not (changed or reloaded):
            return
        self.balancing = on
        settings = balance if on and balance is not None else self.settings
        self.rebalancer.configure(settings, self._match_error)
        if changed:
            room = balance.recipient_max if balance is not None else None
            self.ctx.events.emit("balance", balancing=on, room=room)

    def _match_error(self, exc: Exception) -> None:
        self.ctx.events.rule_error("rebalance.match", exc)

    def run(self, cycle: Cycle) -> Any:
        self._follow_adaptive(cycle.now)
        if self.rebalancer.idle:
            return ()
        return self._run(cycle)

    def _run(self, cycle: Cycle) -> Generator[Suggestion, Any, None]:
        ctx = self.ctx
        index = ctx.index
        rebalancer = self.rebalancer
        moves = rebalancer.run(
            ctx.scheduler,
            ctx.manager,
            now=cycle.now,
            desired=index.desired,
            inflight=ctx.ledger.copies,
            cluster=ctx.cluster_view,
            stats=cycle.stats,
            adopt=self._adopt_copy,
            # Keys on disk stay where they are (read from the context, empty without
            # spill: in the rules).
            on_disk=ctx.spilled.is_on_disk if ctx.spilled else None,
        )
        # The journal records every move, those dry-run holds back as such (``dry-run``).
        held = ctx.dry_run.rebalance_label(index.desired)
        journaled = ctx.journal.rebalancing(moves, rebalancer.book.pending, held)
        yield from ctx.dry_run.rebalancing(journaled, index.desired, cycle.stats)
        self._hold_moves()

    def _hold_moves(self) -> None:
        """Hold the keys of the moves in flight (their copies stay), and let go of those
        of the moves settled."""
        claims = self.ctx.claims
        pending = self.rebalancer.book.pending
        held = claims.of(self.name)
        gone = [key for key in held if key not in pending]
        if gone:
            claims.release(self.name, gone)
        for key, p in pending.items():
            if key not in held:
                claims.hold(
                    key,
                    self.name,
                    f"a move from {p.sender} to {p.recipient}",
                    alone=False,
                )

    def _adopt_copy(self, key: Hashable, worker: str) -> None:
        """A move given up after its copy landed on ``worker`` (the key's replication
        target came first): the copy is the key's own now, planned next cycle as a copy
        of the engine's that just landed, so that a trim takes it last (no drop from the
        worker a copy was just sent to)."""
        ctx = self.ctx
        if key in ctx.index.desired:
            # In flight as far as the ledger knows: found landed at the next cycle.
            ctx.ledger.record(key, worker, self.name, ctx.clock() + ctx.inflight_timeout)

    def cycle_summary(self, into: dict[str, Any]) -> bool:
        """This cycle's facts for the ``cycle`` event (see Rebalancer.cycle_summary)."""
        return self.rebalancer.cycle_summary(into)

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
            "balancing": self.balancing,
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
