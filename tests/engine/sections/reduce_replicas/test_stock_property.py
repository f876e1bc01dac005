"""For keys no rule governs, RulesPolicy asks for the drops the stock ``ReduceReplicas``
asks for, on random cluster states of a real scheduler (hypothesis).

Each example draws, on four workers: keys and the workers holding them; dependents
processing on chosen workers (which fetch a copy there if they need one) and dependents
not yet assigned (waiting for an input that is not ready), a few or more than twenty;
and the workers' states (running, paused, retiring: ``closing_gracefully``). The state
is built on a real scheduler with the AMM stopped, then handed to the stock policy and
to RulesPolicy (an empty rules file) in turn, one cycle each with nothing sent to the
workers. Each key must lose as many copies with both, each from a holder where no
dependent processes, and RulesPolicy must ask for no copy. Which worker gives a copy
up may differ where workers are equally loaded: the AMM takes the most loaded holder
and lowers its load as it accepts each drop, and the two walk the keys in different
orders (the stock policy in the scheduler's set order, RulesPolicy in the order the
keys gained copies). Where else the two differ on purpose (docs/policy.md, "Keys no
rule governs"): targets set by distributed's own ``replicate`` and
``scatter(broadcast=...)`` (not drawn here), keys the classification budget has not
reached, and the ``demand:`` hold (off here).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import Any

import pytest
from distributed import Event
from distributed.active_memory_manager import ActiveMemoryManagerExtension, ReduceReplicas
from distributed.core import Status
from distributed.utils_test import gen_cluster
from hypothesis import event, given, settings
from hypothesis import strategies as st

from amm_rules.engine.policy import RulesPolicy
from benchmarks.support.waiting import wait_for
from tests.support.cluster import Requests, amm_config, rules

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

WORKERS = 4
STATES = (Status.running, Status.paused, Status.closing_gracefully)
CONFIG = {
    **amm_config(start=False),
    # Memory by managed bytes: both runs see the same loads.
    "distributed.scheduler.active-memory-manager.measure": "managed",
}

#: Per key: its holders (a bit mask of the workers), the workers where a dependent
#: processes, and how many dependents wait unassigned (0 to 3, or 25: more than the
#: stock policy counts one by one).
keys_ = st.lists(
    st.tuples(
        st.integers(1, 2**WORKERS - 1),
        st.lists(st.integers(0, WORKERS - 1), max_size=2),
        st.sampled_from([0, 0, 1, 2, 3, 25]),
    ),
    min_size=1,
    max_size=6,
)
#: Per worker: running, paused or retiring (running twice as often).
states_ = st.lists(st.sampled_from([0, 0, 1, 2]), min_size=WORKERS, max_size=WORKERS)


def gate(x: Any, name: str) -> Any:
    Event(name).wait()
    return x


def drops(requests: Requests) -> Counter[tuple[str, Hashable]]:
    return Counter(requests.remove)


def per_key(asked: Counter[tuple[str, Hashable]]) -> Counter[Hashable]:
    return Counter(key for (_, key), n in asked.items() for _ in range(n))


def holders(ts: Any) -> list[str]:
    return sorted(ws.address for ws in ts.who_has or ())


def busy(ts: Any) -> set[str]:
    return {w.processing_on.address for w in ts.waiters or () if w.processing_on is not None}


async def build(c: Any, s: Any, addresses: list[str], keys: list[Any]) -> list[Any]:
    """The drawn keys, dependents and waiters on the cluster; what must be kept."""
    kept: list[Any] = []
    later = c.submit(gate, 0, "go", key="later", pure=False)  # an input never ready in time
    expected: dict[str, tuple[int, int]] = {}
    for i, (mask, processing_on, unassigned) in enumerate(keys):
        holders = [a for j, a in enumerate(addresses) if mask >> j & 1]
        key = f"k-{i}"
        (future,) = (await c.scatter({key: i}, workers=holders[:1])).values()
        if len(holders) > 1:
            await c.replicate([future], n=len(holders), workers=holders)  # the stock call
        readers = [
            c.submit(gate, future, "go", key=f"r-{i}-{n}", workers=[addresses[j]], pure=False)
            for n, j in enumerate(processing_on)
        ]
        waiting = [c.submit(sum, [future, later], key=f"w-{i}-{n}") for n in range(unassigned)]
        expected[key] = (len(readers), len(waiting))
        kept += [future, *readers, *waiting]

    def ready() -> bool:
        for key, (readers, waiting) in expected.items():
            waiters = s.tasks[key].waiters or ()
            if sum(1 for w in waiters if w.processing_on is not None) != readers:
                return False
            if sum(1 for w in waiters if w.state == "waiting") != waiting:
                return False
        return True

    # One wait per example: the test's poll budget is the sum of its deadlines.
    await wait_for(ready, "dependents processing and waiting as drawn", timeout=10)
    return [*kept, later]


def one_cycle(s: Any, policy: Any) -> tuple[Counter[tuple[str, Hashable]], Counter[Any]]:
    """One cycle of an AMM running ``policy`` alone: its drops and copies, not sent."""
    requests = Requests(s, forward=False)
    try:
        ActiveMemoryManagerExtension(s, {policy}, register=False, start=False).run_once()
    finally:
        requests.stop()
    return drops(requests), Counter(requests.acquire)


@settings(max_examples=15)
@given(keys_, states_)
def test_drops_of_keys_no_rule_governs_are_the_stock_drops(keys, states) -> None:
    @gen_cluster(client=True, nthreads=[("", 1)] * WORKERS, config=CONFIG, timeout=60)
    async def run(c, s, *workers):
        addresses = [w.address for w in workers]
        kept = await build(c, s, addresses, keys)
        for address, state in zip(addresses, states, strict=True):
            if STATES[state] != Status.running:
                s.handle_worker_status_change(STATES[state], address, stimulus_id="test")
        stock, _ = one_cycle(s, ReduceReplicas())
        ours = RulesPolicy(rules(), classify_seconds=None, audit_interval=None)
        try:
            mine, copies = one_cycle(s, ours)
        finally:
            ours.detach()
        event("some drops" if stock else "no drop")
        event("the same workers" if mine == stock else "other workers, equally loaded")
        tasks = [s.tasks[f"k-{i}"] for i in range(len(keys))]
        state = {ts.key: (holders(ts), len(ts.waiters or ())) for ts in tasks}
        said = f"state: {state}\nstock: {stock}\nours: {mine}"
        # As many drops of each key; each from a holder where no dependent processes.
        assert per_key(mine) == per_key(stock), said
        for address, key in mine:
            ts = s.tasks[key]
            assert address in holders(ts) and address not in busy(ts), said
        assert not copies
        for address in addresses:
            s.handle_worker_status_change(Status.running, address, stimulus_id="test")
        await Event("go").set()
        del kept

    run()
