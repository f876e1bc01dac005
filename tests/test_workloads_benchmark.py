"""The workloads benchmark (:mod:`benchmarks.workloads`, :mod:`benchmarks.support.workloads`):
each workload computes the right answer at a tiny size, through the benchmark's own run
(the even runs and both imbalance variants); each mode's configuration reaches the
scheduler as the mode says; the summary's ratios and goals. No timing is asserted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from distributed.active_memory_manager import ReduceReplicas
from distributed.utils_test import gen_test

from amm_rules.engine.policy import RulesPolicy
from amm_rules.language.loader import load_ruleset
from benchmarks import workloads as bench
from benchmarks.support import workloads as w

#: In-process workers without a memory limit: tiny data must not pause or spill them.
TINY = bench.Setup(workers=3, memory_limit=0, period=0.05)
#: The shapes of the tiny runs: as if each of 3 workers had 1 MiB.
TINY_LIMIT = 2**20


def tiny(name: str, fraction: float | None = None) -> w.Shape:
    return w.shape_of(name, TINY.workers, TINY_LIMIT, fraction)


@pytest.mark.parametrize("name", w.WORKLOADS)
def test_sizes_follow_the_cluster(name: str) -> None:
    small, large = w.shape_of(name, 4, 2**28), w.shape_of(name, 4, 2**30)
    for shape, limit in ((small, 2**28), (large, 2**30)):
        # The inputs take their fraction of the cluster's memory, within a chunk's worth.
        assert shape.input_bytes == pytest.approx(w.FRACTIONS[name] * 4 * limit, rel=0.15)
    assert large.input_bytes > 3 * small.input_bytes
    with pytest.raises(ValueError, match="unknown workload 'nope'"):
        w.shape_of("nope", 4, 2**28)


@pytest.mark.parametrize("name", w.WORKLOADS)
@gen_test(timeout=120)
async def test_each_workload_computes_the_right_answer(name: str, tmp_path: Path) -> None:
    built = w.build(name, tiny(name), seed=3, sink_dir=tmp_path)
    async with bench.cluster_for("stock", TINY, processes=False) as (cluster, client):
        persist_s, disk, results = await bench.run_workload(
            client, built, None, cluster, TINY.workers
        )
    assert (persist_s, disk) == (0.0, None)
    w.check(built, results)


@pytest.mark.parametrize("kind", ["producers", "late"])
@gen_test(timeout=120)
async def test_the_imbalance_variant_computes_the_right_answer(kind: str, tmp_path: Path) -> None:
    imbalance = w.Imbalance(kind, heavy=1, fraction=0.3, load_rate=None)
    built = w.build("double_diff", tiny("double_diff", 0.3), seed=4, sink_dir=tmp_path)
    start = 1 if kind == "late" else None
    async with bench.cluster_for("stock", TINY, start, processes=False) as (cluster, client):
        s = cluster.scheduler
        holders: dict[str, int] = {}

        def count_inputs() -> None:
            for ts in s.tasks.values():
                if ts.state == "memory" and str(ts.key).startswith("('load-"):
                    for ws in ts.who_has or ():
                        holders[ws.address] = holders.get(ws.address, 0) + 1

        # The inputs are where the variant says once persisted: counted at the moment
        # the computation is submitted (the client's compute after the persist).
        compute = client.compute

        def counted(*args: Any, **kwargs: Any) -> Any:
            count_inputs()
            return compute(*args, **kwargs)

        client.compute = counted  # type: ignore[method-assign]
        persist_s, disk, results = await bench.run_workload(
            client, built, imbalance, cluster, TINY.workers
        )
        assert len(s.workers) == TINY.workers
    assert persist_s > 0 and disk is not None
    assert len(holders) == 1, holders  # one heavy worker held every input chunk
    w.check(built, results)


def test_a_loading_wait_per_chunk() -> None:
    shape = w.shape_of("anom_mean", 4, 2**28)
    chunk = shape.chunks[1] * shape.chunks[2] * 8
    assert w.Imbalance(load_rate=chunk).latency(shape) == pytest.approx(1.0)
    assert w.Imbalance(load_rate=None).latency(shape) == 0.0
    with pytest.raises(ValueError, match="producers or late"):
        w.Imbalance("sideways")


# -- the modes ----------------------------------------------------------------------


def test_every_mode_is_known_and_the_recommended_file_is_valid() -> None:
    assert w.MODES[:2] == ("off", "stock")
    assert set(w.SECTION_MODES) <= set(w.MODES)
    assert w.RECOMMENDED.exists()
    load_ruleset(w.RECOMMENDED)  # raises with the diagnostics if it does not load
    with pytest.raises(ValueError, match="unknown mode 'nope'"):
        w.amm_config("nope")


def sections_on(policy: RulesPolicy) -> set[str]:
    """The sections the policy's rules turn on, and the rebalancer's own state."""
    on = set(policy.ruleset.sections_on)
    assert ("rebalance" in on) is policy.rebalancer.settings.enabled
    return on


@pytest.mark.parametrize("mode", w.MODES)
@gen_test(timeout=60)
async def test_each_mode_reaches_the_scheduler(mode: str) -> None:
    async with bench.cluster_for(mode, TINY, workers=1, processes=False) as (cluster, _):
        amm = cluster.scheduler.extensions["amm"]
        assert amm.running is (mode != "off")
        assert amm.interval == TINY.interval
        if mode in ("off", "stock"):
            # distributed's own policy, and no amm-rules anywhere.
            assert mode == "off" or [type(p) for p in amm.policies] == [ReduceReplicas]
            assert not any(isinstance(p, RulesPolicy) for p in amm.policies)
            return
        (policy,) = amm.policies
        assert isinstance(policy, RulesPolicy)
        on = sections_on(policy)
        if mode == "engine":
            assert on == set() and policy.ruleset.rules == ()
        elif mode in w.SECTION_MODES:
            assert on == {mode}
        else:  # recommended: what the shipped file turns on
            assert mode == "recommended"
            assert on == set(w.sections_of("recommended")) & set(w.SECTION_MODES)
            assert policy.rules_file.path == str(w.RECOMMENDED)


# -- the summary --------------------------------------------------------------------


def run(mode: str, wall: float, written: int, read: int, repeat: int = 0) -> dict[str, Any]:
    return {
        "workload": "vorticity",
        "mode": mode,
        "repeat": repeat,
        "wall_s": wall,
        "written": written,
        "read": read,
        "scheduler_cpu_s": 1.0,
        "imbalance_mean": 1.2,
        "workers_lost": 0,
        "peak_process": {"0": 100, "1": 200},
        "imbalance_samples": [(0.0, 1.2)],
    }


MiB = 2**20


def test_ratios_to_stock_and_the_goals_of_even_runs() -> None:
    runs = [run("stock", w_, 100 * MiB, 50 * MiB, r) for r, w_ in enumerate((10, 11, 12))]
    runs += [run("rebalance", w_, 102 * MiB, 50 * MiB, r) for r, w_ in enumerate((10, 11.2, 20))]
    runs += [run("protect", w_, 110 * MiB, 0, r) for r, w_ in enumerate((9, 10, 11))]
    table = bench.summarize(runs, ["vorticity"], ["stock", "rebalance", "protect"])
    assert table["vorticity"]["stock"]["wall_s"] == {"median": 11, "min": 10, "max": 12}
    assert table["vorticity"]["stock"]["peak_process"]["median"] == 200
    reb = table["vorticity"]["rebalance"]["vs_stock"]
    assert reb["wall_s"] == pytest.approx(11.2 / 11, abs=1e-3) and reb["written"] == 1.02
    goals = bench.goals(table, "even")
    assert goals["rebalance"]["vorticity"] == {"within_3pct": True, "worse": []}
    # 10% more written is worse, whatever the wall time.
    assert goals["protect"]["vorticity"] == {"within_3pct": False, "worse": ["written"]}


def test_disk_traffic_below_a_mebibyte_is_not_compared() -> None:
    runs = [run("stock", 10, 1000, 0), run("rebalance", 10, 3000, 0)]
    table = bench.summarize(runs, ["vorticity"], ["stock", "rebalance"])
    assert table["vorticity"]["rebalance"]["vs_stock"]["written"] is None
    assert bench.goals(table, "even")["rebalance"]["vorticity"]["within_3pct"] is True


def test_goals_of_the_imbalance_variant() -> None:
    runs = [run("stock", 10, 900 * MiB, 800 * MiB), run("rebalance", 7.9, 100 * MiB, 400 * MiB)]
    runs += [run("recommended", 9, 100 * MiB, 100 * MiB)]
    table = bench.summarize(runs, ["vorticity"], ["stock", "rebalance", "recommended"])
    goals = bench.goals(table, "producers")
    assert goals["rebalance"]["vorticity"] == {
        "read_halved": True,
        "wall_cut_20pct": True,
        "met": True,
    }
    assert goals["recommended"]["vorticity"]["met"] is False  # 10% faster only


def test_the_modes_of_each_round_rotate() -> None:
    modes = ["a", "b", "c"]
    firsts = [bench.rotated(modes, r)[0] for r in range(3)]
    assert sorted(firsts) == modes
    assert all(sorted(bench.rotated(modes, r)) == modes for r in range(5))


def test_plots_are_drawn_from_the_json(tmp_path: Path) -> None:
    runs = [run("stock", 10, 100 * MiB, 50 * MiB), run("rebalance", 9, 90 * MiB, 40 * MiB)]
    table = bench.summarize(runs, ["vorticity"], ["stock", "rebalance"])
    data = {"settings": {"variant": "even"}, "table": table, "runs": runs}
    (path,) = bench.plot(data, tmp_path)
    assert path.name == "workloads-vorticity.png" and path.stat().st_size > 1000


def test_the_docs_tables_are_printed_from_the_summary() -> None:
    runs = [run("stock", 10, 100 * MiB, 50 * MiB), run("rebalance", 9, 90 * MiB, 40 * MiB)]
    table = bench.summarize(runs, ["vorticity"], ["stock", "rebalance"])
    lines = bench.markdown(table).splitlines()
    assert lines[0] == "**vorticity**"
    stock, rebalance = (line for line in lines if line.startswith(("| stock", "| rebalance")))
    assert stock.startswith("| stock | 10.0 (10.0-10.0) | 100 (100-100) | 50 (50-50) |")
    assert rebalance.endswith("| 0.90, 0.90, 0.80 |")
