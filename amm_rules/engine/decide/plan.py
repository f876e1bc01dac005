"""The decision logic of amm-rules: what to copy and what to drop, for one key at a time.

:func:`plan_key` is a pure function of a :class:`~amm_rules.engine.decide.view.KeyView` (the key's
copies, resolved wishes, in-flight copies, waiters) and a
:class:`~amm_rules.engine.decide.view.ClusterView` (workers, their pools and memory). It returns a
:class:`KeyPlan`: the actions to take, each naming the exact worker and carrying its
reason, plus what the key's state is (copies counted, eligible workers, unmet target).
What is in flight is the engine's ledger (:mod:`amm_rules.engine.state.ledger`), brought
to the cycle's time before anything plans and copied into the view: the planner counts
it and never writes it (the replication section records the copies the AMM accepts).

:mod:`amm_rules.engine.sections.replication` turns actions into AMM ``Suggestion``s with the
chosen worker as the only candidate, so the AMM validates each decision but does not
second-guess it;
the planner picks workers the way the AMM would (least memory for a copy; paused or
retiring workers first, then most memory, for a drop), so that plans are deterministic
and testable without a cluster. :mod:`amm_rules.engine.handlers` runs the same planner, with
nothing enacted, to answer "why is this key on these workers?". Which workers may take a
copy is also :mod:`amm_rules.engine.decide.deciders`' table, which explains per worker;
a property test holds this fast path to it.

Keys that no rule governs follow the stock ReduceReplicas arithmetic
(:func:`reduce_replicas_excess`), applied by the policy on the scheduler's
``replicated_tasks``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from amm_rules.engine.decide.view import ClusterView, KeyView
from amm_rules.language.plurals import plural
from amm_rules.language.ruleset import Desired, Target

#: Counter label of targets that come from the reduce-replicas default, not a field.
DEFAULT_SOURCE = "(reduce-replicas)"


@dataclass(frozen=True)
class PlanSettings:
    """Knobs of the planner that are not in the rules."""

    #: Current time (seconds, the same clock as in-flight deadlines).
    now: float
    #: How long a requested copy counts as in flight before it is given up (the
    #: deadline of the copies planned; the ledger gives them up).
    inflight_timeout: float = 10.0
    #: The ruleset's ``reduce-replicas``: keys without a replication target keep one
    #: copy plus those their waiters need.
    reduce_replicas: bool = True


@dataclass(frozen=True)
class Action:
    """One copy to create or drop, on one worker, and why."""

    op: Literal["replicate", "drop"]
    key: Hashable
    worker: str
    #: Human words: ``"below replicate=3 (rule precious)"``, ``"outside pool gpu"``...
    reason: str
    #: Counter label: the rule name, ``(annotation)``, ``(runtime)`` or the default.
    source: str


@dataclass
class KeyPlan:
    """The planner's answer for one key."""

    key: Hashable
    actions: list[Action] = field(default_factory=list)
    #: Effective bounds: keep at least ``lo`` copies, at most ``hi`` (None: no trim).
    lo: int = 0
    hi: int | None = None
    #: Counter label of the replication target.
    source: str = DEFAULT_SOURCE
    #: Landed copies on eligible workers (inside the pool, not avoided, not retiring).
    good: frozenset[str] = frozenset()
    #: Landed copies that should move: address -> why (outside pool, avoided, retiring).
    misplaced: dict[str, str] = field(default_factory=dict)
    #: Workers that may hold a copy of the key (allowed and not retiring).
    eligible: int = 0
    #: Why the target is not met after this plan, if it is not.
    unmet: str | None = None
    #: Why an action that is due was not taken this cycle.
    deferred: list[str] = field(default_factory=list)
    #: Copies counted in flight after this plan (the ledger's and the new ones):
    #: address -> deadline. The replication section takes out those the AMM refuses.
    inflight: dict[str, float] = field(default_factory=dict)
    #: Workers not to ask again before a time (the ledger's back-offs).
    backoff: Mapping[str, float] = field(default_factory=dict)
    #: Copies of the engine's that landed since the key was last planned.
    landed: frozenset[str] = frozenset()
    #: The key is left alone entirely (``move: never``).
    frozen: bool = False

    @property
    def replicas(self) -> list[str]:
        return [a.worker for a in self.actions if a.op == "replicate"]

    @property
    def drops(self) -> list[str]:
        return [a.worker for a in self.actions if a.op == "drop"]


