"""distributed's own replication calls, made durable (docs/policy.md, "client.replicate
and scatter(broadcast=True)", and docs/rules.md, "legacy-replicate").

``Client.replicate(futures, n=N)`` and ``Client.scatter(..., broadcast=True)`` reach the
scheduler as its ``replicate`` and ``scatter`` handlers. Stock ``Scheduler.replicate``
deletes copies above ``n`` itself, and the stock AMM's ReduceReplicas drops every extra
copy within a cycle. With ``legacy-replicate: honour`` (the default), :class:`LegacyCalls`
wraps both (the handler table and the scheduler's attributes) and turns each call into a
runtime target of the engine (origins :data:`REPLICATE` and :data:`BROADCAST`). Once it
holds the scheduler's replica lock (``retire_workers`` holds it while it may remove
workers), the call sets its target, then makes its first copies with its own tree of
``gather_on_worker`` calls, only where the engine would keep them (pools, ``avoid``,
under ``spread: host`` one per host without a copy: :func:`spread_recipients`; none for
``move: never``), and never deletes. While it copies a key the section holds it
(:mod:`amm_rules.engine.state.claims`), so that the engine and the call never copy the
same key at once. Calls the engine cannot honour go to the stock handler unchanged.

While the AMM runs no cycle, and with ``legacy-replicate: ignore``, the calls are the
stock ones; a stock call replaces the target an earlier call had set on its keys (no
cycle would trim it), and switching to ``ignore`` removes them all. Keys whose wishes
are in dry-run get their target recorded and the stock call unchanged.

Neighbours: targets live in :attr:`amm_rules.engine.state.index.KeyIndex.runtime` next
to those of ``amm_rules.replicate``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from amm_rules.engine.adapters import worker_status
from amm_rules.engine.features import FLOOR, Feature, Need, scheduler_methods
from amm_rules.engine.sections.base import Section
from amm_rules.engine.wrapping import wrap_methods
from amm_rules.language.fields import MAX_REPLICAS
from amm_rules.language.ruleset import ALL, Ruleset, Target

if TYPE_CHECKING:
    from amm_rules.engine.context import EngineContext
    from amm_rules.engine.decide.view import ClusterView
    from amm_rules.engine.dryrun import DryRun

logger = logging.getLogger(__name__)

#: Origins of the targets this module sets (see ``RuntimeTarget.origin``).
REPLICATE = "client.replicate"
BROADCAST = "scatter broadcast"
ORIGINS = (REPLICATE, BROADCAST)


class LegacyCalls(Section):
    """The ``replicate`` and ``scatter`` wrappers of one policy."""

    offline = (
        "legacy-replicate: not simulated: no client calls replicate or scatter in a simulation "
        "(the targets they set are replayed)"
    )
    name = "legacy-replicate"
    FEATURES = (
        Feature(
            "legacy-replicate",
            (
                *scheduler_methods("replicate", "scatter", "gather_on_worker"),
                Need(
                    "Scheduler._replica_lock",
                    "distributed",
                    FLOOR,
                    lambda s: s is None or hasattr(s, "_replica_lock"),
                ),
            ),
        ),
    )
    status_key = "legacy_replicate"
    explain_key = "copying"

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        #: Keys a call is copying right now (a count: calls may overlap); the section
        #: holds them while the count is above 0.
        self.copying: Counter[Hashable] = Counter()
        #: Calls honoured since the policy started, by origin.
        self.calls: Counter[str] = Counter()
        self._replicate: Callable[..., Any] | None = None
        self._unwrap: Callable[[], None] | None = None

    @property
    def honouring(self) -> bool:
        """Whether calls are honoured now: ``legacy-replicate: honour``, and the AMM runs
        its cycles (stopped, nothing would trim nor keep: the calls are the stock ones)."""
        ctx = self.ctx
        return (
            ctx.attached
            and ctx.index.active
            and ctx.ruleset.legacy_replicate == "honour"
            and ctx.amm_running.running
        )

    def configure(self, ruleset: Ruleset, dry_run: DryRun) -> None:
        """Switching to ``legacy-replicate: ignore`` removes the targets the calls set."""
        if ruleset.legacy_replicate == "ignore":
            self.forget_targets()

    def detach(self) -> None:
        if self._unwrap is not None:
            self._unwrap()
            self._unwrap = None

    def explain(self, ts: Any, now: float) -> bool:
        """Whether a ``replicate`` or ``scatter`` call is copying the key now."""
        return ts.key in self.copying

    # ------------------------------------------------------------------ install

    def attach(self) -> None:
        """Wrap the scheduler's ``replicate`` and ``scatter`` (undone at detach)."""
        scheduler = self.ctx.scheduler
        replicate = self._replicate = scheduler.replicate
        scatter = scheduler.scatter

        async def replicate_honoured(
            keys: list[Hashable],
            n: int | None = None,
            workers: Iterable[str] | None = None,
            branching_factor: int = 2,
            delete: bool = True,
            stimulus_id: str | None = None,
        ) -> Any:
            stock = dict(
                n=n,
                workers=workers,
                branching_factor=branching_factor,
                delete=delete,
                stimulus_id=stimulus_id,
            )
            if not self.honouring:
                self._superseded(keys)
            elif await self._honour(keys, REPLICATE, stock):
                return None
            return await replicate(keys=keys, **stock)  # the stock call, answer or error

        async def scatter_honoured(
            data: dict[Hashable, Any],
            workers: Iterable[str] | None = None,
            client: str | None = None,
            broadcast: bool | int = False,
            timeout: float = 2,
        ) -> Any:
            honour = bool(broadcast) and self.honouring
            keys = await scatter(
                data=data,
                workers=workers,
                client=client,
                broadcast=False if honour else broadcast,
                timeout=timeout,
            )
            if not honour:
                if broadcast:
                    self._superseded(keys)
                return keys
            n = None if broadcast is True else broadcast
            stock = {"n": n, "workers": workers}  # what the stock scatter asks of replicate
            if not await self._honour(keys, BROADCAST, stock):
                await replicate(keys=keys, **stock)
            return keys

        wrappers: dict[str, Callable[..., Any]] = {
            "replicate": replicate_honoured,
            "scatter": scatter_honoured,
        }
        self._unwrap = wrap_methods(scheduler, wrappers, {name: name for name in wrappers})

    # ------------------------------------------------------------------ calls

    def _target(self, n: Any, workers: Iterable[str] | None) -> Target | None:
        """The target a call asks for, on the workers of now; None if it is not one (the
        stock call then answers: ``n=0``, or no running worker among those named, is its
        "Can not use replicate to delete data")."""
        scheduler = self.ctx.scheduler
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            return None
        if workers is None:
            if not scheduler.running:
                return None
            return Target.exact(ALL if n is None else min(n, MAX_REPLICAS))
        try:
            addresses = scheduler.workers_list(list(workers))
            running = [a for a in addresses if worker_status(scheduler.workers[a]) == "running"]
        except (KeyError, TypeError):
            return None  # the stock call reports the unknown worker
        if not running:
            return None
        return Target.exact(len(running) if n is None else min(n, len(running)))

    def _all_in_memory(self, keys: Iterable[Hashable]) -> bool:
        tasks = self.ctx.scheduler.tasks
        try:
            return all((ts := tasks.get(k)) is not None and ts.who_has for k in keys)
        except TypeError:  # an unhashable key: the stock call says what it says
            return False

    def _superseded(self, keys: Iterable[Hashable]) -> None:
        """A stock call (no cycle runs, or ``ignore``) replaces the target an earlier
        call had set on its keys: the last call says how many copies the key holds."""
        ctx = self.ctx
        if not ctx.index.active:
            return
        runtime = ctx.index.runtime
        try:
            gone = [k for k in keys if (t := runtime.get(k)) is not None and t.origin in ORIGINS]
        except TypeError:  # an unhashable key: the stock call says what it says
            return
        for key in gone:
            ctx.set_runtime_target(key, None)

    async def _honour(self, keys: Iterable[Hashable], origin: str, stock: dict[str, Any]) -> bool:
        """Honour a call on ``keys`` (see the module docstring); False if it is not one
        to honour (no target, keys not in memory): the stock call answers it. ``stock``:
        the arguments of the stock ``replicate`` call besides the keys, which the keys
        whose wishes are in dry-run get exactly (the engine only reports their target)."""
        ctx = self.ctx
        workers = stock.get("workers")
        async with ctx.scheduler._replica_lock(("replicate", object())):  # not reentrant
            target = self._target(stock.get("n"), workers)
            if target is None or not self._all_in_memory(keys):
                return False  # (unhashable keys too: the stock call says what it says)
            keys = list(dict.fromkeys(keys))
            self.copying.update(keys)  # the engine leaves them alone until the call is done
            for key in keys:
                ctx.claims.hold(key, self.name, f"a {origin} call copies it")
            try:
                for key in keys:
                    ctx.set_runtime_target(key, target, origin)  # classified at the next cycle
                self.calls[origin] += 1
                logger.debug("amm-rules: %s set %s on %d keys", origin, target, len(keys))
                groups, dry = self._copy_groups(keys, target, workers)
                branching = stock.get("branching_factor", 2)
                await asyncio.gather(
                    *(
                        self._copy(group, recipients, n, branching)
                        for (recipients, n), group in groups.items()
                    )
                )
                self._log_call(keys, groups, branching)
            except BaseException:
                self._done(keys)
                raise
        try:
            if dry:
                assert self._replicate is not None
                await self._replicate(keys=dry, **stock)  # takes the lock itself
        finally:
            self._done(keys)
        return True

    def _done(self, keys: list[Hashable]) -> None:
        """A call's keys are the engine's again."""
        self.copying.subtract(keys)
        done = [key for key in keys if self.copying[key] <= 0]
        for key in done:
            del self.copying[key]
        self.ctx.claims.release(self.name, done)
        # Classified by now or soon: look at them again once the call is done.
        index = self.ctx.index
        index.look_again(k for k in keys if k in index.desired)

    def _copy_groups(
        self, keys: list[Hashable], target: Target, workers: Iterable[str] | None
    ) -> tuple[dict[tuple[tuple[str, ...], int], list[Hashable]], list[Hashable]]:
        """Keys by (where the call may copy them, how many copies to reach there); and
        the keys in dry-run, which the stock call copies as it would without amm-rules."""
        ctx = self.ctx
        scheduler = ctx.scheduler
        ctx.refresh_pools()
        cluster = ctx.cluster_view()
        only = set(scheduler.workers_list(list(workers))) if workers is not None else None
        groups: dict[tuple[tuple[str, ...], int], list[Hashable]] = {}
        dry: list[Hashable] = []
        for key in keys:
            ts = scheduler.tasks.get(key)
            if ts is None or not ts.who_has:
                continue
            desired = ctx.resolve(ts)  # with the target just set
            if ctx.dry_run.label(desired) is not None:
                dry.append(key)
                continue
            if desired.move == "never":
                continue  # `move: never` wins: amm-rules neither copies nor drops it
            recipients = cluster.recipients(desired.pool, desired.avoid)
            if only is not None:
                recipients = recipients & only
            placeable = cluster.placeable(desired.pool, desired.avoid)
            lo, _ = target.bounds(len(placeable))
            if desired.spread == "host":
                # The stock call picks its workers at random: choose them here, by the
                # rules, so that no copy lands on a host that holds one already.
                held = {w.address for w in ts.who_has} & placeable
                chosen = spread_recipients(held, recipients, lo - len(held), cluster)
                if chosen:
                    where = tuple(sorted(held | set(chosen)))
                    groups.setdefault((where, len(where)), []).append(key)
                continue
            n = min(lo, len(recipients))
            if n > 0:
                groups.setdefault((tuple(sorted(recipients)), n), []).append(key)
        return groups, dry

    async def _copy(
        self, keys: list[Hashable], recipients: tuple[str, ...], n: int, branching_factor: int
    ) -> None:
        """Copy ``keys`` until each has ``n`` copies on ``recipients``, as the stock call's
        tree does and without its deletions: in rounds, each holder the source of at
        most ``branching_factor`` new copies per round, on recipients chosen at random
        among those still running. A round that lands no copy ends the call's part
        (a recipient that left, a holder that cannot send): the engine goes on."""
        scheduler = self.ctx.scheduler
        todo = keys
        while todo:
            running = {
                a
                for a in recipients
                if (ws := scheduler.workers.get(a)) and worker_status(ws) == "running"
            }
            gathers: dict[str, dict[Hashable, list[str]]] = defaultdict(dict)
            left = []
            for key in todo:
                ts = scheduler.tasks.get(key)
                if ts is None or ts.state != "memory" or not ts.who_has:
                    continue
                holders = {ws.address for ws in ts.who_has}
                free = sorted(running - holders)
                count = min(n - len(holders & running), branching_factor * len(holders), len(free))
                if count <= 0:
                    continue
                for address in random.sample(free, count):
                    gathers[address][key] = sorted(holders)
                left.append(key)
            if not gathers:
                return
            failed = await asyncio.gather(
                *(scheduler.gather_on_worker(w, who_has) for w, who_has in gathers.items())
            )
            for address, who_has in gathers.items():
                scheduler.log_event(address, {"action": "replicate-add", "who_has": who_has})
            if all(len(f) == len(gathers[w]) for f, w in zip(failed, gathers, strict=True)):
                return
            todo = left

    def _log_call(
        self,
        keys: list[Hashable],
        groups: dict[tuple[tuple[str, ...], int], list[Hashable]],
        branching_factor: int,
    ) -> None:
        """The scheduler event the stock call logs for every call."""
        workers = sorted({a for recipients, _ in groups for a in recipients})
        self.ctx.scheduler.log_event(
            "all",
            {
                "action": "replicate",
                "workers": workers,
                "key-count": len(keys),
                "branching-factor": branching_factor,
            },
        )

    # ------------------------------------------------------------------ rules

    def forget_targets(self) -> None:
        """Remove the targets these calls had set (``legacy-replicate: ignore``)."""
        index = self.ctx.index
        gone = [k for k, t in index.runtime.items() if t.origin in ORIGINS]
        for key in gone:
            index.set_runtime_target(key, None)

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.ctx.ruleset.legacy_replicate,
            "calls": dict(self.calls),
            "copying": len(self.copying),
            "targets": sum(1 for t in self.ctx.index.runtime.values() if t.origin in ORIGINS),
        }


def spread_recipients(
    held: set[str], recipients: Collection[str], missing: int, cluster: ClusterView
) -> list[str]:
    """Up to ``missing`` workers among ``recipients`` for new copies of a key held on
    ``held``, under ``spread: host``: one per host that holds no copy yet, the least
    loaded first; then, when hosts run out, the least loaded of the others (the
    planner's fallback too: copies on shared hosts rather than none)."""
    if missing <= 0:
        return []
    hosts = {cluster.host(a) for a in held}
    ranked = sorted(set(recipients) - held, key=lambda a: (cluster.memory.get(a, 0), a))
    chosen: list[str] = []
    for address in ranked:
        host = cluster.host(address)
        if host not in hosts:
            hosts.add(host)
            chosen.append(address)
            if len(chosen) == missing:
                return chosen
    rest = [a for a in ranked if a not in chosen]
    return chosen + rest[: missing - len(chosen)]
