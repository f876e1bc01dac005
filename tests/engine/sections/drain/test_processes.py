"""Drains started from outside the scheduler's process: SIGTERM to a real ``dask worker``
process with the preload ``amm_rules.worker`` (with and without a nanny), and the
command ``amm-rules drain`` run as an operator's shell runs it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from distributed.utils_test import gen_cluster

from amm_rules.observe.text import render_status
from benchmarks.support.waiting import wait_for
from tests.observe.test_cli import cli, environment
from tests.support.cluster import amm_config, events, holders


def payload(i: int) -> bytes:
    return bytes([i]) * 100_000


def start_worker(address: str, nanny: bool, directory: Path) -> tuple[Any, Path]:
    """``dask worker`` named ``leaving``, one thread, with the preload and a drain
    deadline of 15 s in its own dask config; its process and its log."""
    command = [
        sys.executable,
        "-m",
        "distributed.cli.dask_worker",
        address,
        "--name",
        "leaving",
        "--nthreads",
        "1",
        "--preload",
        "amm_rules.worker",
        "--nanny" if nanny else "--no-nanny",
    ]
    env = environment(DASK_AMM_RULES__DRAIN__DEADLINE="15s")
    log = directory / "worker.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    return process, log


@pytest.mark.parametrize("nanny", [True, False], ids=["nanny", "no-nanny"])
@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(), timeout=90)
async def test_sigterm_drains_the_worker_through_the_preload(c, s, a, nanny, tmp_path):
    process, log = start_worker(s.address, nanny, tmp_path)
    try:
        await wait_for(
            lambda: any(ws.name == "leaving" for ws in s.workers.values()),
            "the worker joins",
            timeout=40,
            show=lambda: log.read_text()[-2000:],
        )
        (leaving,) = [a_ for a_, ws in s.workers.items() if ws.name == "leaving"]
        # Scattered: a key lost here could not be computed again.
        futures = await c.scatter({f"p-{i}": payload(i) for i in range(20)}, workers=[leaving])
        assert all(holders(s, k) == {leaving} for k in futures)
        if nanny:  # the preload gives the nanny its plugin once the worker has started
            await wait_for(
                lambda: "Starting Nanny plugin amm-rules-drain-on-signal" in log.read_text(),
                "the nanny has the preload's plugin",
                show=lambda: log.read_text()[-2000:],
            )
        process.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(process.wait, 60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert leaving not in s.workers
    drains = [e for e in events(s, "drain") if e["worker"] == leaving]
    started = [e for e in drains if e["step"] == "started"]
    assert started and started[0]["deadline"] == pytest.approx(15.0, abs=1.0)
    assert [e["step"] for e in drains if e["step"] != "prediction"] == [
        "started",
        "safe",
        "closed",
    ], drains
    # Every key stayed: none had to be computed again.
    assert all(holders(s, k) == {a.address} for k in futures)
    assert await c.gather(list(futures.values())) == [payload(i) for i in range(20)]
    assert code == 0, log.read_text()[-3000:]
    await the_record_agrees_with_itself(c, s, leaving, len(futures))


async def the_record_agrees_with_itself(c, s, worker: str, keys: int) -> None:
    """The drain's record once its worker closed: one count of the keys (all moved and
    safe, none left), the time left stopped when the drain ended, the state what
    happened; the status text says the same."""
    first = (await c.scheduler.amm_rules_drain_report(workers=[worker]))[worker]
    assert first["state"] == "closed", first
    assert first["outcome"]["unsafe_keys"] == 0 and first["outcome"]["below_min"] == 0
    assert (first["moved_keys"], first["safe_keys"], first["keys_left"]) == (keys, keys, 0)
    assert first["outcome"]["moved_keys"] == keys and first["bytes_left"] == 0
    assert first["time_to_safety"]["keys"] == keys
    moment = time.monotonic() + 0.3
    await wait_for(lambda: time.monotonic() > moment, "a moment passes", timeout=5.0)
    again = (await c.scheduler.amm_rules_drain_report(workers=[worker]))[worker]
    assert again["seconds_left"] == first["seconds_left"] > 0, (first, again)
    assert again["elapsed"] == first["elapsed"] == first["outcome"]["elapsed"]
    text = render_status(await c.scheduler.amm_rules_status())
    (line,) = [t for t in text.splitlines() if t.startswith("drain") and worker in t]
    assert "closed after" in line and f"{keys} keys moved" in line and ", 0 left" in line, line
    assert "every key safe" in text


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(), timeout=60)
async def test_the_command_drains_and_closes(c, s, a, b, w):
    futures = await c.scatter({f"x-{i}": b"x" * 10_000 for i in range(5)}, workers=[a.address])
    done = await cli(
        "drain",
        "--scheduler",
        s.address,
        str(a.name),
        "--deadline",
        "20s",
        "--close",
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report[a.address]["state"] == "closed"
    assert report[a.address]["outcome"]["unsafe_keys"] == 0
    assert a.address not in s.workers
    assert all(holders(s, k) for k in futures)
    await the_record_agrees_with_itself(c, s, a.address, len(futures))

    text = await cli("drain", "--scheduler", s.address, b.address, "--deadline", "20s")
    assert text.returncode == 0, text.stderr
    first, *_, last = text.stdout.strip().splitlines()
    assert first.startswith(f"{b.address} (1): draining within 20 s: ")
    assert "every key safe" in last

    unknown = await cli("drain", "--scheduler", s.address, "nobody")
    assert unknown.returncode == 1
    assert "no worker of this scheduler has the address or name nobody" in unknown.stderr


def test_the_command_checks_its_arguments_before_connecting() -> None:
    from click.testing import CliRunner

    from amm_rules.cli import main

    runner = CliRunner()
    result = runner.invoke(main, ["drain", "--scheduler", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2 and "name at least one WORKER" in result.output
    result = runner.invoke(
        main, ["drain", "--scheduler", "tcp://127.0.0.1:1", "w", "--deadline", "soon"]
    )
    assert result.exit_code == 2 and "--deadline" in result.output


def test_the_preloads_deadline_comes_from_dask_config_and_is_checked() -> None:
    import dask

    from amm_rules.worker import CONFIG_KEY, deadline_seconds

    assert deadline_seconds() == 25.0
    with dask.config.set({CONFIG_KEY: "50s"}):
        assert deadline_seconds() == 50.0
    for bad in ("soon", "0s", "2 days"):
        with dask.config.set({CONFIG_KEY: bad}), pytest.raises(ValueError, match=CONFIG_KEY):
            deadline_seconds()


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(), timeout=120)
async def test_sigterm_to_the_worker_process_under_a_nanny(c, s, a, tmp_path):
    """The signal reaches the worker process alone (``kill PID``): it drains, then
    stops through its nanny, which starts a new worker process as it does for a worker
    that a signal ended. The nanny logged ``Worker process died unexpectedly`` with a
    ``TypeError`` from its stop-queue watch: the worker had closed itself while that
    thread still waited on the queue, which the process's exit then closed under it."""
    process, log = start_worker(s.address, True, tmp_path)
    try:
        await wait_for(
            lambda: (
                "Starting Nanny plugin amm-rules-drain-on-signal" in log.read_text()
                and any(ws.name == "leaving" for ws in s.workers.values())
            ),
            "the worker joins, its nanny has the preload's plugin",
            timeout=40,
            show=lambda: log.read_text()[-2000:],
        )
        (leaving,) = [ws for ws in s.workers.values() if ws.name == "leaving"]
        assert leaving.pid != process.pid  # the worker process, not the nanny's
        futures = await c.scatter(
            {f"p-{i}": payload(i) for i in range(20)}, workers=[leaving.address]
        )
        os.kill(leaving.pid, signal.SIGTERM)
        await wait_for(
            lambda: any(
                ws.name == "leaving" and ws.address != leaving.address for ws in s.workers.values()
            ),
            "the nanny starts a new worker process",
            timeout=60,
            show=lambda: log.read_text()[-3000:],
        )
    finally:
        process.kill()
        process.wait()
    text = log.read_text()
    drains = [e for e in events(s, "drain") if e["worker"] == leaving.address]
    assert [e for e in drains if e["step"] == "safe"], (drains, text[-3000:])
    assert all(holders(s, k) == {a.address} for k in futures)
    # Stopped by its nanny, the nanny's own way (its stop queue), after the drain.
    assert "Nanny asking worker to close. Reason: amm-rules: drained after SIGTERM" in text
    assert "Worker process died unexpectedly" not in text, text[-3000:]
    assert "Traceback" not in text and "ERROR" not in text, text[-3000:]