def source_label(desired: Desired, name: str) -> str:
    """Counter label of the field ``name`` of a resolved key."""
    reason = desired.reasons.get(name)
    if reason is None:
        return DEFAULT_SOURCE
    if reason.kind == "rule":
        return reason.rule or "?"
    return f"({reason.kind})"


def target_bounds(
    desired: Desired, waiters: int, reduce_replicas: bool, eligible: int
) -> tuple[int, int | None]:
    """``(lo, hi)`` for a governed key, ``all`` standing for the ``eligible`` workers
    (those that may hold a copy that counts: inside the pool, outside avoided pools,
    not retiring). Without ``replicate``, a key keeps one copy, trimmed as
    ReduceReplicas would (one plus what its waiters need) when reduce-replicas is on,
    never trimmed otherwise."""
    if desired.replicate is not None:
        return desired.replicate.bounds(eligible)
    if reduce_replicas:
        return 1, max(1, waiters)
    return 1, None


def needed_copies(target: Target | None, eligible: int) -> int:
    """The copies a key keeps at least: its target's ``min`` (``all``: the ``eligible``
    workers), 1 without a target (the ``lo`` of :func:`target_bounds`)."""
    return target.bounds(eligible)[0] if target is not None else 1


def reduce_replicas_excess(
    holders: int, waiters: int, pending_add: int = 0, pending_drop: int = 0
) -> int:
    """Copies the stock ReduceReplicas would drop from a key nobody governs.

    ``waiters`` is :func:`amm_rules.engine.adapters.stock_waiter_count`; ``pending_*`` count
    what other policies had the AMM accept for the key earlier in the same cycle.
    """
    return holders - max(1, waiters) + pending_add - pending_drop


def plan_key(key: KeyView, cluster: ClusterView, settings: PlanSettings) -> KeyPlan:
    """Decide the copies to create and drop for one governed key.

    The cases, in order:

    1. ``move: never``: nothing, ever.
    2. Copies asked for earlier and still in flight (the ledger's) count toward the
       target, and no worker backing off is asked.
    3. Split the landed copies into good ones (on allowed workers that are not
       retiring) and misplaced ones.
    4. Add copies on eligible running workers until ``lo`` is counted (landed good
       plus in flight), then, with ``spread: host``, until the copies cover as many
       hosts as they can. No eligible worker: the target is unmet, nothing is asked.
       Under spread, a copy whose only new host is a worker another policy is dropping
       the key from in this cycle waits a cycle for it, rather than going to a shared
       host now and being moved next cycle.
    5. Drop misplaced copies once the good copies alone hold the target (a move:
       copy first, drop after the copy landed), or when they exceed ``hi``.
    6. Trim good copies above ``hi``: duplicated hosts first (spread), then paused,
       then not the copy just landed, then the most loaded. Never below ``lo``; for
       a key without a replication target, never a copy the demand hold keeps.
    7. Never drop the last copy; never drop where a dependent is processing (the AMM
       would refuse): that drop waits for a later cycle.

    This runs for every key to plan, up to a million in one AMM cycle, and most keys
    already hold their target: each case's helper is called only when the case can
    apply, so such a key pays for no call, set or closure that it does not use.
    """
    d = key.desired
    plan = KeyPlan(key=key.key)

    # 1. move: never.
    if d.move == "never":
        return _frozen(plan, key)

    holders = frozenset(a for a in key.holders if a in cluster.workers) - key.pending_drop

    # 2. Copies in flight and workers backing off.
    inflight = dict(key.inflight) if key.inflight else {}
    backoff = key.backoff
    plan.landed = key.landed

    # 3. Good and misplaced copies (``all`` in the target counts the eligible workers).
    placeable = cluster.placeable(d.pool, d.avoid)
    lo, hi = target_bounds(d, key.waiters, settings.reduce_replicas, len(placeable))
    plan.lo, plan.hi = lo, hi
    plan.source = source_label(d, "replicate")
    good = frozenset(a for a in holders if a in placeable)
    if len(good) < len(holders):
        for addr in holders - good:
            plan.misplaced[addr] = _misplaced(addr, d, cluster)[0]
    plan.good = good
    plan.eligible = len(placeable)
    counted = set(good) | set(inflight) | (key.pending_add & placeable)

    # 4. Add copies: below the target, or (spread) on fewer hosts than it could be.
    spread = d.spread == "host"
    host_goal = _host_goal(lo, good, cluster, d) if spread else 0
    if spread or len(counted) < lo:
        _add_copies(plan, key, cluster, settings, counted, inflight, backoff, spread, host_goal)
    if len(counted) < lo:
        plan.unmet = _unmet_reason(lo, counted, placeable, backoff, cluster)

    # Cases 5 and 6 drop landed copies only, and keep to case 7 through ``remaining``.
    trim = hi is not None and len(good) > hi
    if plan.misplaced or trim:
        remaining = set(holders)
        # 5. Misplaced copies.
        if plan.misplaced:
            _drop_misplaced(plan, key, cluster, holders, remaining)
        # 6. Good copies above hi.
        if trim:
            _trim(plan, key, cluster, counted, remaining, spread, host_goal)

    plan.inflight = inflight
    plan.backoff = backoff
    return plan


