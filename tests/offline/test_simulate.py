"""``amm-rules simulate`` on real dumps: what it predicts is what the real engine does on
the same cluster; one cycle is the next cycle's suggestions; kills, dry-run, rebalancing,
and a running scheduler as the source."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import dask
import pytest
from click.testing import CliRunner
from distributed import Client, LocalCluster
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.cli import main
from amm_rules.engine.policy import RulesPolicy
from amm_rules.language.loader import load_ruleset
from amm_rules.observe.conformance import STATES
from amm_rules.offline.commands import read_scheduler
from amm_rules.offline.dump import read_dump
from amm_rules.offline.report import rules_section
from amm_rules.offline.sim_cluster import SimCluster
from amm_rules.offline.simulate import Simulation, runtime_targets
from tests.support.dumps import (
    CONFIG,
    MEASURE,
    NTHREADS,
    RULES,
    addresses,
    array,
    dump,
    holders,
    populate,
    settle_live,
)

ROOT = Path(__file__).resolve().parents[2]
AMM_MEASURE = {"distributed.scheduler.active-memory-manager.measure": MEASURE}


def simulate(rules: str, path: Any, cycles: int | None = None) -> Simulation:
    sim = Simulation(
        load_ruleset(rules_mapping(rules)), SimCluster(read_dump(path)), measure=MEASURE
    )
    sim.result = sim.run(cycles)  # type: ignore[attr-defined]
    return sim


def rules_mapping(text: str) -> dict:
    import yaml

    return yaml.safe_load(text)


def sim_holders(sim: Simulation) -> dict[Any, set[str]]:
    return {ts.key: {ws.address for ws in ts.who_has} for ts in sim.cluster.in_memory()}


def signature(s: Any, placed: dict[Any, set[str]]) -> dict[Any, tuple[Any, ...]]:
    """Per key, what the rules decide: its copies, and the hosts (``spread``) or whether
    a copy is on the GPU worker (``pool``, ``avoid``) where a rule says so. Which of
    equal workers gets a copy depends on the order keys are planned in, which the
    scheduler leaves to a set's order."""
    gpu = {a for a, ws in s.workers.items() if ws.resources.get("GPU")}
    out: dict[Any, tuple[Any, ...]] = {}
    for k, v in placed.items():
        if str(k).startswith("precious"):
            out[k] = (len(v), frozenset(s.workers[a].host for a in v))
        elif str(k).startswith(("device", "host")):
            out[k] = (len(v), bool(v & gpu))
        else:
            out[k] = (len(v),)
    return out


def cli(*args: str) -> tuple[int, str]:
    with dask.config.set(AMM_MEASURE):
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@gen_cluster(client=True, nthreads=NTHREADS, config=CONFIG)
async def test_simulation_predicts_what_the_engine_does(c, s, *workers, tmp_path):
    futures = await populate(c, s)  # noqa: F841 - held: the keys stay in memory
    w = addresses(s)
    sims = [simulate(RULES, await dump(c, tmp_path, fmt)) for fmt in ("msgpack", "yaml")]
    predicted = sim_holders(sims[0])
    assert signature(s, sim_holders(sims[1])) == signature(s, predicted)
    # What the rules want, in the prediction ...
    for i in range(3):
        assert len(predicted[f"precious-{i}"]) == 3
        assert {s.workers[a].host for a in predicted[f"precious-{i}"]} == {
            "127.0.0.1",
            "127.0.0.2",
        }
    assert predicted["device-0"] == predicted["device-1"] == {w[0]}
    assert w[0] not in predicted["host-0"]
    assert len(predicted[("part", 0)]) == 1
    assert len(predicted["annotated-0"]) == 2
    result = sims[0].result
    assert result.settled
    assert not [k for k in result.keys.values() if k.unmet or k.misplaced]
    # ... and what the real policy does on the real cluster.
    await settle_live(s, rules_mapping(RULES))
    assert signature(s, holders(s)) == signature(s, predicted)


