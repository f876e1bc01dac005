"""Rebalancing with the default ``optimistic`` measure, on worker processes (each with
its own memory, which in-process workers do not have): data scattered to one worker is
spread to the others, nothing is lost, and the section reports the measure it used.
"""

from __future__ import annotations

import dask
import numpy as np
from distributed import Client
from distributed.utils_test import gen_test

from amm_rules.engine.sections.rebalance import RebalanceSection
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, holders, policy_of, process_cluster
from tests.support.rulesets import rules

MiB = 2**20
#: 30 keys of 4 MiB on one worker of three, each with a 1 GiB limit.
KEYS = 30
SIZE = 4 * MiB


@gen_test(timeout=240)
async def test_the_default_optimistic_measure_rebalances_worker_processes() -> None:
    section = {"enabled": True, "sender-min": "5%", "gap": "4%"}
    config = amm_config(rules(rebalance=section), summary_interval=0)
    config.update({f"distributed.worker.memory.{k}": False for k in ("target", "spill", "pause")})
    with dask.config.set(config):
        async with (
            process_cluster(3) as cluster,
            Client(cluster, asynchronous=True) as c,
        ):
            s = cluster.scheduler
            policy = policy_of(s)
            assert policy.section(RebalanceSection).status()["measure"] == "optimistic"
            (full, *others) = sorted(s.workers)
            data = await c.scatter(
                {f"x-{i}": np.full(SIZE // 8, float(i)) for i in range(KEYS)}, workers=[full]
            )

            def spread() -> list[int]:
                return [sum(addr in holders(s, k) for k in data) for addr in (full, *others)]

            await wait_for(
                lambda: policy.rebalancer.totals["done"] >= 5 and min(spread()[1:]) > 0,
                "keys moved to both other workers",
                timeout=60,
                show=spread,
            )
            await wait_for(
                lambda: not policy.rebalancer.book.pending, "the moves in flight done", timeout=60
            )
            assert sum(spread()) == KEYS  # one copy each: moved, not copied
            values = await c.gather(list(data.values()))
            assert [float(v[0]) for v in values] == [float(i) for i in range(KEYS)]
