"""``amm-rules simulate --drain``: the drain's order and prediction on a recorded
cluster, the copies that leave in time, then the drained workers lost."""

from __future__ import annotations

import json

from click.testing import CliRunner

from amm_rules.cli import main

DUMP = "examples/dumps/demo-cluster.msgpack.gz"
RULES = "examples/rules/demo.yaml"


def run(*args: str):
    return CliRunner().invoke(
        main, ["simulate", RULES, "--dump", DUMP, *args], catch_exceptions=False
    )


def test_too_slow_a_link_loses_the_key_and_says_so_first() -> None:
    result = run("--drain", "gpu-1", "--deadline", "1s", "--rate", "1MiB/s")
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("drain within 1.0 s at 1.00 MiB/s per worker")
    assert "0 B of 2.00 MiB will leave in time;" in lines[1]
    # The recorded cluster measured the device task: its recompute is what is lost.
    assert "≈ 2.7 ms of recompute will be lost: 1 key (device 2.7 ms)" in lines[1]
    assert "too late: device-1" in result.output
    assert "DATA LOSS: 1 key loses its last copy" in result.output


def test_a_fast_enough_link_saves_it() -> None:
    result = run("--drain", "tcp://127.0.0.1:44945", "--deadline", "5s", "--rate", "100MiB/s")
    assert result.exit_code == 0, result.output
    assert "all 2.00 MiB will leave in time" in result.output
    assert "in time: device-1" in result.output
    assert "DATA LOSS" not in result.output
    report = json.loads(
        run(
            "--drain", "gpu-1", "--deadline", "5s", "--rate", "100MiB/s", "--format", "json"
        ).output
    )
    (worker,) = report["drain"]["workers"].values()
    assert worker["moved_keys"] == 1 and worker["prediction"]["lost_keys"] == 0
    assert report["lost"] == []


def test_bad_drain_arguments_are_usage_errors() -> None:
    rate = run("--drain", "gpu-1", "--rate", "fast")
    assert rate.exit_code == 2 and "Invalid value for '--rate'" in rate.output
    for deadline in ("0s", "soon"):
        result = run("--drain", "gpu-1", "--deadline", deadline)
        # The option is named whichever way its value is wrong.
        assert result.exit_code == 2 and "Invalid value for '--deadline'" in result.output
    result = run("--drain", "nobody")
    assert result.exit_code == 2 and "--drain nobody: no worker" in result.output
    assert run("--drain", "gpu-1", "--kill", "cpu-1").exit_code == 2
