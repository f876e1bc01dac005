"""Cluster dumps carry the engine: ``Client.dump_cluster_state`` writes the rules in
force (text and SHA-256), the status report and the engine's recent decisions."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import pytest
from distributed.cluster_dump import load_cluster_dump
from distributed.utils_test import gen_cluster, inc

from benchmarks.support.waiting import wait_for
from tests.support.cluster import amm_config, copies

RULES_TEXT = """\
version: 1
rules:
  - name: two
    match: task.prefix == "two"
    replicate: 2
"""


@pytest.mark.parametrize("fmt", ["msgpack", "yaml"])
def test_a_dump_explains_itself(fmt):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "rules.yaml"
        path.write_text(RULES_TEXT)

        @gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(str(path)))
        async def run(c, s, a, b):
            x = c.submit(inc, 1, key="two-1")
            await x
            await wait_for(lambda: copies(s, "two-1") == 2, "copies(s, 'two-1') == 2")
            await c.dump_cluster_state(str(Path(d) / "dump"), format=fmt)

        run()
        (written,) = Path(d).glob("dump.*")
        state = load_cluster_dump(str(written))

    engine = state["scheduler"]["extensions"]["amm-rules"]
    assert engine["rules"]["source"] == str(path)
    assert engine["rules"]["text"] == RULES_TEXT
    assert engine["rules"]["sha256"] == hashlib.sha256(RULES_TEXT.encode()).hexdigest()
    rows = {r["name"]: r for r in engine["status"]["conformance"]["rules"]}
    assert rows["two"]["keys"] == 1
    assert engine["status"]["totals"]["two"]["requested"] == 1
    (decision,) = [d for d in engine["decisions"] if d["key"] == "two-1"]
    assert (decision["op"], decision["outcome"], decision["source"]) == (
        "replicate",
        "accepted",
        "two",
    )