@gen_cluster(client=True, nthreads=NTHREADS, config=CONFIG)
async def test_one_cycle_is_the_next_cycles_suggestions(c, s, *workers, tmp_path):
    futures = await populate(c, s)  # noqa: F841
    sim = simulate(RULES, await dump(c, tmp_path, "msgpack"), cycles=1)
    predicted = Counter((a.op, a.key) for a in sim.result.actions)
    assert sim.result.cycles == 1 and predicted
    # Stopped before it settled: the rules it was repairing are in-progress, the word
    # live status uses.
    states = {e["state"] for e in rules_section(sim.ruleset, sim, sim.result).values()}
    assert "in-progress" in states and states <= set(STATES)

    policy = RulesPolicy(rules_mapping(RULES), audit_interval=None, classify_seconds=None)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False, measure=MEASURE)
    asked: Counter[tuple[str, Any]] = Counter()
    s.request_acquire_replicas = lambda addr, keys, stimulus_id: asked.update(
        ("replicate", k) for k in keys
    )
    s.request_remove_replicas = lambda addr, keys, stimulus_id: asked.update(
        ("drop", k) for k in keys
    )
    try:
        amm.run_once()
    finally:
        del s.request_acquire_replicas, s.request_remove_replicas
        policy.detach()
    assert asked == predicted


@gen_cluster(client=True, nthreads=NTHREADS, config=CONFIG)
async def test_json_report(c, s, *workers, tmp_path):
    futures = await populate(c, s)  # noqa: F841
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    status, output = cli(
        "simulate",
        str(rules),
        "--dump",
        str(await dump(c, tmp_path, "msgpack")),
        "--format",
        "json",
    )
    assert status == 0
    report = json.loads(output)
    assert report["settled"] and report["cycles"] >= 1
    assert report["lost"] == [] and report["unmet"] == []
    ops = Counter((a["op"], a["rule"]) for a in report["actions"])
    assert ops[("replicate", "precious")] == 6  # three keys, two more copies each
    assert ops[("replicate", "device")] == 2 and ops[("drop", "device")] == 2
    assert ops[("replicate", "host-data")] == 1 and ops[("drop", "host-data")] == 1
    assert ops[("drop", "(reduce-replicas)")] == 2
    assert ops[("replicate", "(annotation)")] == 1
    assert all(set(a) >= {"op", "key", "worker", "rule"} for a in report["actions"])
    assert {a["key"] for a in report["actions"]} >= {"('part', 0)", "precious-0"}
    # Memory after is memory before, plus the copies added, minus those dropped.
    for address, mem in report["workers"].items():
        delta = sum(
            a["bytes"] * (1 if a["op"] == "replicate" else -1)
            for a in report["actions"]
            if a["worker"] == address
        )
        assert mem["after"] - mem["before"] == delta
    precious = report["rules"]["precious"]
    assert precious["keys"] == 3 and precious["add"] == 6 and precious["state"] == "satisfied"
    assert precious["bytes_transferred"] == 6 * s.tasks["precious-0"].nbytes
    assert report["pools"]["gpu"]["workers"] == 1
    assert report["pools"]["gpu"]["after"] > report["pools"]["gpu"]["before"]
    # The text report says the same in words.
    status, text = cli(
        "simulate", str(rules), "--dump", str(tmp_path / "cluster-msgpack.msgpack.gz")
    )
    assert status == 0
    assert "settled after" in text and "precious" in text and "satisfied" in text


@gen_cluster(client=True, nthreads=NTHREADS, config=CONFIG)
async def test_kills_report_data_loss_and_restoring_copies(c, s, *workers, tmp_path):
    futures = await populate(c, s)  # noqa: F841
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    await settle_live(s, rules_mapping(RULES))  # precious keys on both hosts now
    settled = await dump(c, tmp_path, "msgpack")
    w = addresses(s)

    status, output = cli(
        "simulate",
        str(rules),
        "--dump",
        str(settled),
        "--kill-host",
        "127.0.0.2",
        "--format",
        "json",
    )
    report = json.loads(output)
    assert status == 1  # the ("part", i) keys live on 127.0.0.2 only
    assert sorted(x["key"] for x in report["lost"]) == sorted(
        str(k) for k, ts in s.tasks.items() if {ws.host for ws in ts.who_has} == {"127.0.0.2"}
    )
    below = report["below_target"]
    assert {x["key"] for x in below} >= {f"precious-{i}" for i in range(3)}
    assert all(0 < x["copies"] < x["target"] for x in below)
    # Two workers are left: each key below target gets back to two copies at most.
    assert report["restoring"]["copies"] == sum(min(x["target"], 2) - x["copies"] for x in below)
    assert sorted(report["killed"]) == sorted(w[2:])
    assert all(report["workers"][a]["killed"] for a in w[2:])
    # Two hosts wanted, one left: the precious keys are restored to three copies on it,
    # and reported as unmet only if the host has too few workers for three.
    assert {x["key"] for x in report["unmet"]} == {f"precious-{i}" for i in range(3)}

    # Losing the GPU pool loses the device keys, which live there only.
    status, output = cli(
        "simulate", str(rules), "--dump", str(settled), "--kill-pool", "gpu", "--format", "json"
    )
    assert status == 1
    assert {x["key"] for x in json.loads(output)["lost"]} >= {"device-0", "device-1"}

    # Losing one worker (named by its name) loses exactly the keys only it holds.
    live = holders(s)
    for address in w:
        only_here = {str(k) for k, where in live.items() if where == {address}}
        name = str(s.workers[address].name)
        status, output = cli(
            "simulate", str(rules), "--dump", str(settled), "--kill", name, "--format", "json"
        )
        assert status == (1 if only_here else 0)
        assert {x["key"] for x in json.loads(output)["lost"]} == only_here
        status, text = cli("simulate", str(rules), "--dump", str(settled), "--kill", address)
        if only_here:
            n = len(only_here)
            lose = "keys lose their" if n > 1 else "key loses its"
            assert f"DATA LOSS: {n} {lose} last copy" in text
        else:
            assert "no key loses its last copy" in text

    for bad in (["--kill", "nobody"], ["--kill-host", "10.9.9.9"], ["--kill-pool", "gpus"]):
        status, output = cli("simulate", str(rules), "--dump", str(settled), *bad)
        assert status == 2 and bad[1] in output


