"""``amm-rules status`` and ``amm-rules explain`` against real schedulers: the command
runs as a separate process, as an operator's shell runs it, and connects to the
scheduler of a ``gen_cluster`` by its address."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import dask
import pytest
from click.testing import CliRunner
from dask.utils import format_bytes
from distributed.utils_test import gen_cluster, inc

import amm_rules
from amm_rules.cli import main
from amm_rules.cli.keys import parse_key
from amm_rules.engine import handlers
from amm_rules.observe.status import status_report
from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, copies, policy_of, rules
from tests.support.flow import graph

#: Where amm_rules is imported from here, so that the command imports the same.
PACKAGE_ROOT = Path(amm_rules.__file__).resolve().parent.parent

RULES = rules(
    {"name": "two", "match": 'task.prefix == "two"', "replicate": 2},
    {"name": "five", "match": 'task.prefix == "five"', "replicate": 5},
)


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


async def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``amm-rules ARGS`` in its own process, without blocking the cluster's loop."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "amm_rules", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(**env),
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# ----------------------------------------------------------------------------------
# Keys as dask prints them


@pytest.mark.parametrize(
    ("text", "keys"),
    [
        ("x-1a2b", ["x-1a2b"]),
        ("('x-1a2b', 0)", [("x-1a2b", 0)]),
        ("('x-1a2b', 0, 3)", [("x-1a2b", 0, 3)]),
        ("  ('x', -1, 2.5)  ", [("x", -1, 2.5)]),
        ("('x', ('y', 1))", [("x", ("y", 1))]),
        ("'quoted'", ["quoted"]),
        ("5", ["5", 5]),
        ("2.5", ["2.5", 2.5]),
        ("inc-abc (copy)", ["inc-abc (copy)"]),
        ("__import__('os')", ["__import__('os')"]),  # a plain string: never run
    ],
)
def test_keys_are_read_as_dask_prints_them(text, keys):
    assert parse_key(text) == keys


@pytest.mark.parametrize(
    "text", ["('x', foo)", "('x', 1 + 2)", "('x', [1])", "(__import__('os'), 0)", "('x',"]
)
def test_a_tuple_that_is_not_made_of_literals_is_refused(text):
    with pytest.raises(ValueError, match="is not a key"):
        parse_key(text)


# ----------------------------------------------------------------------------------
# Against a scheduler


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(RULES), timeout=120)
async def test_status_and_explain_from_the_shell(c, s, a, b):
    futures = c.map(inc, range(2), key=["two-1", ("five-1a2b", 0)])
    await c.gather(futures)
    await wait_for(
        lambda: all(copies(s, f.key) == 2 for f in futures),
        "all(copies(s, f.key) == 2 for f in futures)",
    )
    await wait_for(
        lambda: status_report(policy_of(s))["states"]["two"] == "satisfied",
        "status_report(policy_of(s))['states']['two'] == 'satisfied'",
    )

    text = await cli("status", "--scheduler", s.address)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"amm-rules on {s.address}"
    assert f"  sha256     {policy_of(s).ruleset.sha256}" in lines
    assert "  last reload error: none" in lines
    (two,) = [line for line in lines if line.split()[:2] == ["two", "satisfied"]]
    size = format_bytes(s.tasks["two-1"].nbytes)
    assert two.split()[2:] == ["1", *size.split(), "1", "0"]
    (five,) = [line for line in lines if line.split()[:2] == ["five", "unsatisfiable"]]
    assert five.split()[-2:] == ["0", "1"]
    assert (
        "    1 key of 1 cannot be satisfied now: wants 5 copies, only 2 workers in the cluster"
        in lines
    )
    assert any(line.startswith("cycles       ") and "median" in line for line in lines)

    # --check: a rule is not satisfied.
    checked = await cli("status", "--check", "--format", "json", "--scheduler", s.address)
    assert checked.returncode == 1
    report = json.loads(checked.stdout)
    assert report["states"] == {
        "two": "satisfied",
        "five": "unsatisfiable",
        "(annotation)": "satisfied",
        "(runtime)": "satisfied",
    }
    assert report["scheduler"] == s.address

    # explain: a tuple key as dask prints it, the address from the environment.
    why = await cli("explain", "('five-1a2b', 0)", "two-1", DASK_SCHEDULER_ADDRESS=s.address)
    assert why.returncode == 0, why.stderr
    out = why.stdout.splitlines()
    assert (
        out[0] == "('five-1a2b', 0): wants 5 copies: holds 2 copies; only 2 workers in the cluster"
    )
    assert "two-1: holds its target: 2 copies (replicate=2 from rule two)" in out
    assert any(line.strip().startswith("1. two") and "no match" in line for line in out)

    # --unmet picks the unsatisfiable key; JSON is the handler's answer.
    unmet = await cli("explain", "--unmet", "--format", "json", "--scheduler", s.address)
    assert unmet.returncode == 0, unmet.stderr
    assert list(json.loads(unmet.stdout)) == ["('five-1a2b', 0)"]

    # An unknown key: the others are explained, then one line, exit 1.
    unknown = await cli("explain", "two-1", "nope-1", "--scheduler", s.address)
    assert unknown.returncode == 1
    assert unknown.stdout.startswith("two-1: holds its target")
    assert unknown.stderr == "amm-rules: error: unknown key: nope-1 (not known to the scheduler)\n"

    # A rule that does not exist: one line, exit 1, nothing raised in the scheduler.
    bad_rule = await cli("explain", "--unmet", "--rule", "fiv", "--scheduler", s.address)
    assert bad_rule.returncode == 1
    assert bad_rule.stderr == (
        "amm-rules: error: --rule: no rule named 'fiv'; the rules are two, five, "
        "(annotation), (runtime)\n"
    )


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(RULES), timeout=120)
async def test_explain_says_how_many_keys_it_shows_and_asks_for_the_rest(c, s, a, b, monkeypatch):
    """``--unmet`` shows 10 of the 12 unmet keys and says so, on stdout in text and on
    stderr with JSON (the JSON stays the answers); keys named on the command line are
    all explained, whatever one call explains (here 4 of them)."""
    futures = c.map(inc, range(12), key=[f"five-{i}" for i in range(12)])
    await c.gather(futures)
    policy = policy_of(s)
    await wait_for(lambda: len(policy.index) == 12, "12 governed keys")
    unmet = await cli("explain", "--unmet", "--scheduler", s.address)
    assert unmet.returncode == 0, unmet.stderr
    assert unmet.stdout.count("wants 5 copies") == 10
    assert unmet.stdout.endswith(
        "\nshowing 10 of 12 unmet keys; use --limit to see more (at most 1,000 in one call)\n"
    )
    as_json = await cli(
        "explain", "--unmet", "--limit", "11", "--format", "json", "--scheduler", s.address
    )
    assert as_json.returncode == 0, as_json.stderr
    assert len(json.loads(as_json.stdout)) == 11
    assert as_json.stderr == (
        "amm-rules: note: showing 11 of 12 unmet keys; use --limit to see more "
        "(at most 1,000 in one call)\n"
    )
    every = await cli("explain", "--unmet", "--limit", "12", "--scheduler", s.address)
    assert "showing" not in every.stdout and every.stdout.count("wants 5 copies") == 12

    monkeypatch.setattr(handlers, "EXPLAIN_KEYS", 4)
    capped = await cli("explain", "--unmet", "--limit", "12", "--scheduler", s.address)
    assert capped.stdout.count("wants 5 copies") == 4
    assert capped.stdout.endswith(
        "\nshowing 4 of 12 unmet keys (at most 4 in one call); use --rule to see others\n"
    )
    # Named keys: asked 4 at a time until each is explained (a number tried as a string
    # first, then as a number, as before).
    named = [f"five-{i}" for i in range(12)]
    why = await cli("explain", *named, "nope", "--scheduler", s.address)
    assert why.returncode == 1
    assert [
        line.split(":")[0] for line in why.stdout.splitlines() if line.startswith("five-")
    ] == named
    assert why.stderr == "amm-rules: error: unknown key: nope (not known to the scheduler)\n"


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(RULES), timeout=120)
async def test_status_and_explain_run_no_function_on_the_scheduler(c, s, a):
    """Whether the engine is there is asked of the scheduler's metadata: no
    ``run_function`` (which logs ``Run out-of-band function`` at every call)."""
    ran: list[Any] = []
    run_function = s.handlers["run_function"]

    def counting(*args: Any, **kwargs: Any) -> Any:
        ran.append(kwargs.get("function"))
        return run_function(*args, **kwargs)

    s.handlers["run_function"] = counting
    x = c.submit(inc, 1, key="two-1")
    await x
    for args in (("status",), ("explain", "two-1")):
        result = await cli(*args, "--scheduler", s.address)
        assert result.returncode == 0, result.stderr
    status = await amm_rules.status(c)
    assert list(status["rules"]) == ["two", "five"]
    assert not ran
    # client.restart() clears the scheduler's metadata: the entry comes back.
    await c.restart(wait_for_workers=False)
    result = await cli("status", "--scheduler", s.address)
    assert result.returncode == 0, result.stderr
    assert not ran
    # Once detached, the entry goes with the handlers.
    policy_of(s).detach()
    assert "amm-rules" not in s.task_metadata


def record_calls(s: Any, ops: tuple[str, ...]) -> list[tuple[str, str]]:
    """Wrap the scheduler's handlers ``ops``: each call is recorded as (op, the address of
    the connection it came on)."""
    calls: list[tuple[str, str]] = []
    for op in ops:
        handler = s.handlers[op]
        takes_comm = next(iter(inspect.signature(handler).parameters), None) == "comm"

        def recorded(comm: Any, _op: str = op, _h: Any = handler, _c: bool = takes_comm, **kw):
            calls.append((_op, comm.peer_address))
            return _h(comm, **kw) if _c else _h(**kw)

        s.handlers[op] = recorded
    return calls


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(RULES), timeout=120)
async def test_a_command_connects_and_asks_whether_the_engine_is_there_once(
    c, s, a, b, monkeypatch
):
    """However many calls a command makes (keys explained four at a time; a rule's name
    checked, then its keys), it makes them on one connection, identified and probed
    once."""
    futures = c.map(inc, range(12), key=[f"five-{i}" for i in range(12)])
    await c.gather(futures)
    await wait_for(lambda: len(policy_of(s).index) == 12, "12 governed keys")
    monkeypatch.setattr(handlers, "EXPLAIN_KEYS", 4)
    calls = record_calls(
        s, ("identity", "get_metadata", "run_function", "amm_rules_explain", "amm_rules_status")
    )
    for args, asks in (
        ([f"five-{i}" for i in range(12)], ["amm_rules_explain"] * 3),
        (["--unmet", "--rule", "five"], ["amm_rules_status", "amm_rules_explain"]),
    ):
        calls.clear()
        result = await cli("explain", *args, "--scheduler", s.address)
        assert result.returncode == 0, result.stderr
        # (The test's client asks for the scheduler's identity every few seconds.)
        peers = {peer for op, peer in calls if op.startswith("amm_rules_")}
        assert len(peers) == 1, calls
        ops = [op for op, peer in calls if peer in peers]
        assert ops == ["identity", "get_metadata", *asks], calls


@gen_cluster(client=True, nthreads=[("", 1)], timeout=120)
async def test_a_scheduler_without_the_engine_is_one_line(c, s, a):
    # (status and explain share the probe: one command is enough)
    result = await cli("explain", "x-1", "--scheduler", s.address)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith(
        f"amm-rules: error: the scheduler at {s.address} runs no amm-rules engine"
    )
    assert len(result.stderr.splitlines()) == 1


def invoke(*args: str) -> Any:
    """The command in this process (no scheduler address configured)."""
    with dask.config.set({"scheduler-address": None}):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status"], "no scheduler address"),
        (["explain", "x-1", "--unmet", "--scheduler", "tcp://127.0.0.1:1"], "not both"),
        (["explain", "--scheduler", "tcp://127.0.0.1:1"], "give keys to explain"),
        (["explain", "x", "--limit", "3", "--scheduler", "tcp://127.0.0.1:1"], "go with --unmet"),
        (["explain", "('x', foo)", "--scheduler", "tcp://127.0.0.1:1"], "is not a key"),
        (["status", "--format", "yaml", "--scheduler", "tcp://127.0.0.1:1"], "'yaml' is not"),
    ],
)
def test_usage_errors_exit_2(args, message):
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stdout == ""


def test_an_unreachable_scheduler_is_one_line():
    address = f"tcp://127.0.0.1:{closed_port()}"
    result = invoke("status", "--scheduler", address, "--timeout", "1")
    assert result.exit_code == 1
    assert result.stderr == (
        f"amm-rules: error: could not connect to the scheduler at {address} within 1 s "
        "(--timeout SECONDS waits longer)\n"
    )


def test_the_default_timeout_of_the_command_line_is_2_seconds():
    """A command line gives up on an unreachable scheduler after 2 s (not dask's 5 s
    connect timeout), and says how to wait longer."""
    address = f"tcp://127.0.0.1:{closed_port()}"
    for args in (("status",), ("explain", "x-1")):
        result = invoke(*args, "--scheduler", address)
        assert result.exit_code == 1
        assert result.stderr == (
            f"amm-rules: error: could not connect to the scheduler at {address} within "
            "2 s (--timeout SECONDS waits longer)\n"
        )
    assert "2 s by default" in " ".join(invoke("status", "--help").stdout.split())


#: A memory-pressure section that never holds here (no worker reaches 90%).
PRESSURE = {"version": 1, "memory-pressure": {"threshold": "90%", "release": "80%"}}


@gen_cluster(client=True, config=amm_config(PRESSURE), timeout=120)
async def test_status_memory_flow_from_the_shell(c, s, a, b):
    await c.compute(graph(4))
    await wait_for(lambda: not s.tasks, "every task released, the result too")
    table = policy_of(s).flow.table()

    text = await cli("status", "--memory-flow", "--scheduler", s.address)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == f"memory flow of {len(table)} task prefixes"
    producers = lines[lines.index("top producers (net bytes added per task)") + 2 :]
    assert producers[0].split()[:2] == ["inp", "4"]
    freers = lines[lines.index("top freers (bytes of inputs freed by their tasks finishing)") :]
    assert freers[2].split()[:2] == ["cons-inp", "1"]
    # The consumer frees more than it makes: it is no producer.
    assert not any(line.split()[:1] == ["cons-inp"] for line in producers[: len(producers) - 3])

    as_json = await cli("status", "--memory-flow", "--format", "json", "--scheduler", s.address)
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout) == json.loads(json.dumps(table))

    # The plain status has the summary, and the section's state and why.
    plain = await cli("status", "--scheduler", s.address)
    assert plain.returncode == 0, plain.stderr
    out = plain.stdout.splitlines()
    flow_line = next(line for line in out if line.startswith("memory flow  "))
    assert flow_line.startswith("memory flow  2 prefixes;")
    assert any(line.startswith("  producers  inp (+") for line in out)
    assert any(line.startswith("  freers     cons-inp (") for line in out)
    assert any(line.startswith("pressure     idle; 0 holds") for line in out)
    assert any("nothing is queued" in line for line in out)


def test_memory_flow_usage_errors_exit_2():
    both = invoke("status", "--memory-flow", "--check", "--scheduler", "tcp://127.0.0.1:1")
    assert both.exit_code == 2 and "cannot be used together" in both.stderr
    zero = invoke("status", "--memory-flow", "--top", "0", "--scheduler", "tcp://127.0.0.1:1")
    assert zero.exit_code == 2 and "--top" in zero.stderr


def features(block: Any) -> Any:
    return block + 1


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(RULES), timeout=120)
async def test_explain_of_a_group_name_offers_the_groups_keys(c, s, a, b):
    """``amm-rules explain features-bd20...`` names a task group (a key's string form
    without its index): the scheduler offers the group's first keys and how many there
    are, found through its task groups (keys looked up, no walk over the tasks); a
    prefix's name is offered its groups; a group of keys that are not tuples, keys from
    a sample of those in memory; a name that is none of these stays unknown."""
    import dask.array as da
    from distributed import futures_of, wait

    x = c.persist(da.ones((6, 4), chunks=(2, 2)).map_blocks(features))
    await wait(futures_of(x))
    group = x.name
    assert group.startswith("features-") and group in s.task_groups
    futures = c.map(inc, range(3), key=[f"tagged-{i}" for i in range(3)])
    await c.gather(futures)

    why = await cli("explain", group, "--scheduler", s.address)
    assert why.returncode == 1
    shown = [(group, i, j) for i, j in ((0, 0), (0, 1), (1, 0), (1, 1), (2, 0))]
    assert why.stderr == (
        f"amm-rules: error: unknown key: {group} (not known to the scheduler: a task group "
        f"of 6 tasks (6 in memory), not a key; its keys: {', '.join(map(str, shown))} and "
        "1 more)\n"
    )
    # The offer is in the answer of the client's explain too.
    offer = (await amm_rules.explain(group, client=c))[group]["offer"]
    assert {**offer, "keys": list(offer["keys"])} == {
        "kind": "group",
        "name": group,
        "tasks": 6,
        "in_memory": 6,
        "keys": [str(k) for k in shown],
    }
    prefix = (await amm_rules.explain("features", client=c))["features"]["offer"]
    assert prefix["kind"] == "prefix"
    assert list(prefix["groups"]) == [{"name": group, "tasks": 6, "in_memory": 6}]
    tagged = (await amm_rules.explain("tagged", client=c))["tagged"]["offer"]
    assert (tagged["kind"], sorted(tagged["keys"])) == (
        "group",
        ["tagged-0", "tagged-1", "tagged-2"],
    )
    unknown = await cli("explain", "nothing-here", "--scheduler", s.address)
    assert unknown.stderr == (
        "amm-rules: error: unknown key: nothing-here (not known to the scheduler)\n"
    )
