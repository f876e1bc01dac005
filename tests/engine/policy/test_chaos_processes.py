"""Chaos with real worker processes: a worker process is killed with SIGKILL, as the
kernel's out-of-memory killer or a failing machine would, and its nanny starts a new one.

The in-process chaos tests (``tests/engine/policy/test_chaos.py``) imitate a crash by cutting the
worker's connections; here the operating system does it. What must hold is the same:
no held key loses its data while fewer holders than its target die at once, targets
come back (the new worker counts as soon as it joins), no held key is recomputed, and
results stay correct.
"""

from __future__ import annotations

import operator
import os
import signal
import sys

import dask
import pytest
from distributed import Client
from distributed.utils_test import gen_test

from benchmarks.support.chaos import busiest_holders, held_rules, lost, wait_for_targets
from benchmarks.support.waiting import wait_for
from tests.support.cluster import TransitionCounter, amm_config, policy_of, process_cluster

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")

N = 2
KEYS = [f"held-{i}" for i in range(16)]
#: Bytes of a held key: its name repeated, so that every key's data is distinct.
REPEAT = 2_000


@gen_test(timeout=280)
async def test_sigkill_of_worker_processes_loses_no_held_key() -> None:
    # Builtins only: worker processes cannot import this test module.
    with dask.config.set(amm_config(held_rules(N), inflight_timeout=2.0)):
        async with (
            process_cluster(4) as cluster,
            Client(cluster, asynchronous=True) as c,
        ):
            s = cluster.scheduler
            executions = TransitionCounter.on(s)
            held = {k: c.submit(operator.mul, k.encode(), REPEAT, key=k) for k in KEYS}
            await c.gather(list(held.values()))
            await wait_for_targets(s, KEYS, N, max_cycles=400)

            for round_ in range(2):
                # A computation over the held keys runs while the process dies.
                pairs = [(KEYS[i], KEYS[(i * 5 + 3) % len(KEYS)]) for i in range(len(KEYS))]
                sums = [
                    c.submit(operator.add, held[a], held[b], key=f"sum-{round_}-{i}")
                    for i, (a, b) in enumerate(pairs)
                ]
                (victim,) = busiest_holders(s, KEYS, 1)
                pids = await c.run(os.getpid, workers=[victim])
                os.kill(pids[victim], signal.SIGKILL)
                await wait_for(lambda v=victim: v not in s.workers, "the killed worker gone")
                assert lost(s, KEYS) == []
                await wait_for_targets(s, KEYS, N, max_cycles=400)
                results = await c.gather(sums)
                assert results == [a.encode() * REPEAT + b.encode() * REPEAT for a, b in pairs]
                del sums

            # The nannies brought the cluster back to four workers, and the new ones
            # took copies like any other worker.
            await wait_for(lambda: len(s.workers) == 4, "four workers again")
            await wait_for_targets(s, KEYS, N, max_cycles=400)
            assert await c.gather([held[k] for k in KEYS]) == [k.encode() * REPEAT for k in KEYS]
            assert {k: executions.processing[k] for k in KEYS} == dict.fromkeys(KEYS, 1)
            assert policy_of(s).cycles > 0
