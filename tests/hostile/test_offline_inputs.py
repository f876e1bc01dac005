"""Hostile and careless inputs of the offline commands (``simulate``, ``diff``,
``test``, ``validate --dump``): decompression bombs, special files, alias bombs in
YAML dumps, case files that declare millions of keys, dumps in odd shapes, test files
whose ``rules:`` points anywhere. Each is one clear line (or a positioned diagnostic)
and exit 1, within a bounded time and memory (docs/reliability.md, promise 15).
"""

from __future__ import annotations

import gzip
import os
import tracemalloc
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml
from click.testing import CliRunner

from amm_rules.cli import main
from amm_rules.offline.dump import MAX_ALIAS_VALUES, MAX_DUMP_BYTES, parse_state
from tests.support.hang import hang_bound

RULES = 'version: 1\nrules:\n  - name: r\n    match: task.prefix == "x"\n    replicate: 2\n'
WORKER = "<WorkerState 'tcp://h:1', name: 0, status: running, memory: 1, processing: 0>"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def rules(tmp_path: Path) -> str:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return str(path)


def dump(tasks: dict[str, Any] | None = None, **worker: Any) -> dict[str, Any]:
    """A minimal cluster dump: one worker, the tasks given."""
    entry = {"address": "tcp://h:1", "host": "h", "memory_limit": 2**30, **worker}
    return {
        "scheduler": {"workers": {"tcp://h:1": entry}, "tasks": tasks or {}},
        "workers": {},
        "versions": {},
    }


def task(key: str, **fields: Any) -> dict[str, Any]:
    return {"key": key, "state": "memory", "who_has": [WORKER], "nbytes": 10, **fields}


@contextmanager
def bounded(seconds: float = 10.0, megabytes: int = 200) -> Iterator[None]:
    """The block finishes within ``seconds`` and allocates at most ``megabytes``."""
    tracemalloc.start()
    try:
        with hang_bound(seconds):
            yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < megabytes * 2**20, f"{peak / 2**20:.0f} MiB allocated"


# ---------------------------------------------------------------------------------
# 10. Decompression bombs and special files


def test_the_default_limit_is_documented() -> None:
    assert MAX_DUMP_BYTES == 2**30
    status, output = run("simulate", "--help")
    assert "--max-dump-size SIZE" in output and "[default: 1 GiB]" in output


@pytest.mark.parametrize("suffix", [".msgpack.gz", ".yaml.gz"])
def test_a_decompression_bomb_is_refused_at_the_limit(tmp_path: Path, rules: str, suffix: str):
    """A 194 kB .msgpack.gz reached 2.0 GB, a 1 MB .yaml.gz 3.2 GB: refused as soon as
    the data passes the limit (here lowered to 10 MB; the default is 1 GiB). (The msgpack
    one is a part of the dump that is read through unbuilt, its transition log: what
    follows a whole dump is refused as soon as it starts.)"""
    head = b"scheduler: "
    if suffix == ".msgpack.gz":
        log = msgpack.packb("transition_log") + b"\xdd" + (100_000_000).to_bytes(4, "big")
        head = b"\x81" + msgpack.packb("scheduler") + b"\x81" + log
    path = tmp_path / f"bomb{suffix}"
    path.write_bytes(gzip.compress(head + b"\x00" * 100_000_000, compresslevel=9))
    assert path.stat().st_size < 200_000
    with bounded(megabytes=60):
        status, output = run("simulate", rules, "--dump", str(path), "--max-dump-size", "10MB")
    assert status == 1
    assert output == (
        f"Error: {path}: decompresses to more than the limit of 9.54 MiB for a cluster dump "
        "(--max-dump-size raises it); a decompression bomb?\n"
    )


def test_the_limit_can_be_raised(tmp_path: Path, rules: str) -> None:
    path = tmp_path / "dump.msgpack.gz"
    path.write_bytes(gzip.compress(msgpack.packb(dump({"x-1": task("x-1")})) + b""))
    status, output = run("simulate", rules, "--dump", str(path), "--max-dump-size", "100B")
    assert status == 1 and "larger than the limit of 100 B for a cluster dump" in output
    status, output = run("simulate", rules, "--dump", str(path), "--max-dump-size", "1MiB")
    assert status == 0, output
    status, output = run("simulate", rules, "--dump", str(path), "--max-dump-size", "lots")
    assert status == 2 and "Invalid value for '--max-dump-size'" in output


