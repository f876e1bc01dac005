"""The screenshot of the dashboard page in ``docs/dashboard.md``, taken from a real run:

    python -m tests.support.screenshot docs/dashboard.png

A scheduler with the ``amm_rules.preload`` preload and four workers in this process
(two of them GPU workers, with small memory limits so that the bars show), the rules of
:data:`RULES` from a file, data that the rules satisfy, cannot satisfy, and that
rebalancing spreads (caught halfway); a fifth worker holding copies that leaves; then an
``amm`` annotation that cannot be used, a drain of a worker, and a rules file changed into one that does not
validate, so that the events show. Once the page shows
all of it, headless Chromium (:mod:`tests.support.browser`) takes the picture.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
from pathlib import Path

import dask
import numpy as np
from distributed import Client, Scheduler, Worker

from tests.support.browser import Browser

RULES = """\
version: 1
pools:
  gpu: worker.resources.GPU >= 1
rules:
  - name: precious
    match: task.prefix == "precious"
    replicate: 2
  - name: device-arrays
    match: task.prefix == "device"
    replicate: 3
    pool: gpu
  - name: costly-pickles
    match: task.prefix == "pickles"
    move: never
rebalance:
  enabled: true
  measure: managed
  sender-min: 20%
  recipient-max: 60%
  gap: 10%
  max-bytes-per-cycle: 12 MiB
"""
MiB = 2**20


def array(mib: float, i: int) -> np.ndarray:
    return np.full(int(mib * MiB) // 8, float(i))


async def scene(path: Path, out: Path, width: int) -> None:
    config = {
        "distributed.scheduler.active-memory-manager.interval": "1s",
        "distributed.scheduler.active-memory-manager.policies": [
            {"class": "amm_rules.RulesPolicy", "rules": str(path)}
        ],
        **{f"distributed.worker.memory.{n}": False for n in ("target", "spill", "pause")},
    }
    with dask.config.set(config):
        async with (
            Scheduler(dashboard_address="127.0.0.1:0", preload=["amm_rules.preload"]) as s,
            Worker(s.address, name="gpu-0", resources={"GPU": 1}, memory_limit="256 MiB"),
            Worker(s.address, name="gpu-1", resources={"GPU": 1}, memory_limit="256 MiB"),
            Worker(s.address, name="cpu-0", memory_limit="256 MiB") as cpu0,
            Worker(s.address, name="cpu-1", memory_limit="256 MiB") as cpu1,
            Client(s.address, asynchronous=True) as c,
        ):
            data = [
                await c.scatter({f"precious-{i}": array(1, i) for i in range(8)}),
                await c.scatter({f"device-{i}": array(2, i) for i in range(4)}),
                await c.scatter({f"pickles-{i}": array(4, i) for i in range(3)}),
                await c.scatter(
                    {f"features-{i}": array(1.5, i) for i in range(100)}, workers=[cpu0.address]
                ),
            ]
            # A worker that holds copies of precious keys leaves: the header and the
            # events say what it left below target.
            async with Worker(
                s.address, name="spot-0", host="127.0.0.1", memory_limit="256 MiB"
            ) as spot:
                data.append(
                    await c.scatter(
                        {f"precious-{i}": array(1, i) for i in range(8, 10)},
                        workers=[spot.address],
                    )
                )
                while not all(len(s.tasks[f"precious-{i}"].who_has) == 2 for i in (8, 9)):
                    await asyncio.sleep(0.1)
            with dask.annotate(amm={"replicate": "lots"}):
                bad = c.submit(sum, [1, 2], key="annotated-1")
            await bad
            # A drain of a worker with ten minutes to go: the drains table shows it.
            started = await c.scheduler.amm_rules_drain(workers=[cpu1.address], deadline="10min")
            assert "refused" not in started, started
            await asyncio.sleep(2)
            path.write_text(RULES.replace("replicate: 2", "replicate: two"))
            async with Browser(width=width, height=900) as browser:
                port = s.http_server.port
                await browser.goto(f"http://127.0.0.1:{port}/amm-rules")
                await browser.wait_for_text(
                    lambda t: (
                        "reload-error" in t
                        and "invalid-annotation" in t
                        and "worker-left" in t
                        and "draining worker" in t
                    ),
                    timeout=60,
                )
                await asyncio.sleep(2)  # a few points of history in the in-flight chart
                await browser.screenshot(out)
            del data, bad


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the PNG to write")
    parser.add_argument("--width", type=int, default=1400)
    args = parser.parse_args()
    logging.getLogger("distributed").setLevel(logging.WARNING)
    out = args.out.resolve()
    here = Path.cwd()
    with tempfile.TemporaryDirectory() as tmp:
        # The rules file by a relative path: the page shows `rules.yaml`, not where
        # this run kept it.
        os.chdir(tmp)
        try:
            path = Path("rules.yaml")
            path.write_text(RULES)
            asyncio.run(scene(path, out, args.width))
        finally:
            os.chdir(here)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