DRY = RULES.replace("    spread: host\n", "    spread: host\n    enforcement: dry-run\n")


@gen_cluster(client=True, nthreads=NTHREADS, config=CONFIG)
async def test_dry_run_rules_are_reported_not_applied(c, s, *workers, tmp_path):
    futures = await populate(c, s)  # noqa: F841
    sim = simulate(DRY, await dump(c, tmp_path, "msgpack"))
    result = sim.result
    assert not [a for a in result.actions if a.rule == "precious"]
    assert Counter(a.op for a in result.dry_run if a.rule == "precious") == {"replicate": 6}
    assert all(len(sim.cluster.tasks[f"precious-{i}"].who_has) == 1 for i in range(3))
    assert [a for a in result.actions if a.rule == "device"]  # enforced rules still act


REBALANCE = """\
version: 1
rebalance:
  measure: managed
  sender-min: 10%
  max-bytes-per-cycle: 1 MiB
"""


@gen_cluster(
    client=True,
    nthreads=[("127.0.0.1", 1)] * 3,
    worker_kwargs={"memory_limit": "20 MiB"},
    config=CONFIG,
)
async def test_rebalancing_settles_over_cycles(c, s, a, b, d, tmp_path):
    futures = [c.submit(array, 100_000, i, key=f"x-{i}", workers=[a.address]) for i in range(60)]
    await c.gather(futures)
    sim = simulate(REBALANCE, await dump(c, tmp_path, "msgpack"))
    result = sim.result
    assert result.settled
    moves = [x for x in result.actions if x.rule == "(rebalance)"]
    copies = Counter(x.op for x in moves)
    assert copies["replicate"] == copies["drop"] > 0
    assert sim.last_active > 2  # the budget spreads the moves over cycles
    # Every key still has exactly one copy; the workers are within the gap of the mean.
    assert all(len(ts.who_has) == 1 for ts in sim.cluster.in_memory())
    managed = {addr: ws.memory.managed for addr, ws in sim.cluster.workers.items()}
    mean = sum(managed.values()) / len(managed)
    assert max(managed.values()) - mean <= 0.05 * 20 * 2**20 + 100_000