def _frozen(plan: KeyPlan, key: KeyView) -> KeyPlan:
    """Case 1, ``move: never``: the copies stay exactly where they are, so the bounds
    are what the key holds and no action, in-flight copy or backoff is kept."""
    plan.frozen = True
    plan.lo = plan.hi = len(key.holders)
    plan.good = key.holders
    plan.source = source_label(key.desired, "move")
    return plan


def _host_goal(lo: int, good: frozenset[str], cluster: ClusterView, d: Desired) -> int:
    """With ``spread: host``, how many hosts the copies should cover: one per copy of
    the target, but no more than the hosts that can hold one (those of the recipients,
    and those of the good copies, paused workers included)."""
    reachable = cluster.recipient_hosts(d.pool, d.avoid) | {cluster.host(a) for a in good}
    return min(lo, len(reachable))


def _add_copies(
    plan: KeyPlan,
    key: KeyView,
    cluster: ClusterView,
    settings: PlanSettings,
    counted: set[str],
    inflight: dict[str, float],
    backoff: Mapping[str, float],
    spread: bool,
    host_goal: int,
) -> None:
    """Case 4: copies on the least loaded eligible workers not holding one, until
    ``lo`` copies are counted and (spread) ``host_goal`` hosts covered.

    Each copy is added to ``counted`` and ``inflight`` and its size to the worker's
    memory tally, so that the next pick, here and for the next keys of the cycle,
    sees it (as the AMM does).
    """
    d = key.desired
    lo = plan.lo
    hosts = {cluster.host(a) for a in counted}
    # A worker with the copy still in flight is not asked again: it already counts
    # (and asking it twice would not add a copy, so the loop would ask a third worker).
    exclude = set(key.holders) | key.pending_add | backoff.keys() | inflight.keys()
    while True:
        short = lo - len(counted)
        host_short = host_goal - len(hosts)
        if short <= 0 and host_short <= 0:
            break
        if d.replicate:
            reason, source = f"below replicate={lo} ({plan.source})", plan.source
        else:
            # No target of its own: the copy moves the key where its pool or avoid wants it.
            reason, source = "no copy on an eligible worker", placement_source(d, plan.source)
        choice = None
        if spread:
            choice = cluster.least_loaded(
                d.pool, d.avoid, exclude, lambda a: cluster.host(a) not in hosts
            )
            if choice is not None and short <= 0:
                reason = "spread: host"
                source = source_label(d, "spread")
        if choice is None and short > 0:
            if (
                spread
                and key.pending_drop
                and _wait_for_dropped_host(plan, key, cluster, hosts, backoff, short)
            ):
                break
            choice = cluster.least_loaded(d.pool, d.avoid, exclude)
        if choice is None:
            break
        plan.actions.append(Action("replicate", key.key, choice, reason, source))
        cluster.add_memory(choice, key.nbytes)
        inflight[choice] = settings.now + settings.inflight_timeout
        counted.add(choice)
        exclude.add(choice)
        hosts.add(cluster.host(choice))


