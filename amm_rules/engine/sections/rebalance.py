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

from collections.abc import Collection, Generator, Hashable
from typing import Any

from distributed.active_memory_manager import Suggestion

from amm_rules.engine.dryrun import DryRun
from amm_rules.engine.rebalance.rebalancer import Rebalancer
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

    @property
    def moving(self) -> Collection[Hashable]:
        """Keys with a move in flight: other trimming must leave their copies alone."""
        return self.rebalancer.moving

    def run(self, cycle: Cycle) -> Any:
        if self.rebalancer.idle:
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

    def status(self) -> dict[str, Any]:
        return self.rebalancer.status()

    def explain(self, ts: Any, now: float) -> dict[str, Any] | None:
        return self.rebalancer.explain(ts.key, now)
