"""Hot reload of a rules file on a real scheduler: good changes apply at the next cycle;
a bad, missing or unreadable file keeps the running rules and logs one event. (The
rebalance timings' reload needs no cluster: it is checked on the policy alone.)"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from amm_rules.engine.rebalance.planner import Move, PendingMove
from tests.support.cluster import RELOADABLE, amm_config, events, holders, no_errors

TIMED = """\
version: 1
rebalance:
  cool-down: {cool}
  copy-timeout: {copy}
  drop-timeout: {drop}
"""
BAD = """\
version: 1
rules:
  - name: keep
    match: task.key matchs "x-*"
    replicate: 2
"""


async def cycles(amm: ActiveMemoryManagerExtension, n: int = 5) -> None:
    """Run the manager ``n`` times, letting transfers land in between."""
    for _ in range(n):
        amm.run_once()
        await asyncio.sleep(0.05)


def write(path: Path, text: str) -> None:
    # Atomic replace, as editors and config tools do: the new file is a new inode.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(None, start=False))
async def test_reload_good_and_bad(c, s, w1, w2, w3, w4, tmp_path):
    path = _rules_file(tmp_path, RELOADABLE.format(n=2))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    futures = await c.scatter({"x-1": 1})
    await cycles(amm)
    assert len(holders(s, "x-1")) == 2

    # A good change applies at the next cycle, to keys already in memory.
    write(path, RELOADABLE.format(n=3))
    await cycles(amm)
    assert len(holders(s, "x-1")) == 3
    (reload,) = events(s, "reload")
    assert reload["source"] == str(path) and reload["rules"] == 1

    # A bad change keeps the running rules and is reported once.
    write(path, BAD)
    await cycles(amm)
    (error,) = events(s, "reload-error")
    assert error["error"].startswith(f"{path}:4:")
    assert len(holders(s, "x-1")) == 3
    assert policy.ruleset.rules[0].actions.replicate.min == 3
    assert policy.reload_errors[-1]["error"] == error["error"]

    # Missing, then a directory: the rules stay, one event per distinct state.
    path.unlink()
    await cycles(amm, 2)
    path.mkdir()
    await cycles(amm, 2)
    errors = [e["error"] for e in events(s, "reload-error")]
    assert len(errors) == 3, errors
    assert "no such file" in errors[1] and "is a directory" in errors[2]

    # Fixed again: reloaded.
    path.rmdir()
    write(path, RELOADABLE.format(n=1))
    await cycles(amm)
    assert len(holders(s, "x-1")) == 1
    assert len(events(s, "reload")) == 2
    assert list(futures) == ["x-1"]
    no_errors(s)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(None, start=False))
async def test_reload_permission_denied_keeps_rules(c, s, a, tmp_path):
    path = _rules_file(tmp_path, RELOADABLE.format(n=1))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    path.chmod(0)
    try:
        write(path, RELOADABLE.format(n=2))
        path.chmod(0)
        await cycles(amm, 2)
    finally:
        path.chmod(0o644)
    (error,) = events(s, "reload-error")
    assert "ermission" in error["error"]
    no_errors(s)


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(None, start=False))
async def test_no_reload_when_disabled(c, s, a, tmp_path):
    path = _rules_file(tmp_path, RELOADABLE.format(n=1))
    amm = ActiveMemoryManagerExtension(
        s, {RulesPolicy(str(path), reload=False)}, register=False, start=False
    )
    write(path, BAD)
    await cycles(amm, 2)
    assert not events(s, "reload-error") and not events(s, "reload")


def _rules_file(directory: Path, text: str) -> Path:
    path = directory / "rules.yaml"
    path.write_text(text)
    return path


def test_repr_names_the_file(tmp_path):
    path = _rules_file(tmp_path, RELOADABLE.format(n=1))
    assert repr(RulesPolicy(str(path))) == f"RulesPolicy(rules={str(path)!r}, 1 rules, 0 pools)"


def test_rebalance_timings_reach_the_move_book_and_follow_a_reload(tmp_path):
    path = _rules_file(tmp_path, TIMED.format(cool="90s", copy="10s", drop="2 min"))
    policy = RulesPolicy(str(path))
    rebalancer = policy.rebalancer
    book = rebalancer.book
    assert (book.cooldown, book.copy_timeout, book.drop_timeout) == (90.0, 10.0, 120.0)
    # A key cooling down and a move in flight when the file changes.
    book.refuse(Move("cooling", "a", "b", 1), now=0.0)
    book.start(Move("moving", "a", "b", 1), now=0.0)

    # The reload itself reads only the scheduler's tasks (to re-classify them).
    policy._manager = SimpleNamespace(scheduler=SimpleNamespace(tasks={}))
    write(path, TIMED.format(cool="0", copy="5s", drop="1s"))
    policy._maybe_reload()
    assert policy.rebalancer is rebalancer and rebalancer.book is book
    assert (book.cooldown, book.copy_timeout, book.drop_timeout) == (0.0, 5.0, 1.0)
    assert rebalancer.status()["cool_down"] == 0.0
    assert rebalancer.status()["copy_timeout"] == 5.0
    # The new cool-down counts from when the key started cooling: 0 s is over already.
    assert "cooling" not in book.cooling(0.0)
    # The move in flight is kept, and the new copy-timeout applies to it.
    assert list(book.pending) == ["moving"]
    settled = book.settle(6.0, holders={"moving": {"a"}}.get, alive={"a", "b"})
    assert settled.void == (
        (PendingMove("moving", "a", "b", 1, 0.0), "copy did not land within 5s"),
    )