def _wait_for_dropped_host(
    plan: KeyPlan,
    key: KeyView,
    cluster: ClusterView,
    hosts: set[str],
    backoff: Mapping[str, float],
    short: int,
) -> bool:
    """Case 4, ``spread: host``, no recipient on a new host: True (and the wait noted
    in :attr:`KeyPlan.deferred`) if each missing copy can go to a new host next cycle,
    because another policy is dropping, in this cycle, the copy of a worker that would
    otherwise take one there.

    A second copy on a host that holds one now would be moved off it as soon as that
    worker is free, a cycle later: three transfers instead of one, and a drop from the
    worker just copied to. The drop is known to be over by the next cycle (the
    scheduler forgets a dropped copy as soon as the AMM asks for the drop), unlike a
    worker paused or backing off, for which the copy is made on a shared host at once.
    """
    recipients = cluster.recipients(key.desired.pool, key.desired.avoid)
    waiting: dict[str, str] = {}
    for addr in sorted(key.pending_drop):
        host = cluster.host(addr) if addr in cluster.workers else None
        if host is not None and host not in hosts and addr in recipients and addr not in backoff:
            waiting.setdefault(host, addr)
    if not waiting or short > len(waiting):
        return False
    for addr in sorted(waiting.values()):
        plan.deferred.append(
            f"copy waits a cycle for {addr}: another policy is dropping its copy there, "
            "on a host without another copy (spread: host)"
        )
    return True


def _drop(
    plan: KeyPlan,
    key: KeyView,
    cluster: ClusterView,
    remaining: set[str],
    addr: str,
    reason: str,
    source: str,
) -> None:
    """One drop, taken off ``remaining`` (so that case 7 sees it) and off the worker's
    memory tally (so that later choices of the cycle see it)."""
    plan.actions.append(Action("drop", key.key, addr, reason, source))
    remaining.discard(addr)
    cluster.add_memory(addr, -key.nbytes)


def _drop_misplaced(
    plan: KeyPlan,
    key: KeyView,
    cluster: ClusterView,
    holders: frozenset[str],
    remaining: set[str],
) -> None:
    """Case 5: drop copies outside the pool, in an avoided pool or on a retiring worker.

    All of them once the good copies alone hold the target (or one copy on every
    eligible worker, and at least one copy): until then the misplaced copies are what
    keeps the key's replicas, and a move is a copy first and a drop once it landed.
    Before that, only the copies above ``hi``.
    """
    d = key.desired
    hi = plan.hi
    need_good = max(1, min(plan.lo, plan.eligible))
    if len(plan.good) >= need_good:
        n_bad = len(plan.misplaced)
    elif hi is not None:
        n_bad = min(len(plan.misplaced), len(holders) - hi)
    else:
        n_bad = 0
    busy = key.busy
    for addr in sorted(plan.misplaced, key=lambda a: _drop_rank(a, cluster, plan.landed)):
        if n_bad <= 0:
            break
        if len(remaining) <= 1:  # 7. never the last copy
            break
        if addr in busy:
            plan.deferred.append(f"drop from {addr} waits: a dependent is processing there")
            continue
        reason, name = _misplaced(addr, d, cluster)
        _drop(plan, key, cluster, remaining, addr, reason, source_label(d, name))
        n_bad -= 1


