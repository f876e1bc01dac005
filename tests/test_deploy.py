"""Deployment as in README.md and docs/deploy.md: ``dask scheduler`` and ``dask worker``
as real processes; amm-rules installed and configured on the scheduler only.

- The scheduler is configured from a dask configuration file (the block the README
  shows, with the rules' path filled in; ``DASK_CONFIG`` names its directory), or from
  ``DASK_*`` environment variables (docs/deploy.md).
- The workers, and a client that uses plain ``dask.annotate(amm=...)``, run where
  amm-rules cannot be imported: their ``PYTHONPATH`` holds only a ``sitecustomize``
  that makes ``import amm_rules`` fail as it does where the package is not installed
  (the package is importable everywhere else on this machine: the test suite's own
  install). Their working directory is outside the source tree.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import operator
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from distributed import Client

import amm_rules
from benchmarks.support.waiting import wait_for_sync
from tests.support.engine_errors import ERROR_ACTIONS

#: Where amm_rules is imported from here, so that the scheduler imports the same.
PACKAGE_ROOT = Path(amm_rules.__file__).resolve().parent.parent
README = PACKAGE_ROOT / "README.md"
AMM = "DASK_DISTRIBUTED__SCHEDULER__ACTIVE_MEMORY_MANAGER__"

RULES = """\
version: 1
rules:
  - name: precious
    match: task.prefix == "precious"
    replicate: 2
"""

#: Installed in a directory put on a process's PYTHONPATH: amm-rules is not there.
NOT_INSTALLED = '''\
import sys


class NotInstalled:
    """Finds nothing for amm_rules, and lets no later finder find it."""

    def find_spec(self, name, path=None, target=None):
        if name == "amm_rules" or name.startswith("amm_rules."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
'''

#: A client without amm-rules: plain dask.annotate, then it checks the copies itself.
PLAIN_CLIENT = """\
import operator
import sys
import time

import dask
from distributed import Client

try:
    import amm_rules  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    sys.exit("amm_rules can be imported here")

with Client(scheduler_file=sys.argv[1], timeout="30s") as client:
    with dask.annotate(amm={"replicate": 2}):
        future = client.submit(operator.add, 20, 22, key="annotated-1")
    assert future.result() == 42
    deadline = time.monotonic() + 60
    while len(client.who_has(future).get(future.key, ())) != 2:
        if time.monotonic() > deadline:
            sys.exit(f"not held at 2 copies: {client.who_has(future)}")
        time.sleep(0.05)
    print("annotated-1 held at 2 copies")
"""


def readme_config_file() -> str:
    """The dask configuration block of the README, as a user would copy it."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", README.read_text(), re.MULTILINE | re.DOTALL)
    (block,) = [b for b in blocks if b.startswith("distributed:") and "RulesPolicy" in b]
    return block


def base_env() -> dict[str, str]:
    """This process's environment without anything of dask's or Python's path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    env.pop("PYTHONPATH", None)
    return env


def scheduler_env(**dask: str) -> dict[str, str]:
    """The scheduler imports amm_rules from where this test does; ``dask``: extra
    ``DASK_*`` variables (a short interval keeps the test quick)."""
    env = base_env()
    env["PYTHONPATH"] = str(PACKAGE_ROOT)
    env[AMM + "INTERVAL"] = "200ms"
    env.update(dask)
    return env


def without_amm_rules(directory: Path) -> dict[str, str]:
    """The environment of a process in which amm-rules is not installed."""
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(NOT_INSTALLED)
    env = base_env()
    env["PYTHONPATH"] = str(directory)
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
    started: list[subprocess.Popen[bytes]],
    cmd: list[str],
    env: dict[str, str],
    log: Path,
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT)
    started.append(proc)
    return proc


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until the scheduler wrote its address; fail at once if it exited."""

    def started() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"the scheduler exited with {proc.returncode}:\n{log.read_text()}")
        return path.exists() and bool(path.read_text().strip())

    wait_for_sync(started, "the scheduler started", timeout=60, show=log.read_text)