@pytest.mark.parametrize("command", ["simulate", "diff", "validate"])
def test_a_device_is_refused_without_reading_it(rules: str, command: str) -> None:
    """``--dump /dev/zero`` read until MemoryError (a traceback)."""
    args = {"simulate": [rules], "diff": [rules, rules], "validate": [rules]}[command]
    with bounded(seconds=5):
        status, output = run(command, *args, "--dump", "/dev/zero")
    assert status == 1
    assert output.splitlines()[-1] == (
        "Error: /dev/zero: not a regular file (a device), not a cluster dump"
    )


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_named_pipe_is_refused_without_waiting(tmp_path: Path, rules: str) -> None:
    """``--dump FIFO`` blocked forever (opening a pipe waits for a writer)."""
    fifo = tmp_path / "dump.msgpack.gz"
    os.mkfifo(fifo)
    with hang_bound(5):
        status, output = run("simulate", rules, "--dump", str(fifo))
    assert (status, output) == (
        1,
        f"Error: {fifo}: not a regular file (a named pipe), not a cluster dump\n",
    )


def gzipped(*parts: bytes, repeat: bytes = b"", times: int = 0) -> bytes:
    """gzip of ``parts`` followed by ``repeat`` ``times`` times, made a megabyte at a
    time (the decompressed data is never held)."""
    engine = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [engine.compress(b"".join(parts))]
    block = repeat * max(1, 2**20 // max(1, len(repeat)))
    left = len(repeat) * times
    while left > 0:
        out.append(engine.compress(block[:left]))
        left -= len(block)
    out.append(engine.flush())
    return b"".join(out)


def peak_megabytes(block: Any) -> tuple[Any, float]:
    """``block()`` and the most memory it allocated at once, in MiB (tracemalloc)."""
    tracemalloc.start()
    try:
        result = block()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak / 2**20


def tasks_of(header: bytes) -> bytes:
    """A dump's first bytes up to its tasks, whose value follows (``header``)."""
    return b"\x81" + msgpack.packb("scheduler") + b"\x81" + msgpack.packb("tasks") + header


def test_an_array_of_200_million_nils_is_refused_at_its_header(tmp_path: Path, rules: str):
    """190 kB of gzip took ``simulate`` to 2 GB: the decompressed bytes (200 MB) passed
    the bound, and msgpack built the list its header announced."""
    path = tmp_path / "nils.msgpack.gz"
    path.write_bytes(
        gzipped(
            tasks_of(b"\xdd" + (200_000_000).to_bytes(4, "big")), repeat=b"\xc0", times=2 * 10**8
        )
    )
    assert path.stat().st_size < 250_000
    (status, output), peak = peak_megabytes(lambda: run("simulate", rules, "--dump", str(path)))
    assert status == 1
    assert output == (
        f"Error: {path}: an array of 200,000,000 entries, more than a cluster dump holds (at "
        "most 2,097,152; --max-dump-size raises the limit of entries); a decoding bomb?\n"
    )
    assert peak < 40, f"{peak:.0f} MiB allocated"


@pytest.mark.parametrize(
    "value, what",
    [(b"\xc0", "values"), (b"\x80", "values"), (b"\x90", "values"), (b"\xa2ab", "objects")],
    ids=["nil", "map", "array", "string"],
)
def test_many_arrays_under_the_limit_are_refused_within_a_budget(
    tmp_path: Path, rules: str, value: bytes, what: str
) -> None:
    """Arrays of a million nils, empty maps, empty arrays or two-letter strings each, 64
    of them: a value per byte or two, an object per three bytes, where a real dump has
    a value per 8 to 14 bytes and an object per 25."""
    inner = b"\xdd" + (2**20).to_bytes(4, "big")
    path = tmp_path / "arrays.msgpack.gz"
    path.write_bytes(
        gzipped(
            tasks_of(b"\xdc" + (64).to_bytes(2, "big")), repeat=inner + value * 2**20, times=64
        )
    )
    (status, output), peak = peak_megabytes(lambda: run("simulate", rules, "--dump", str(path)))
    assert status == 1
    per = {"values": 2, "objects": 8}[what]
    assert output.startswith(f"Error: {path}: decodes to ")
    assert output.endswith(
        f" {what} from {output.split(' from ')[1].split(' ')[0]} bytes, more than a cluster "
        f"dump holds (at most one per {per} bytes); a decoding bomb?\n"
    )
    assert peak < 400, f"{peak:.0f} MiB allocated"


# ---------------------------------------------------------------------------------
# 11. Aliases in YAML dumps


def alias_bomb(depth: int = 12, width: int = 8) -> str:
    """A YAML dump whose one task's annotation is built of aliases: 8**12 values in
    about a kilobyte."""
    lines = ["anchors:", "  a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, depth)]
    text = yaml.safe_dump(dump({"x-1": task("x-1")}))
    annotated = f"nbytes: 10\n      annotations: {{tier: *a{depth - 1}}}"
    return "\n".join(lines) + "\n" + text.replace("nbytes: 10", annotated)


def test_a_yaml_dump_of_aliases_is_refused_before_it_is_built(tmp_path: Path, rules: str) -> None:
    """238 kB of aliases took 9.8 s and 1.6 GB."""
    path = tmp_path / "dump.yaml"
    path.write_text(alias_bomb())
    with bounded():
        status, output = run("simulate", rules, "--dump", str(path))
    assert status == 1
    assert output.startswith(f"Error: {path}: its aliases expand to ")
    assert output.endswith(
        f"more values than the file holds (at most {MAX_ALIAS_VALUES:,}); an alias bomb?\n"
    )


def test_a_yaml_dump_with_a_few_shared_values_is_read(tmp_path: Path, rules: str) -> None:
    """distributed writes an alias for a mapping many tasks share: that is read."""
    shared = {"tier": "gold"}
    data = dump({f"x-{i}": task(f"x-{i}", annotations=shared) for i in range(50)})
    path = tmp_path / "dump.yaml"
    path.write_text(yaml.safe_dump(data))
    assert "*id001" in path.read_text()
    status, output = run("simulate", rules, "--dump", str(path))
    assert status == 0, output


def test_a_recursive_alias_and_a_long_integer_in_a_yaml_dump(tmp_path: Path, rules: str) -> None:
    path = tmp_path / "dump.yaml"
    path.write_text("scheduler: &s {tasks: *s}\nworkers: {}\nversions: {}\n")
    assert run("simulate", rules, "--dump", str(path)) == (
        1,
        f"Error: {path}:1:12: an alias refers to a node that contains it\n",
    )
    path.write_text("scheduler: {nbytes: " + "1:" * 200_000 + "1}\nworkers: {}\nversions: {}\n")
    with bounded(seconds=5):
        status, output = run("simulate", rules, "--dump", str(path))
    assert status == 1 and output.startswith(
        f"Error: {path}:1:21: integer '1:1:1:1:1:1:1:1:1:1:...'"
    )


# ---------------------------------------------------------------------------------
# 12. Case files declaring millions of keys


def case_file(tmp_path: Path, keys: str, workers: str = "  - {name: a}\n") -> Path:
    (tmp_path / "rules.yaml").write_text(RULES)
    path = tmp_path / "many_test.yaml"
    path.write_text(
        f"rules: rules.yaml\nworkers:\n{workers}cases:\n  - name: many\n    keys:\n{keys}"
    )
    return path


def test_a_case_file_of_millions_of_keys_is_refused(tmp_path: Path) -> None:
    """200 keys of ``count: 100000`` in 14 kB grew past 9.8 GB."""
    keys = "".join(
        f"      - {{key: 'k{j}-{{i}}', count: 100000, holders: [a]}}\n" for j in range(200)
    )
    path = case_file(tmp_path, keys)
    with bounded(seconds=20, megabytes=300):
        status, output = run("test", str(tmp_path))
    assert status == 1
    assert (
        f"{path}:8:32: error: the cases declare more than 100,000 keys in all (with these, "
        "200,000) (in case 'many')"
    ) in output, output


def test_a_case_file_of_thousands_of_workers_is_refused(tmp_path: Path) -> None:
    workers = "".join(f"  - {{name: w{i}}}\n" for i in range(1_001))
    path = case_file(tmp_path, "      - {key: x, holders: [w0]}\n", workers)
    status, output = run("test", str(tmp_path))
    assert status == 1
    assert f"{path}:2:1: error: workers: expected at most 1,000 entries, got 1,001" in output


# ---------------------------------------------------------------------------------
# 13. Dumps in shapes that raised


@pytest.mark.parametrize("command", ["simulate", "diff"])
def test_an_invalid_replicate_annotation_is_a_warning(tmp_path: Path, rules: str, command: str):
    """``dask.annotate(replicate="lots")`` in a dump: simulate, diff and test raised
    ``TypeError: Simulation._bad_annotation() got an unexpected keyword argument 'name'``."""
    path = tmp_path / "dump.msgpack.gz"
    data = dump({"x-1": task("x-1", annotations={"replicate": "lots"}, prefix="x")})
    path.write_bytes(gzip.compress(msgpack.packb(data)))
    args = [rules] if command == "simulate" else [rules, rules]
    status, output = run(command, *args, "--dump", str(path))
    assert status == 0, output


def test_a_case_with_an_invalid_replicate_annotation_runs(tmp_path: Path) -> None:
    keys = "      - {key: x-1, holders: [a], annotations: {replicate: lots}}\n"
    case_file(tmp_path, keys)
    status, output = run("test", str(tmp_path))
    assert status == 0, output


@pytest.mark.parametrize("field", ["who_has", "waiters"])
def test_a_number_where_a_list_of_references_goes_is_left_out(tmp_path: Path, rules: str, field):
    path = tmp_path / "dump.msgpack.gz"
    data = dump({"x-1": task("x-1", **{field: 7}), "x-2": task("x-2")}, has_what=7)
    path.write_bytes(gzip.compress(msgpack.packb(data)))
    result = CliRunner().invoke(
        main, ["simulate", rules, "--dump", str(path)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert (
        f"warning: {path}: 2 reference lists could not be read and were left out" in result.output
    )


def test_resources_that_are_no_amounts_are_left_out_alike_for_workers_and_tasks() -> None:
    """A worker's resources were read with booleans kept, a task's without."""
    odd = {"GPU": True, "MEM": 2, "TPU": "one", "X": 0.5}
    data = dump({"x-1": task("x-1", resource_restrictions=odd)}, resources=odd)
    state = parse_state(data, "dump")
    assert state.workers["tcp://h:1"].resources == {"MEM": 2, "X": 0.5}
    assert state.tasks["x-1"].resources == {"MEM": 2, "X": 0.5}


def test_a_msgpack_error_without_words_is_named(tmp_path: Path, rules: str) -> None:
    """A deep msgpack error read "not readable as msgpack ()"."""
    path = tmp_path / "dump.msgpack.gz"
    deep = b"\x81\xa9scheduler" + b"\x91" * 2_000 + b"\xc0"
    path.write_bytes(gzip.compress(deep))
    status, output = run("simulate", rules, "--dump", str(path))
    assert status == 1
    assert output != f"Error: {path}: not readable as msgpack ()\n"
    assert output.startswith(f"Error: {path}: not readable as msgpack (") and "()" not in output


# ---------------------------------------------------------------------------------
# 14. A test file's rules: outside the directories given


def test_rules_outside_the_directories_given_are_refused(tmp_path: Path, monkeypatch) -> None:
    """``rules: /etc/passwd`` printed the file's first line."""
    (tmp_path / "tests").mkdir()
    secret = tmp_path / "secret.yaml"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    path = tmp_path / "tests" / "leak_test.yaml"
    path.write_text(
        "rules: ../secret.yaml\nworkers: [{name: a}]\ncases:\n"
        "  - {name: c, keys: [{key: x, holders: [a]}]}\n"
    )
    monkeypatch.chdir(tmp_path / "tests")
    status, output = run("test", ".")
    assert status == 1
    assert "root:x" not in output
    assert (
        f"./leak_test.yaml:1:8: error: the rules file ../secret.yaml is outside the tree "
        f"this test file belongs to ({tmp_path / 'tests'}: the nearest directory holding "
        ".git or pyproject.toml, else the file's own); pass --allow-outside to use it"
    ) in output, output
    # Allowed: read (and it is no rules file).
    status, output = run("test", ".", "--allow-outside")
    assert status == 1 and "the rules file ../secret.yaml cannot be used" in output
