"""Random clusters and keys for the pure planners' property tests (hypothesis strategies).

Every draw is a small integer or a bit mask, decoded here: far cheaper to generate than
nested sets and dictionaries (thousands of examples fit the CI budget), and still
shrinking towards small clusters, few copies and plain targets. :func:`scenarios` draws
workers (hosts, pools, running / paused / retiring, memory) and keys (targets exact,
``{min, max}`` or ``all`` in either bound, ``pool``, ``avoid``, ``spread``, ``move``, copies
on live and departed workers, waiters and dependents processing, copies in flight with
live or expired deadlines, workers backed off, what other policies had accepted in the
same cycle, copies the demand hold keeps). What was asked goes through the engine's
ledger, brought to the planning time as a cycle brings it
(:meth:`~amm_rules.engine.state.ledger.Ledger.expire`): the views hold what it leaves in
flight, backing off and just landed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from amm_rules.engine.decide.plan import PlanSettings
from amm_rules.engine.decide.view import KeyView, WorkerView
from amm_rules.engine.state.ledger import Ledger
from amm_rules.language.ruleset import ALL, Desired, Reason, Target

NOW = 1_000.0
SETTINGS = PlanSettings(now=NOW, inflight_timeout=10.0)
POOLS = ("gpu", "spot", "big")
HOSTS = ("h0", "h1", "h2", "h3")
#: A worker that held copies or had copies in flight and has since left.
GONE = "gone"

STATUSES = ("running", "running", "running", "running", "paused", "closing")
DEADLINES = (NOW - 5.0, NOW, NOW + 0.5, NOW + 5.0)
SPREADS = (None, None, "host", "none")
MOVES = (None, None, None, "allowed", "never")
KINDS = ("rule", "annotation", "runtime", "scatter broadcast")

worker_specs = st.lists(
    st.tuples(
        st.integers(0, len(HOSTS) - 1),
        st.integers(0, len(STATUSES) - 1),
        st.integers(0, 2 ** len(POOLS) - 1),
        st.integers(0, 1_000),
    ),
    min_size=1,
    max_size=8,
)
#: (replicate kind: none, exact n, {min, max}, all, {min, max: all}; exact n, min,
#: max - min or -1, pool mask, avoid mask, spread, move, reason kind)
wish_specs = st.tuples(
    st.integers(0, 4),
    st.integers(1, 6),
    st.integers(1, 4),
    st.integers(-1, 3),
    st.integers(0, 2 ** len(POOLS) - 1),
    st.integers(0, 2 ** len(POOLS) - 1),
    st.integers(0, len(SPREADS) - 1),
    st.integers(0, len(MOVES) - 1),
    st.integers(0, len(KINDS) - 1),
)
MASK = st.integers(0, 2**9 - 1)
#: (holders, inflight, inflight deadlines, backoff, backoff deadlines, busy, pending
#: add, pending drop, nbytes, waiters, held by the demand hold)
key_specs = st.tuples(
    st.integers(1, 2**9 - 1),
    MASK,
    st.integers(0, 4**9 - 1),
    MASK,
    st.integers(0, 4**9 - 1),
    MASK,
    MASK,
    MASK,
    st.integers(0, 300),
    st.integers(0, 3),
    MASK,
)


def pools_of(mask: int) -> tuple[str, ...]:
    return tuple(p for i, p in enumerate(POOLS) if mask >> i & 1)


def decode_workers(specs: list[tuple[int, int, int, int]]) -> list[WorkerView]:
    return [
        WorkerView(f"w{i}", HOSTS[h], STATUSES[st_], frozenset(pools_of(p)), mem)  # type: ignore[arg-type]
        for i, (h, st_, p, mem) in enumerate(specs)
    ]


def decode_wish(spec: tuple[int, ...]) -> Desired:
    kind, n, lo, extra, pool, avoid, spread, move, why = spec
    fields: dict[str, Any] = {
        "replicate": (
            None
            if kind == 0
            else Target.exact(n)
            if kind == 1
            else Target(lo, None if extra < 0 else lo + extra)
            if kind == 2
            else Target.exact(ALL)
            if kind == 3
            else Target(lo, ALL)
        ),
        "pool": pools_of(pool) or None,
        "avoid": pools_of(avoid) or None,
        "spread": SPREADS[spread],
        "move": MOVES[move],
    }
    fields = {k: v for k, v in fields.items() if v is not None}
    if not fields:  # the policy plans governed keys only
        fields["replicate"] = Target.exact(2)
    return Desired(reasons={f: Reason(KINDS[why], "r") for f in fields}, **fields)


def decode_key(
    name: str,
    addresses: list[str],
    wish: tuple[int, ...],
    spec: tuple[int, ...],
    closing: frozenset[str] = frozenset(),
) -> KeyView:
    everywhere = [*addresses, GONE]

    def members(mask: int) -> set[str]:
        return {a for i, a in enumerate(everywhere) if mask >> i & 1}

    def timed(mask: int, digits: int) -> dict[str, float]:
        return {
            a: DEADLINES[digits >> 2 * i & 3] for i, a in enumerate(everywhere) if mask >> i & 1
        }

    (
        holders_m,
        inflight_m,
        inflight_t,
        backoff_m,
        backoff_t,
        busy_m,
        add_m,
        drop_m,
        nb,
        wt,
        held_m,
    ) = spec
    holders = members(holders_m) or {everywhere[0]}
    live = holders - {GONE}
    pending_drop = members(drop_m) & live
    if pending_drop and pending_drop == live:  # the AMM never lets the last copy go
        pending_drop.discard(min(pending_drop))
    ledger = Ledger()
    for address, deadline in timed(inflight_m, inflight_t).items():
        ledger.record(name, address, "replication", deadline)
    for address, until in timed(backoff_m, backoff_t).items():
        ledger.back_off(name, (address,), until)
    staying = set(addresses) - closing
    ledger.expire(NOW, SETTINGS.inflight_timeout, lambda key: live, staying.__contains__)
    return KeyView(
        key=name,
        desired=decode_wish(wish),
        holders=frozenset(holders),
        nbytes=nb,
        waiters=wt,
        busy=frozenset(members(busy_m) & live),
        inflight={a: c.deadline for a, c in ledger.in_flight(name).items()},
        backoff=dict(ledger.backing_off(name)),
        pending_add=frozenset(members(add_m) - holders - {GONE}),
        pending_drop=frozenset(pending_drop),
        held=frozenset(members(held_m) & live),
        landed=ledger.just_landed(name),
    )


@st.composite
def scenarios(
    draw: st.DrawFn, max_keys: int = 6, pending: bool = True
) -> tuple[list[WorkerView], list[KeyView]]:
    workers = decode_workers(draw(worker_specs))
    addresses = [w.address for w in workers]
    specs = draw(st.lists(st.tuples(wish_specs, key_specs), min_size=1, max_size=max_keys))
    closing = frozenset(w.address for w in workers if w.status == "closing")
    views = [decode_key(f"k{i}", addresses, w, k, closing) for i, (w, k) in enumerate(specs)]
    if not pending:
        views = [replace(v, pending_add=frozenset(), pending_drop=frozenset()) for v in views]
    return workers, views


reduce_flags = st.booleans()
