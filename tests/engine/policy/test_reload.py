"""Hot reload of a rules file on a real scheduler: good changes apply at the next cycle;
a bad, missing or unreadable file keeps the running rules and logs one event."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import pytest
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.policy import RulesPolicy
from benchmarks.support.waiting import cycle_until, cycles
from tests.support.cluster import Requests, amm_config, copies, events, keep
from tests.support.rules_files import make_readable, make_unreadable, write_atomically
from tests.support.rulesets import INVALID_RELOAD, RELOADABLE

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat


def _rules_file(directory: Path, text: str) -> Path:
    path = directory / "rules.yaml"
    path.write_text(text)
    return path


@gen_cluster(
    client=True, nthreads=[("", 1)] * 4, config=amm_config(None, start=False), timeout=150
)
async def test_reload_good_and_bad(c, s, w1, w2, w3, w4, tmp_path):
    path = _rules_file(tmp_path, RELOADABLE.format(n=2))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    futures = await c.scatter({"x-1": 1})
    await cycle_until(amm, lambda: copies(s, "x-1") == 2, "x-1 at 2 copies")

    # A good change applies at the next cycle, to keys already in memory.
    write_atomically(path, RELOADABLE.format(n=3))
    await cycle_until(amm, lambda: copies(s, "x-1") == 3, "x-1 at 3 copies after the reload")
    (reload,) = events(s, "reload")
    assert reload == {"action": "reload", "source": str(path), "rules": 1, "pools": 0}

    # A bad change keeps the running rules and is reported once.
    write_atomically(path, INVALID_RELOAD)
    requests = Requests(s)
    await cycle_until(amm, lambda: events(s, "reload-error"), "a reload-error event")
    await cycles(amm, 5)
    (error,) = events(s, "reload-error")
    assert error["error"].splitlines()[0] == (
        f"{path}:4:21: error: match: unexpected 'matchs'; expected an operator "
        "(== != < <= > >= in, not in, matches), 'and', 'or' or the end of the expression "
        "(in rule 'keep')"
    )
    assert (requests.acquire, requests.remove) == ({}, {}) and copies(s, "x-1") == 3
    assert policy.ruleset.rules[0].actions.replicate.min == 3
    assert policy.reload_errors[-1]["error"] == error["error"]

    # Missing, then a directory: the rules stay, one event per distinct state.
    path.unlink()
    await cycle_until(amm, lambda: len(events(s, "reload-error")) == 2, "the missing file")
    path.mkdir()
    await cycle_until(amm, lambda: len(events(s, "reload-error")) == 3, "the directory")
    await cycles(amm, 3)
    errors = [e["error"] for e in events(s, "reload-error")]
    assert errors[1:] == [
        f"{path}: error: no such file",
        f"{path}: error: is a directory, not a rules file",
    ]
    assert (requests.acquire, requests.remove) == ({}, {})

    # Fixed again: reloaded.
    path.rmdir()
    write_atomically(path, RELOADABLE.format(n=1))
    await cycle_until(amm, lambda: copies(s, "x-1") == 1, "x-1 at 1 copy after the reload")
    assert len(events(s, "reload")) == 2
    keep(futures)


#: Two pools and four rules (the start-up line's example), ``{n}`` copies of x-*.
POOLED = """\
version: 1
pools:
  gpu: worker.resources.GPU >= 1
  cpu: not worker.resources.GPU
rules:
  - name: keep
    match: task.key matches "x-*"
    replicate: {n}
  - name: on-gpu
    match: task.prefix == "gpu"
    pool: gpu
  - name: on-cpu
    match: task.prefix == "cpu"
    pool: cpu
  - name: spread
    match: task.prefix == "wide"
    spread: host
"""


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(None, start=False), timeout=60)
async def test_the_reload_line_has_the_start_up_lines_shape_with_the_new_digest(
    c, s, a, b, tmp_path, caplog
):
    """An operator tells from the log that a change (a ConfigMap edited) landed: the
    reload's line names the file, the new text's digest, the rules and the pools, as
    the start-up line does."""
    caplog.set_level(logging.INFO, logger="amm_rules.engine.policy")
    path = _rules_file(tmp_path, POOLED.format(n=1))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    futures = await c.scatter({"x-1": 1})
    await cycle_until(amm, lambda: copies(s, "x-1") == 1, "x-1 at 1 copy")

    write_atomically(path, POOLED.format(n=2))
    await cycle_until(amm, lambda: events(s, "reload"), "a reload event")
    digests = [hashlib.sha256(POOLED.format(n=n).encode()).hexdigest()[:12] for n in (1, 2)]
    said = [r.getMessage() for r in caplog.records if r.name == "amm_rules.engine.policy"]
    tail = "4 rules, pools: gpu, cpu"
    assert f"amm-rules: rules from {path} (sha256 {digests[0]}): {tail}" in said
    assert f"amm-rules: reloaded rules from {path} (sha256 {digests[1]}): {tail}" in said
    keep(futures)


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(None, start=False))
async def test_reload_permission_denied_keeps_rules(c, s, a, tmp_path):
    path = _rules_file(tmp_path, RELOADABLE.format(n=1))
    policy = RulesPolicy(str(path))
    running = policy.ruleset
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    make_unreadable(path, RELOADABLE.format(n=2))
    try:
        await cycle_until(amm, lambda: events(s, "reload-error"), "a reload-error event")
    finally:
        make_readable(path)
    (error,) = events(s, "reload-error")
    assert error["error"] == f"{path}: error: cannot read the file: permission denied"
    assert policy.ruleset is running


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(None, start=False))
async def test_no_reload_when_disabled(c, s, a, tmp_path):
    path = _rules_file(tmp_path, RELOADABLE.format(n=1))
    policy = RulesPolicy(str(path), reload=False)
    running = policy.ruleset
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    write_atomically(path, INVALID_RELOAD)
    await cycles(amm, 3)
    write_atomically(path, RELOADABLE.format(n=2))
    await cycles(amm, 3)
    assert not events(s, "reload-error") and not events(s, "reload")
    assert policy.ruleset is running


def test_repr_names_the_file(tmp_path):
    path = _rules_file(tmp_path, RELOADABLE.format(n=1))
    assert repr(RulesPolicy(str(path))) == f"RulesPolicy(rules={str(path)!r}, 1 rule, 0 pools)"