def run_cluster(
    tmp_path: Path, env: dict[str, str], rules: Path, started: list[Any]
) -> tuple[Path, dict[str, str]]:
    """Start a scheduler with ``env`` and two workers without amm-rules; return the
    scheduler file and the environment of a process without amm-rules."""
    scheduler_file = tmp_path / "scheduler.json"
    log = tmp_path / "scheduler.log"
    scheduler = start(started, scheduler_command(scheduler_file), env, log)
    wait_for_file(scheduler_file, scheduler, log)
    bare = without_amm_rules(tmp_path / "no-amm-rules")
    for name in ("w1", "w2"):
        start(started, worker_command(scheduler_file, name), bare, tmp_path / f"{name}.log")
    return scheduler_file, bare


def check_the_cluster(client: Client, rules: Path) -> None:
    """The workers cannot import amm-rules; the scheduler holds the rules' targets
    and trims what no rule governs; status and events say what the rules are doing."""
    client.wait_for_workers(2, timeout=60)
    with pytest.raises(ModuleNotFoundError, match="amm_rules"):
        client.run(importlib.import_module, "amm_rules")
    # A builtin, so that the workers have nothing to import to run it.
    precious = client.submit(operator.add, 1, 1, key="precious-1")
    other = client.submit(operator.add, 2, 2, key="other-1")
    assert client.gather([precious, other]) == [2, 4]

    def held(future: Any) -> int:
        return len(client.who_has(future).get(future.key, ()))

    wait_for_sync(lambda: held(precious) == 2, "precious-1 at its rule's 2 copies")
    # A task on the other worker reads other-1 there: that extra copy is trimmed
    # (reduce-replicas) once it is no longer needed.
    (there,) = set(client.scheduler_info()["workers"]) - set(client.who_has(other)[other.key])
    assert client.submit(operator.add, other, 0, key="reader-1", workers=[there]).result() == 4
    wait_for_sync(lambda: held(other) == 1, "other-1 trimmed back to 1 copy")
    # distributed's own Client.replicate becomes a lasting target (every worker:
    # n=None), named as such by explain.
    client.replicate(other)
    assert held(other) == 2
    explained = amm_rules.explain(other)["other-1"]
    assert explained["target"]["source"] == "(client.replicate)"
    assert explained["target"]["follows_cluster"] is True
    assert held(precious) == 2
    status = amm_rules.status(client)
    assert (status["source"], list(status["rules"]), status["reload"]) == (
        str(rules),
        ["precious"],
        True,
    )
    assert status["totals"]["precious"]["requested"] == 1
    assert status["totals"]["(reduce-replicas)"]["dropped"] >= 1
    actions = [event["action"] for _, event in client.get_events("amm-rules")]
    assert "cycle" in actions and not ERROR_ACTIONS & set(actions), actions


def shut_down(client: Client, started: list[subprocess.Popen[bytes]]) -> None:
    """The scheduler closes its workers, and all processes exit by themselves."""
    client.shutdown()
    for proc in started:
        assert proc.wait(timeout=30) == 0


