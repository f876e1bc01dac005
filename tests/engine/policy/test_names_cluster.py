"""Rules matching data the way the scheduler names it, on a real cluster: the result
of a task submitted with ``resources={"GPU": 1}`` matches ``task.resources.GPU``, a
DataFrame of the installed pandas matches both its public name and its module path,
and nested annotations are read (issue 26). The language's side is in
tests/language/test_names.py."""

from __future__ import annotations

from typing import Any

import dask
import pandas as pd
from distributed.utils_test import gen_cluster, inc

from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import amm_config, counts, holders
from tests.support.rulesets import PANDAS_FRAME

GPU = {"resources": {"GPU": 1}}
RULES = {
    "version": 1,
    "pools": {"gpu": "worker.resources.GPU >= 1"},
    "rules": [
        {"name": "gpu-data", "match": "task.resources.GPU >= 1", "replicate": 2, "pool": "gpu"},
        # pandas 2's name of a DataFrame, which pandas 3 records as pandas.DataFrame.
        {"name": "frames", "match": 'task.type == "pandas.core.frame.DataFrame"', "replicate": 3},
        {"name": "nested", "match": 'task.annotations.placement.tier == "hot"', "replicate": 4},
    ],
}


def frame(n: int) -> pd.DataFrame:
    return pd.DataFrame({"a": range(n)})


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1), ("", 1)],
    config=amm_config(RULES),
    timeout=60,
)
async def test_resources_types_and_nested_annotations(c: Any, s: Any, *workers: Any) -> None:
    gpu_workers = {w.address for w in workers[:2]}
    on_gpu = c.submit(inc, 1, key="on-gpu", resources={"GPU": 1})
    with dask.annotate(resources={"GPU": 1}):
        annotated = c.submit(inc, 2, key="annotated-gpu")
    plain = c.submit(inc, 3, key="plain")
    frames = c.submit(frame, 5, key="frame")
    with dask.annotate(placement={"tier": "hot"}):
        hot = c.submit(inc, 4, key="hot")
    await wait_for(
        lambda: counts(s, [on_gpu, annotated, frames, hot]) == [2, 2, 3, 4],
        "GPU results on both GPU workers, the frame on 3 workers, the hot key on 4",
    )
    assert s.tasks["frame"].type == PANDAS_FRAME
    assert holders(s, on_gpu.key) == gpu_workers
    assert holders(s, annotated.key) == gpu_workers
    await wait_cycles(s, 3)
    assert counts(s, [plain]) == [1]
    assert holders(s, on_gpu.key) == gpu_workers