def test_a_running_scheduler_as_the_source(tmp_path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "version: 1\nrules:\n  - {name: two, match: 'task.prefix == \"inc\"', replicate: 2}\n"
    )
    with (
        dask.config.set({**CONFIG, **AMM_MEASURE}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        futures = client.map(lambda x: x + 1, range(4), key=[f"inc-{i}" for i in range(4)])
        client.gather(futures)
        status, output = cli(
            "simulate", str(rules), "--scheduler", cluster.scheduler_address, "--format", "json"
        )
        assert status == 0, output
        report = json.loads(output)
        assert report["cluster"] == cluster.scheduler_address
        assert Counter(a["rule"] for a in report["actions"]) == {"two": 4}
        # Nothing was enacted on the real cluster.
        assert all(len(ts.who_has) == 1 for ts in cluster.scheduler.tasks.values())
        # The task groups come with the state (the recompute estimates and protect read
        # them), as they do from a dump the user wrote.
        state = read_scheduler(cluster.scheduler_address, 64 * 2**20)
        group = state.groups["inc"]
        assert group.states["memory"] == 4 and group.compute > 0
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        status, output = cli("simulate", str(rules), "--scheduler", "tcp://127.0.0.1:1")
    assert status == 1 and "cannot reach the scheduler at tcp://127.0.0.1:1" in output


def test_usage_errors(tmp_path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    status, output = cli("simulate", str(rules))
    assert status == 2 and "--dump FILE or --scheduler ADDRESS" in output
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\nrules:\n  - name: x\n    match: task.prefx == 1\n    replicate: 2\n"
    )
    status, output = cli("simulate", str(bad), "--dump", str(tmp_path / "none.msgpack.gz"))
    assert status == 1 and f"{bad}:4:17: error: match: task has no attribute 'prefx'" in output


@pytest.fixture(autouse=True)
def _quiet_cluster_logs(caplog):
    caplog.set_level("WARNING", logger="distributed")


NEW_RULES = RULES.replace("replicate: 3", "replicate: 2") + (
    '  - name: parts\n    match: task.prefix == "part"\n    replicate: 2\n'
)


@gen_cluster(client=True, nthreads=NTHREADS, config=CONFIG)
async def test_diff_reports_what_the_change_does(c, s, *workers, tmp_path):
    futures = await populate(c, s)  # noqa: F841
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(RULES)
    new.write_text(NEW_RULES)
    path = str(await dump(c, tmp_path, "msgpack"))
    status, output = cli("diff", str(old), str(new), "--dump", path, "--format", "json")
    assert status == 0, output
    report = json.loads(output)
    # The dump was not at rest under the old rules: that part is reported apart.
    assert report["old_settling"]["actions"] > 0 and report["old_settling"]["settled"]
    changed = {x["key"]: x["fields"] for x in report["changed"]}
    assert set(changed) == {f"precious-{i}" for i in range(3)} | {
        f"('part', {i})" for i in range(4)
    }
    assert changed["precious-0"] == {
        "replicate": {"old": "3 (rule precious)", "new": "2 (rule precious)"}
    }
    assert changed["('part', 1)"]["replicate"] == {"old": "- (not set)", "new": "2 (rule parts)"}
    rules = report["rules"]
    assert (rules["precious"]["keys_changed"], rules["precious"]["drop"]) == (3, 3)
    assert (rules["parts"]["keys_changed"], rules["parts"]["add"]) == (4, 4)
    part = s.tasks[("part", 0)].nbytes
    assert report["totals"]["bytes_transferred"] == 4 * part
    assert report["totals"]["keys_changed"] == 7
    status, text = cli("diff", str(old), str(new), "--dump", path)
    assert status == 0
    assert "7 of 12 keys in memory change what they want" in text
    assert "precious-0: 3 (rule precious) -> 2 (rule precious)" in text


@gen_cluster(client=True, nthreads=NTHREADS, config=CONFIG)
async def test_runtime_targets_come_back_from_the_engines_part_of_the_dump(c, s, *ws, tmp_path):
    """``amm_rules.replicate`` targets live in the engine, not in the tasks: the engine
    writes them into dumps, and the simulator reads them back."""
    from amm_rules import RulesPolicy as ObservedPolicy  # the name configurations use

    futures = await populate(c, s)  # noqa: F841
    policy = ObservedPolicy(rules_mapping(RULES), audit_interval=None)
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False, measure=MEASURE)
    try:
        s.handlers["amm_rules_set_target"](keys=[("part", 1)], target={"min": 3})
        path = await dump(c, tmp_path, "msgpack")
    finally:
        policy.detach()
        del amm
    state = read_dump(path)
    assert state.runtime == {("part", 1): (3, None)}
    status, output = cli(
        "simulate", str(_rules_file(tmp_path)), "--dump", str(path), "--format", "json"
    )
    assert status == 0
    report = json.loads(output)
    added = [a for a in report["actions"] if a["key"] == "('part', 1)"]
    assert [(a["op"], a["rule"]) for a in added] == [("replicate", "(runtime)")] * 2


@gen_cluster(client=True, nthreads=NTHREADS, config=CONFIG)
async def test_targets_of_distributeds_own_calls_come_back_with_their_origin(c, s, *ws, tmp_path):
    """A ``scatter(broadcast=True)`` target is ``all`` and names its origin, in the
    dump and in the simulation read back from it."""
    from amm_rules import RulesPolicy as ObservedPolicy  # the name configurations use

    futures = await populate(c, s)  # noqa: F841
    policy = ObservedPolicy(rules_mapping(RULES), audit_interval=None)
    # Running (a broadcast is honoured only then), no cycle within the test.
    amm = ActiveMemoryManagerExtension(
        s, {policy}, register=False, start=True, interval=3600, measure=MEASURE
    )
    try:
        held = await c.scatter({"model-0": 7}, broadcast=True)  # noqa: F841
        path = await dump(c, tmp_path, "msgpack")
    finally:
        amm.stop()
        policy.detach()
        del amm
    state = read_dump(path)
    assert state.runtime["model-0"] == ("all", "all")
    assert state.runtime_origins == {"model-0": "scatter broadcast"}
    sim = Simulation(
        load_ruleset(rules_mapping(RULES)),
        SimCluster(state),
        measure=MEASURE,
        interval=2.0,
        runtime=runtime_targets(state),
    )
    assert sim.desired["model-0"].explain() == "replicate=all from scatter broadcast"


def _rules_file(directory: Any) -> Any:
    path = directory / "rules.yaml"
    path.write_text(RULES)
    return path


#: On the committed demo dump (precious-0 and -1 are numpy arrays): a rule whose every
#: match is taken by an earlier one, and one that matches nothing.
UNUSED = """\
version: 1
rules:
  - name: precious
    match: task.prefix == "precious"
    replicate: 3
  - name: arrays-everywhere
    match: task.type == "numpy.ndarray" and task.key matches "precious-*"
    replicate: all
  - name: typo
    match: task.prefix == "precius"
    replicate: 2
"""
DEMO_DUMP = ROOT / "examples" / "dumps" / "demo-cluster.msgpack.gz"


def test_rules_governing_nothing_are_shadowed_or_idle_as_live_status_says(tmp_path) -> None:
    """simulate, diff and validate --dump tell a rule whose every match is taken
    (``shadowed``) from one matching nothing (``idle``), in live status' words; a
    rule governing nothing on a cluster without keys in memory stays satisfied."""
    rules = tmp_path / "unused.yaml"
    rules.write_text(UNUSED)
    status, output = cli("simulate", str(rules), "--dump", str(DEMO_DUMP), "--format", "json")
    assert status == 0, output
    report = json.loads(output)["rules"]
    assert report["precious"]["state"] == "satisfied"
    shadowed, idle = report["arrays-everywhere"], report["typo"]
    assert shadowed["state"] == "shadowed"
    assert shadowed["sentence"] == "matches 2 keys, all taken by precious (replicate)"
    assert shadowed["shadowed"] == {
        "matched": 2,
        "taken_by": {"precious": {"keys": 2, "fields": ["replicate"]}},
    }
    assert idle["state"] == "idle"
    assert idle["sentence"] == (
        "matches none of the 7 keys in memory; 2 keys of prefix precious in memory "
        "(the rule says precius)"
    )
    status, text = cli("simulate", str(rules), "--dump", str(DEMO_DUMP))
    assert "rules that govern no key:\n  arrays-everywhere: shadowed: matches 2 keys" in text
    old = ROOT / "examples" / "rules" / "demo.yaml"
    status, output = cli(
        "diff", str(old), str(rules), "--dump", str(DEMO_DUMP), "--format", "json"
    )
    states = {name: e["state"] for name, e in json.loads(output)["rules"].items()}
    assert states["arrays-everywhere"] == "shadowed" and states["typo"] == "idle"
    status, output = cli("validate", str(rules), "--dump", str(DEMO_DUMP))
    assert (
        f"{rules}:7:12: warning[shadowed-in-cluster]: matches 2 keys, all taken by precious "
        f"(replicate), in the cluster of {DEMO_DUMP}: the rule decides nothing there"
    ) in output
    assert f"{rules}:10:12: warning[matches-no-key]: " in output

    # No key in memory: nothing to match, as in live status.
    state = read_dump(DEMO_DUMP)
    state.tasks.clear()
    for worker in state.workers.values():
        worker.has_what.clear()
    sim = Simulation(load_ruleset(rules_mapping(UNUSED)), SimCluster(state), measure=MEASURE)
    empty = rules_section(sim.ruleset, sim, sim.run())
    assert {e["state"] for e in empty.values()} == {"satisfied"}
