"""Rules files caught half-written, and YAML that costs the reader quadratic time: each
found on a live scheduler or by ``validate`` (docs/reliability.md, promise 14).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from amm_rules.language.loader import check_text
from amm_rules.language.yaml_source import MAX_INT_CHARS
from benchmarks.hostile import broken_rules, many_rules
from benchmarks.support.waiting import cycle_until, cycles
from tests.support.cluster import Requests, amm_config, counts, events, keep
from tests.support.hang import hang_bound
from tests.support.looplag import LoopLag, assert_no_stall
from tests.support.rules_files import reload_now, write_atomically

# ---------------------------------------------------------------------------------
# 5. A file rewritten in place is installed once it has settled


def two_rules(y_copies: int, settle: str) -> str:
    return (
        f"version: 1\nreload-settle: {settle}\nrules:\n"
        '  - name: x\n    match: task.key matches "x-*"\n    replicate: 2\n'
        f'  - name: y\n    match: task.key matches "y-*"\n    replicate: {y_copies}\n'
    )


X = [f"x-{i}" for i in range(25)]
Y = [f"y-{i}" for i in range(25)]


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(None, start=False), timeout=60)
async def test_a_file_rewritten_in_place_is_not_installed_half_written(c, s, a, b, w, tmp_path):
    """Two writes into the same file: its one-rule prefix was installed, and the 25
    ``y-*`` keys went from 2 copies to 1 until the rest landed."""
    path = tmp_path / "rules.yaml"
    path.write_text(two_rules(2, "5s"))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    futures = await c.scatter(dict.fromkeys(X + Y, 1))
    await cycle_until(amm, lambda: counts(s, X + Y) == [2] * 50, "every key at 2 copies")

    new = two_rules(3, "5s")
    cut = new.index("  - name: y")
    requests = Requests(s)
    with open(path, "r+") as f:  # in place: the same inode
        f.truncate(0)
        f.write(new[:cut])  # a valid one-rule file: x only
        f.flush()
        await cycles(amm, 5)
        assert [r.name for r in policy.ruleset.rules] == ["x", "y"]
        assert not events(s, "reload") and not requests.remove
        assert counts(s, Y) == [2] * 25
        f.write(new[cut:])
    await cycle_until(amm, lambda: counts(s, Y) == [3] * 25, "y-* at 3 copies", timeout=30)
    assert len(events(s, "reload")) == 1
    assert not requests.remove
    keep(futures)


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(None, start=False), timeout=60)
async def test_a_configmap_swap_is_installed_at_once(c, s, a, b, w, tmp_path):
    """A Kubernetes ConfigMap volume: ``rules.yaml -> ..data/rules.yaml``, ``..data ->
    ..v1``; an update points ``..data`` at a new directory in one rename. Complete by
    construction: installed at the next cycle, whatever ``reload-settle`` says."""
    for version, y_copies in (("..v1", 2), ("..v2", 3)):
        (tmp_path / version).mkdir()
        (tmp_path / version / "rules.yaml").write_text(two_rules(y_copies, "1h"))
    os.symlink("..v1", tmp_path / "..data")
    os.symlink("..data/rules.yaml", tmp_path / "rules.yaml")
    policy = RulesPolicy(str(tmp_path / "rules.yaml"))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    futures = await c.scatter(dict.fromkeys(Y, 1))
    await cycle_until(amm, lambda: counts(s, Y) == [2] * 25, "y-* at 2 copies")
    os.symlink("..v2", tmp_path / "..data-new")
    os.replace(tmp_path / "..data-new", tmp_path / "..data")
    await cycles(amm, 1)
    assert len(events(s, "reload")) == 1
    await cycle_until(amm, lambda: counts(s, Y) == [3] * 25, "y-* at 3 copies")
    keep(futures)


def test_reload_settle_is_read_from_the_rules_in_force(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(two_rules(2, "250ms"))
    assert RulesPolicy(str(path)).rules_file.settle == 0.25
    path.write_text("version: 1\n")
    assert RulesPolicy(str(path)).rules_file.settle == 2.0


# ---------------------------------------------------------------------------------
# 6. Integers PyYAML would build in quadratic time

SEXAGESIMAL = "1:" * 500_000 + "1"  # YAML 1.1 base 60: 1 MB
LONG_HEX = "0x" + "f" * 4_000


def with_replicate(value: str) -> str:
    return f'version: 1\nrules:\n  - name: r\n    match: "true"\n    replicate: {value}\n'


@pytest.mark.parametrize("value", [SEXAGESIMAL, LONG_HEX, "9" * 5_000, "-0b" + "1" * 10_000])
def test_long_integer_scalars_are_refused_before_they_are_built(value: str) -> None:
    """1 MB of ``1:1:...`` took 45 s in validate; 4,000 hex digits were an internal error."""
    with hang_bound(3.0):
        ruleset, diagnostics = check_text(with_replicate(value))
    assert ruleset is None
    shown = value[:20] + "..."
    assert [(d.line, d.column, d.code, d.message) for d in diagnostics] == [
        (
            5,
            16,
            "too-long",
            f"integer {shown!r} is {len(value):,} characters long; integers are at most "
            f"{MAX_INT_CHARS} characters (quote it to make it text)",
        )
    ]


def test_an_integer_of_the_longest_allowed_length_is_read() -> None:
    ruleset, diagnostics = check_text(with_replicate("0" * (MAX_INT_CHARS - 1) + "2"))
    assert not diagnostics and ruleset is not None
    assert ruleset.rules[0].actions.replicate.min == 2


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(None, start=False), timeout=60)
async def test_a_hot_reload_of_a_sexagesimal_bomb_does_not_stall_the_loop(c, s, a, b, tmp_path):
    """500 kB of ``1:1:...`` stalled a live scheduler 10 s at its hot reload."""
    path = tmp_path / "rules.yaml"
    path.write_text(two_rules(2, "0s"))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    write_atomically(path, with_replicate("1:" * 250_000 + "1"))
    async with LoopLag() as lag:
        await cycle_until(amm, lambda: events(s, "reload-error"), "a reload-error event")
    assert_no_stall(lag, "the hot reload of a 500 kB sexagesimal integer")
    (error,) = events(s, "reload-error")
    assert error["error"].startswith(f"{path}:5:16: error: integer '1:1:1:1:1:1:1:1:1:1:...'")
    assert [r.name for r in policy.ruleset.rules] == ["x", "y"]


# ---------------------------------------------------------------------------------
# 2. Reloads read off the event loop


@gen_cluster(
    client=True, nthreads=[("", 1)] * 2, config=amm_config(None, start=False), timeout=120
)
async def test_a_hot_reload_of_thousands_of_rules_does_not_stall_the_loop(c, s, a, b, tmp_path):
    """A valid file of 10,000 rules stalled the loop 7 s at its reload: it is now read
    and checked in a thread, and only the compiled rules are swapped in on the loop."""
    path = tmp_path / "rules.yaml"
    path.write_text(two_rules(2, "0s"))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    write_atomically(path, many_rules(10_000))
    async with LoopLag() as lag:
        await cycle_until(amm, lambda: events(s, "reload"), "a reload event", timeout=90)
    assert_no_stall(lag, "the hot reload of 10,000 rules", bound=5.0)  # 7.7 s before
    assert len(policy.ruleset.rules) == 10_000
    assert events(s, "reload") == [
        {"action": "reload", "source": str(path), "rules": 10_000, "pools": 0}
    ]


@gen_cluster(
    client=True, nthreads=[("", 1)] * 2, config=amm_config(None, start=False), timeout=150
)
async def test_a_broken_file_is_read_once_per_state_off_the_loop(c, s, a, b, tmp_path):
    """Each reload attempt of a 1 MiB file with an error in its last rule cost 4.3 s of
    the loop. Now off the loop, and each state of the file is read and reported once."""
    path = tmp_path / "rules.yaml"
    path.write_text(two_rules(2, "0s"))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    reloads = policy.journal.reloads
    async with LoopLag() as lag:
        write_atomically(path, broken_rules())
        await cycle_until(amm, lambda: events(s, "reload-error"), "a reload-error event", 50)
        await cycles(amm, 5)
        assert (reloads["error"], len(events(s, "reload-error"))) == (1, 1)
        write_atomically(path, broken_rules())  # the same text: a new state of the file
        await cycle_until(amm, lambda: reloads["error"] == 2, "a second attempt", 50)
    # 4.3 s each before.
    assert_no_stall(lag, "two reload attempts of a 1 MiB broken rules file", bound=3.0)
    first, second = events(s, "reload-error")
    assert first["error"] == second["error"]
    assert re.fullmatch(
        rf"{re.escape(str(path))}:\d+:5: error: unknown field 'replicat'.*",
        first["error"].splitlines()[0],
    )
    assert [r.name for r in policy.ruleset.rules] == ["x", "y"]


def test_a_reload_in_flight_is_taken_by_a_later_poll(tmp_path):
    """Outside an event loop too: the poll that starts the load may return before it is
    done (a file of thousands of rules), and a later poll installs it."""
    path = tmp_path / "rules.yaml"
    path.write_text(two_rules(2, "0s"))
    policy = RulesPolicy(str(path))
    policy._manager = SimpleNamespace(scheduler=SimpleNamespace(tasks={}))  # no keys
    write_atomically(path, many_rules(2_000))
    reload_now(policy)
    assert len(policy.ruleset.rules) == 2_000
    assert (policy.journal.reloads["ok"], policy.journal.reloads["error"]) == (1, 0)
