"""Reading real cluster dumps (``Client.dump_cluster_state``, msgpack and YAML), and one
clear error for a file that is not a readable dump."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from click.testing import CliRunner
from distributed.utils_test import gen_cluster

from amm_rules.cli import main
from amm_rules.offline.dump import ClusterState, DumpError, parse_state, read_dump
from tests.support.dumps import CONFIG, NTHREADS, ODD_KEY, RULES, dump, holders, populate


@gen_cluster(client=True, nthreads=NTHREADS, config=CONFIG)
async def test_both_formats_read_as_the_scheduler_had_it(c, s, *workers, tmp_path):
    futures = await populate(c, s)  # noqa: F841 - held: the keys stay in memory
    live = holders(s)
    states = [read_dump(await dump(c, tmp_path, fmt)) for fmt in ("msgpack", "yaml")]
    for state in states:
        assert state.warnings == []
        got = {t.key: set(t.who_has) for t in state.in_memory()}
        assert got == live  # tuple keys as tuples, odd keys intact, every copy
        assert ("part", 0) in got and ODD_KEY in got
        ws = {w.address: w for w in state.workers.values()}
        for address, w in s.workers.items():
            record = ws[address]
            assert record.host == w.host
            assert record.name == str(w.name)
            assert record.status == "running"
            assert record.resources == dict(w.resources)
            assert record.memory_limit == w.memory_limit
            assert record.memory["managed"] == w.memory.managed
            assert set(record.has_what) == {ts.key for ts in w.has_what}
        p = state.tasks[("part", 1)]
        assert (p.prefix, p.group, p.type, p.nbytes) == (
            "part",
            s.tasks[("part", 1)].group.name,
            "numpy.ndarray",
            s.tasks[("part", 1)].nbytes,
        )
        assert state.tasks["precious-0"].prefix == "precious"
        assert state.tasks["annotated-0"].annotations["amm"] == {"replicate": 2}
    # Both formats say the same.
    a, b = states
    assert {k: (t.state, t.who_has) for k, t in a.tasks.items()} == {
        k: (t.state, tuple(t.who_has)) for k, t in b.tasks.items()
    }


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@gen_cluster(client=True, nthreads=NTHREADS[:2], config=CONFIG)
async def test_unreadable_dumps_are_one_clear_line(c, s, *workers, tmp_path):
    futures = await populate_small(c)  # noqa: F841 - held: the keys stay in memory
    good = (await dump(c, tmp_path, "msgpack")).read_bytes()
    text = (await dump(c, tmp_path, "yaml")).read_bytes()
    raw = gzip.decompress(good)
    cases = {
        "truncated gzip": (_write(tmp_path, "a.msgpack.gz", good[: len(good) // 2]), "truncated"),
        "truncated msgpack": (
            _write(tmp_path, "b.msgpack.gz", gzip.compress(raw[: len(raw) // 2])),
            "truncated",
        ),
        "yaml cut short": (
            _write(tmp_path, "c.yaml", text[: len(text) // 3].rsplit(b"\n", 1)[0] + b"\n"),
            "cut short",
        ),
        "not a dump": (_write(tmp_path, "d.yaml", b"version: 1\nrules: []\n"), "no 'scheduler'"),
        "binary": (_write(tmp_path, "e.bin", bytes(range(256)) * 4), "not a cluster dump"),
        "empty": (_write(tmp_path, "f.yaml", b""), "empty"),
        "bad yaml": (_write(tmp_path, "g.yaml", b"scheduler: [\n"), "YAML"),
        "missing": (tmp_path / "nothing.msgpack.gz", "no such file"),
    }
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    for name, (path, words) in cases.items():
        with pytest.raises(DumpError) as info:
            read_dump(path)
        message = str(info.value)
        assert message.startswith(str(path)), name
        assert words in message, (name, message)
        assert "\n" not in message, name
        result = CliRunner().invoke(
            main, ["simulate", str(rules), "--dump", str(path)], catch_exceptions=False
        )
        assert result.exit_code == 1, (name, result.output)
        assert result.output.strip() == f"Error: {message}", name


async def populate_small(c) -> list:
    futures = c.map(lambda i: i, range(3), key=[f"k-{i}" for i in range(3)])
    await c.gather(futures)
    return futures


def test_layout_problems_name_the_part() -> None:
    base = {"scheduler": {"workers": {}, "tasks": {}}, "workers": {}, "versions": {}}
    assert isinstance(parse_state(base, "x"), ClusterState)
    for data, words in [
        ({**base, "scheduler": {"workers": {}, "tasks": []}}, "scheduler.tasks is list"),
        ({**base, "scheduler": {"tasks": {}}}, "scheduler.workers is missing"),
        ({"scheduler": base["scheduler"], "versions": {}}, "no 'workers' section"),
        (
            {**base, "scheduler": {"workers": {}, "tasks": {"a": {"key": "a"}}}},
            "task 'a' has no 'state'",
        ),
        ([1, 2], "not a cluster dump"),
    ]:
        with pytest.raises(DumpError, match=words):
            parse_state(data, "x")


def test_references_in_unknown_shapes_are_left_out_and_counted() -> None:
    worker = {"address": "tcp://h:1", "status": "<Status.paused: 'paused'>", "host": "h"}
    data = {
        "scheduler": {
            "workers": {"tcp://h:1": worker},
            "tasks": {
                "a": {
                    "key": "a",
                    "state": "memory",
                    "who_has": ["<WorkerState 'tcp://h:1', name: 0>", "<Something else>", 7],
                    "waiters": ["<TaskState ('b', 1) waiting>", "<TaskState nonsense( memory>"],
                    "prefix": "<a: name: with: colons: memory: 1>",
                },
                "['b', 1]": {"state": "waiting", "processing_on": "tcp://h:1"},
                "c": {"key": "c", "state": "memory", "who_has": ["tcp://gone:2"]},
            },
        },
        "workers": {},
        "versions": {},
    }
    state = parse_state(data, "x")
    a = state.tasks["a"]
    assert a.who_has == ("tcp://h:1",)
    assert a.waiters == (("b", 1),)
    assert a.prefix == "a: name: with: colons"
    assert state.tasks[("b", 1)].processing_on == "tcp://h:1"
    assert state.tasks["c"].who_has == ()  # its only holder is not in the dump
    assert state.workers["tcp://h:1"].status == "paused"
    assert sorted(state.warnings) == [
        "1 copies on workers that are not in the dump were left out",
        "1 task references could not be read and were left out",
        "2 worker references could not be read and were left out",
    ]


def test_the_shipped_fixture_is_a_real_dump_of_the_demo_cluster() -> None:
    """``examples/dumps/demo-cluster.msgpack.gz`` (written by ``benchmarks/simulate.py
    --write-fixture``) reads, and the demo rules have work to do on it."""
    from amm_rules.language.loader import load_ruleset
    from amm_rules.offline.sim_cluster import SimCluster
    from amm_rules.offline.simulate import Simulation

    root = Path(__file__).resolve().parents[2]
    state = read_dump(root / "examples" / "dumps" / "demo-cluster.msgpack.gz")
    assert state.warnings == []
    assert sorted(w.name for w in state.workers.values()) == ["cpu-1", "cpu-2", "gpu-1", "gpu-2"]
    assert len({w.host for w in state.workers.values()}) == 2
    assert sum(1 for w in state.workers.values() if w.resources.get("GPU")) == 2
    assert {t.prefix for t in state.in_memory()} == {"precious", "device", "host", "other"}
    sim = Simulation(load_ruleset(root / "examples" / "rules" / "demo.yaml"), SimCluster(state))
    result = sim.run()
    assert result.settled and result.actions
    assert not [k for k in result.keys.values() if k.unmet or k.misplaced]