def test_scheduler_from_the_readme_config_file_workers_and_clients_without_amm_rules(
    tmp_path,
):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    config = tmp_path / "dask-config"
    config.mkdir()
    text = readme_config_file()
    assert "/etc/dask/rules.yaml" in text
    (config / "amm-rules.yaml").write_text(text.replace("/etc/dask/rules.yaml", str(rules)))

    with processes() as started:
        scheduler_file, bare = run_cluster(
            tmp_path, scheduler_env(DASK_CONFIG=str(config)), rules, started
        )
        # The client's own process has no amm-rules configuration at all.
        with Client(scheduler_file=str(scheduler_file), timeout="30s") as client:
            check_the_cluster(client, rules)
            # A client where amm-rules is not installed, with plain dask.annotate.
            script = tmp_path / "plain_client.py"
            script.write_text(PLAIN_CLIENT)
            plain = subprocess.run(
                [sys.executable, str(script), str(scheduler_file)],
                env=bare,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert plain.returncode == 0, plain.stdout + plain.stderr
            assert plain.stdout == "annotated-1 held at 2 copies\n"
            shut_down(client, started)


def test_scheduler_configured_by_environment(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    env = scheduler_env(
        **{
            AMM + "START": "True",
            AMM + "POLICIES": json.dumps(
                [{"class": "amm_rules.RulesPolicy", "rules": str(rules)}]
            ),
            "DASK_LOGGING__AMM_RULES": "info",
        }
    )
    with processes() as started:
        scheduler_file, _ = run_cluster(tmp_path, env, rules, started)
        # One line when the rules load at start: path, the file's hash, rules, pools.
        digest = hashlib.sha256(rules.read_bytes()).hexdigest()[:12]
        line = f"amm-rules: rules from {rules} (sha256 {digest}): 1 rule, pools: none"
        assert line in (tmp_path / "scheduler.log").read_text()
        with Client(scheduler_file=str(scheduler_file), timeout="30s") as client:
            check_the_cluster(client, rules)
            shut_down(client, started)


def test_invalid_rules_stop_the_scheduler_from_starting(tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.replace("replicate: 2", "replicate: 0"))
    scheduler_file = tmp_path / "scheduler.json"
    env = scheduler_env(
        **{AMM + "POLICIES": json.dumps([{"class": "amm_rules.RulesPolicy", "rules": str(rules)}])}
    )
    with processes() as started:
        log = tmp_path / "scheduler.log"
        scheduler = start(started, scheduler_command(scheduler_file), env, log)
        assert scheduler.wait(timeout=60) != 0
    text = log.read_text()
    # The same path:line:column message as `amm-rules validate`, with the source line
    # and a caret under the problem; one line saying what happens; no traceback.
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{rules}:5:16: error: "))
    assert "replicate: must be at least 1" in lines[at]
    assert lines[at + 1].strip() == "replicate: 0"
    assert lines[at + 2].strip() == "^" and lines[at + 2].index("^") == lines[at + 1].index("0")
    assert lines[at + 3] == (
        f"amm-rules: the scheduler does not start: 1 error in the rules ({rules}); check "
        "them with 'amm-rules validate' (on_invalid_rules: start-without would start it "
        "without them)"
    )
    assert "Traceback" not in text and "File " not in text, text


def test_invalid_rules_with_start_without_start_the_scheduler_and_load_once_fixed(tmp_path):
    """``on_invalid_rules: start-without``: the scheduler starts with no rules, says so,
    and loads the file at the first cycle after it was fixed."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.replace("replicate: 2", "replicate: 0"))
    entry = {"class": "amm_rules.RulesPolicy", "rules": str(rules)}
    env = scheduler_env(
        **{
            AMM + "POLICIES": json.dumps([{**entry, "on_invalid_rules": "start-without"}]),
            "DASK_LOGGING__AMM_RULES": "info",
        }
    )
    scheduler_file = tmp_path / "scheduler.json"
    with processes() as started:
        log = tmp_path / "scheduler.log"
        scheduler = start(started, scheduler_command(scheduler_file), env, log)
        wait_for_file(scheduler_file, scheduler, log)
        text = log.read_text()
        assert f"{rules}:5:16: error: replicate: must be at least 1" in text
        assert (
            f"amm-rules: the scheduler starts WITHOUT these rules (on_invalid_rules: "
            f"start-without): 1 error in the rules ({rules})"
        ) in text
        assert f"amm-rules: no rules in force: those of {rules} are invalid" in text
        assert "Traceback" not in text
        with Client(scheduler_file=str(scheduler_file), timeout="30s") as client:
            status = amm_rules.status(client)
            assert not status["rules"]
            (error,) = status["reload_errors"]
            assert "replicate: must be at least 1" in error["error"]
            fixed = tmp_path / "rules.yaml.new"
            fixed.write_text(RULES)
            fixed.rename(rules)
            wait_for_sync(
                lambda: list(amm_rules.status(client)["rules"]) == ["precious"],
                "the fixed rules loaded",
                timeout=60,
            )
            actions = [e["action"] for _, e in client.get_events("amm-rules")]
            assert actions.count("reload-error") == 1 and "reload" in actions
            shut_down(client, started)
