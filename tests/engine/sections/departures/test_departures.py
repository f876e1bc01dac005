"""Workers leaving, said when it happens: a worker process killed with SIGKILL (as the
kernel's out-of-memory killer does) gives a ``worker-left`` event naming the keys that
fell below their target and those that lost their last copy; status and its text show
the latest departures, and what the engine is repairing since."""

from __future__ import annotations

import operator
import os
import signal
import sys

import dask
import pytest
from distributed import Client
from distributed.utils_test import gen_test

from amm_rules.engine.sections.departures import WorkerDepartures
from amm_rules.engine.words import counted
from amm_rules.observe.status import status_report
from amm_rules.observe.text import render_status
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, events, holders, policy_of, process_cluster, rules

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")

RULES = rules({"name": "two", "match": 'task.prefix == "held"', "replicate": 2})


@gen_test(timeout=120)
async def test_a_killed_worker_is_told_with_what_it_took() -> None:
    with dask.config.set(amm_config(RULES)):
        async with (
            process_cluster(3) as cluster,
            Client(cluster, asynchronous=True) as c,
        ):
            s = cluster.scheduler
            victim, other, third = sorted(s.workers)
            held = [
                c.submit(
                    operator.mul, f"held-{i}".encode(), 100, key=f"held-{i}", workers=[victim]
                )
                for i in range(3)
            ]
            solo = c.submit(operator.mul, b"solo", 100, key="solo-1", workers=[victim])
            await c.gather([*held, solo])
            await wait_for(
                lambda: all(len(holders(s, f.key)) == 2 for f in held), "two copies each"
            )
            # Held keys whose second copy is elsewhere now fall to one copy; solo-1 (no
            # rule) had its only copy there.
            below = sorted(f.key for f in held if victim in holders(s, f.key))
            assert below and holders(s, "solo-1") == {victim}
            nbytes = sum(s.tasks[k].nbytes for k in below)
            solo_bytes = s.tasks["solo-1"].nbytes
            pids = await c.run(os.getpid, workers=[victim])
            os.kill(pids[victim], signal.SIGKILL)
            await wait_for(
                lambda: [e for e in events(s, "worker-left") if e["worker"] == victim],
                "a worker-left event for the killed worker",
            )
            report = status_report(policy_of(s))
            (event,) = [e for e in events(s, "worker-left") if e["worker"] == victim]
            assert event["retired"] is False
            assert (event["below"], sorted(event["below_keys"])) == (len(below), below)
            assert event["below_bytes"] == nbytes
            assert (event["lost"], event["lost_keys"]) == (1, ["solo-1"])
            assert event["lost_bytes"] == solo_bytes
            (entry,) = report["workers_left"]["recent"]
            assert entry["worker"] == victim and entry["below"] == len(below)
            text = render_status(report)
            n = len(below)
            assert f"left         {victim} left just now: {counted(n, 'key')} below target" in text
            assert "1 key lost its last copy" in text
            # While the rule is being repaired, the conformance line says since when.
            repairing = {
                **report,
                "conformance": {
                    **report["conformance"],
                    "rules": [
                        {**r, "state": "in-progress"} if r["name"] == "two" else r
                        for r in report["conformance"]["rules"]
                    ],
                },
            }
            assert f"  in progress since {victim} left just now: {n} key" in render_status(
                repairing
            )
            # A retirement is a departure too, with nothing below target.
            await wait_for(lambda: all(len(holders(s, f.key)) == 2 for f in held), "repaired")
            await c.retire_workers([third])
            await wait_for(
                lambda: [e for e in events(s, "worker-left") if e["worker"] == third],
                "a worker-left event for the retired worker",
            )
            (retired,) = [e for e in events(s, "worker-left") if e["worker"] == third]
            assert (retired["retired"], retired["below"], retired["lost"]) == (True, 0, 0)
            departures = policy_of(s).section(WorkerDepartures)
            assert departures.metrics() == {"left": 2.0, "lost_keys": 1.0}
