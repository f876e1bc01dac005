"""Deployment as in docs/deploy.md: ``dask scheduler`` and ``dask worker`` as real
processes, amm-rules turned on only through ``DASK_*`` environment variables."""

from __future__ import annotations

import json
import operator
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from distributed import Client
from distributed.utils_test import poll_for

import amm_rules

#: Where amm_rules is imported from here, so that the child processes import the same.
PACKAGE_ROOT = Path(amm_rules.__file__).resolve().parent.parent

RULES = """\
version: 1
rules:
  - name: precious
    match: task.prefix == "precious"
    replicate: 2
"""


def amm_env(rules: Path) -> dict[str, str]:
    """The environment of docs/deploy.md, with a short interval to keep the test quick."""
    env = dict(os.environ)
    env.pop("DASK_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    env["DASK_DISTRIBUTED__SCHEDULER__ACTIVE_MEMORY_MANAGER__START"] = "True"
    env["DASK_DISTRIBUTED__SCHEDULER__ACTIVE_MEMORY_MANAGER__INTERVAL"] = "200ms"
    env["DASK_DISTRIBUTED__SCHEDULER__ACTIVE_MEMORY_MANAGER__POLICIES"] = json.dumps(
        [{"class": "amm_rules.RulesPolicy", "rules": str(rules)}]
    )
    return env


def scheduler_command(scheduler_file: Path) -> list[str]:
    # `python -m distributed.cli.dask_scheduler` is what `dask scheduler` runs; calling
    # it through this interpreter does not depend on PATH.
    return [
        sys.executable, "-m", "distributed.cli.dask_scheduler",
        "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
        "--scheduler-file", str(scheduler_file),
    ]  # fmt: skip


def worker_command(scheduler_file: Path, name: str) -> list[str]:
    return [
        sys.executable, "-m", "distributed.cli.dask_worker",
        "--scheduler-file", str(scheduler_file), "--name", name,
        "--nthreads", "1", "--no-nanny", "--no-dashboard", "--host", "127.0.0.1",
    ]  # fmt: skip


@contextmanager
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started inside the block are stopped when it ends, whatever happens."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        # One at a time, workers before the scheduler: a worker whose scheduler
        # vanished while it was closing may wait for it instead of exiting.
        for proc in reversed(started):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start(
    started: list[subprocess.Popen[bytes]], cmd: list[str], env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    started.append(proc)
    return proc


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists() or not path.read_text().strip():
        if proc.poll() is not None:
            pytest.fail(f"the scheduler exited with {proc.returncode}:\n{log.read_text()}")
        if time.monotonic() > deadline:
            pytest.fail(f"the scheduler did not start:\n{log.read_text()}")
        time.sleep(0.1)


def test_scheduler_and_workers_configured_by_environment(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    scheduler_file = tmp_path / "scheduler.json"
    env = amm_env(rules)

    with processes() as started:
        log = tmp_path / "scheduler.log"
        scheduler = start(started, scheduler_command(scheduler_file), env, log)
        wait_for_file(scheduler_file, scheduler, log)
        for name in ("w1", "w2"):
            start(started, worker_command(scheduler_file, name), env, tmp_path / f"{name}.log")

        # The client's own process has no amm-rules configuration at all.
        with Client(scheduler_file=str(scheduler_file), timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
            # A builtin, so that the workers have nothing to import to run it.
            precious = client.submit(operator.add, 1, 1, key="precious-1")
            other = client.submit(operator.add, 2, 2, key="other-1")
            client.gather([precious, other])

            def held(future: object) -> int:
                return len(client.who_has(future).get(future.key, ()))

            poll_for(lambda: held(precious) == 2, timeout=30)
            # distributed's own Client.replicate becomes a lasting target (every
            # worker: n=None), named as such by explain.
            client.replicate(other)
            assert held(other) == 2
            explained = amm_rules.explain(other)["other-1"]
            assert explained["target"]["source"] == "(client.replicate)"
            assert explained["target"]["follows_cluster"] is True
            assert held(precious) == 2 and held(other) == 2
            assert isinstance(amm_rules.status(client), dict)
            # The scheduler closes its workers, and all processes exit by themselves.
            client.shutdown()
        for proc in started:
            assert proc.wait(timeout=30) == 0


def test_invalid_rules_stop_the_scheduler_from_starting(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.replace("replicate: 2", "replicate: 0"))
    scheduler_file = tmp_path / "scheduler.json"
    with processes() as started:
        log = tmp_path / "scheduler.log"
        scheduler = start(started, scheduler_command(scheduler_file), amm_env(rules), log)
        assert scheduler.wait(timeout=60) != 0
    # The same path:line:column message as `amm-rules validate`.
    assert f"{rules}:5:" in log.read_text()