def _trim(
    plan: KeyPlan,
    key: KeyView,
    cluster: ClusterView,
    counted: set[str],
    remaining: set[str],
    spread: bool,
    host_goal: int,
) -> None:
    """Case 6: drop good copies above ``hi``, one at a time, re-ranking after each.

    Duplicated hosts go first under spread; then :func:`_drop_rank`. A copy where a
    dependent is processing stays (7), and so, under spread, does one whose host the
    copies need: case 4 would copy the key back there next cycle.
    """
    hi = plan.hi
    assert hi is not None
    busy = key.busy
    keep = set(plan.good)
    # Copies that will count next cycle besides the landed good ones (in flight,
    # added by other policies): spread is judged on all of them, as case 4 does.
    coming = counted - plan.good
    # The demand hold (keys without a replication target only): good copies a
    # dependent read recently are kept, above hi if need be.
    held = key.held & keep if key.desired.replicate is None else frozenset()
    excess = len(keep) - max(hi, len(held))
    while excess > 0 and len(remaining) > 1:
        dup_hosts = _duplicated_hosts(keep, cluster) if spread else set()
        choices = [a for a in keep if a not in busy and a not in held]
        if not choices:
            plan.deferred.append("trim waits: dependents are processing on every holder")
            break
        if spread:
            # Never thin out a host that spread needs: case 4 would copy the key
            # back there next cycle (ping-pong). Happens when the copies on shared
            # hosts cannot be dropped because dependents are processing there.
            choices = [
                a
                for a in choices
                if cluster.host(a) in dup_hosts
                or len({cluster.host(b) for b in (keep | coming) - {a}}) >= host_goal
            ]
            if not choices:
                plan.deferred.append(
                    "trim waits: dependents are processing on the copies that share a host"
                )
                break
        victim = min(
            choices,
            key=lambda a: (
                cluster.host(a) not in dup_hosts,
                *_drop_rank(a, cluster, plan.landed),
            ),
        )
        why = "spread: host" if cluster.host(victim) in dup_hosts else "above max"
        reason = f"{why}: {len(keep)} copies, replicate max {hi} ({plan.source})"
        _drop(plan, key, cluster, remaining, victim, reason, plan.source)
        keep.discard(victim)
        excess -= 1


def _drop_rank(
    addr: str, cluster: ClusterView, landed: frozenset[str]
) -> tuple[bool, bool, int, str]:
    """Sort key, smallest dropped first: paused or retiring workers first (as the AMM
    does), a copy that just landed last (no ping-pong), then the most loaded."""
    return (
        cluster.workers[addr].status == "running",
        addr in landed,
        -cluster.memory[addr],
        addr,
    )


def _duplicated_hosts(addresses: set[str], cluster: ClusterView) -> set[str]:
    seen: set[str] = set()
    dup: set[str] = set()
    for a in addresses:
        h = cluster.host(a)
        (dup if h in seen else seen).add(h)
    return dup


def _misplaced(addr: str, d: Desired, cluster: ClusterView) -> tuple[str, str]:
    """Why a landed copy is misplaced, and the field that says so."""
    w = cluster.workers[addr]
    if d.pool is not None and w.pools.isdisjoint(d.pool):
        return f"outside pool {','.join(d.pool)}", "pool"
    if d.avoid is not None and not w.pools.isdisjoint(d.avoid):
        return f"in avoided pool {','.join(sorted(w.pools & set(d.avoid)))}", "avoid"
    return "worker is retiring", "replicate"


def placement_source(d: Desired, default: str) -> str:
    """Counter label of the rule placing a key (its ``pool``, else its ``avoid``, else
    ``default``)."""
    for name in ("pool", "avoid"):
        if getattr(d, name) is not None:
            return source_label(d, name)
    return default


def _unmet_reason(
    lo: int,
    counted: set[str],
    placeable: frozenset[str],
    backoff: Mapping[str, float],
    cluster: ClusterView,
) -> str:
    """``"wants 3 copies, holds 2: 2 eligible workers (1 paused); 4 not eligible"``."""
    paused = sum(1 for a in placeable if cluster.workers[a].status == "paused")
    parts = [f"{len(placeable)} eligible {plural(len(placeable), 'worker')}"]
    extra = []
    if paused:
        extra.append(f"{paused} paused")
    if backoff:
        extra.append(f"{len(backoff)} backing off after a timed-out copy")
    if extra:
        parts[0] += f" ({', '.join(extra)})"
    others = len(cluster.workers) - len(placeable)
    if others:
        parts.append(f"{others} outside the pool, avoided or retiring")
    wanted = f"wants {lo} {plural(lo, 'copy')}"
    return f"{wanted}, holds or awaits {len(counted)}: " + "; ".join(parts)
