"""Query-planned collections on a real cluster (docs/annotations.md, "Query-planned
collections"): a dask DataFrame (dask-expr, pandas 3) and an array persisted under each
form the page lists, and the targets held on the keys that reached memory."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import dask
import dask.array as da
import dask.dataframe as dd
import pandas as pd
import pytest
from dask.dataframe.dask_expr import _collection
from distributed import futures_of, span, wait
from distributed.utils_test import captured_logger, gen_cluster

import amm_rules
from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import amm_config, counts, holders, policy_of
from tests.support.rulesets import GPU, GPU_POOL, PANDAS_FRAME

RULES = {
    "version": 1,
    "pools": GPU_POOL,
    "rules": [{"name": "etl", "match": 'task.span == "etl"', "replicate": 2}],
}
cluster = gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1)],
    config=amm_config(RULES),
    timeout=60,
)


def frame() -> Any:
    out = dd.from_pandas(pd.DataFrame({"a": range(40), "b": range(40)}), npartitions=4)
    assert type(out).__module__.startswith("dask.dataframe.dask_expr")  # query planning
    return out[out.a > 3] + 1


def array() -> Any:
    # Two blockwise layers, which dask's graph optimization fuses into one.
    return da.ones(40, chunks=10) + 1


MAKERS = {"dataframe": frame, "array": array}


def keys_of(persisted: Any) -> list[Any]:
    keys = [f.key for f in futures_of(persisted)]
    assert keys
    return keys


@pytest.mark.parametrize("kind", MAKERS)
@cluster
async def test_annotate_around_persist_reaches_every_key(
    c: Any, s: Any, *w: Any, kind: str
) -> None:
    x = MAKERS[kind]()
    _collection._WARN_ANNOTATIONS = True  # dask warns once per process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with amm_rules.annotate(replicate=2):
            x = c.persist(x)
    keys = keys_of(x)
    await wait(x)
    await wait_for(lambda: counts(s, keys) == [2] * len(keys), "every key at 2 copies")
    assert all(s.tasks[k].annotations.get("amm") == {"replicate": 2} for k in keys)
    ignored = [w for w in caught if "Annotations will be ignored" in str(w.message)]
    # dask's warning is printed for a DataFrame, although the annotation arrived.
    assert len(ignored) == (1 if kind == "dataframe" else 0)
    if kind == "dataframe":
        assert s.tasks[keys[0]].type == PANDAS_FRAME


@pytest.mark.parametrize("kind", MAKERS)
@cluster
async def test_annotations_around_construction(c: Any, s: Any, *w: Any, kind: str) -> None:
    """Dropped by the DataFrame's query planner; an array's graph (no query planning by
    default) keeps them on tasks that optimization leaves as they are."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with amm_rules.annotate(replicate=2):
            x = MAKERS[kind]()
    x = c.persist(x)
    keys = keys_of(x)
    await wait(x)
    if kind == "dataframe":
        await wait_cycles(s, 3)
        assert counts(s, keys) == [1] * len(keys)
        assert not any("amm" in (s.tasks[k].annotations or {}) for k in keys)
    else:
        await wait_for(lambda: counts(s, keys) == [2] * len(keys), "the array's keys at 2")


@pytest.mark.parametrize("kind", MAKERS)
@cluster
async def test_a_span_around_persist_reaches_every_key(c: Any, s: Any, *w: Any, kind: str) -> None:
    x = MAKERS[kind]()
    with span("etl"):
        x = c.persist(x)
    keys = keys_of(x)
    await wait(x)
    await wait_for(lambda: counts(s, keys) == [2] * len(keys), "every key at 2 copies (rule etl)")


@pytest.mark.parametrize("kind", MAKERS)
@cluster
async def test_persist_sets_targets_on_exactly_the_keys_persisted(
    c: Any, s: Any, *w: Any, kind: str
) -> None:
    gpu = {w[0].address, w[1].address}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with dask.annotate(replicate=3):  # around construction: dropped, as above
            x = MAKERS[kind]()
    x = await amm_rules.persist(x, replicate=2, pool="gpu", client=c)
    keys = keys_of(x)
    await wait(x)
    # Two copies, both in the pool (a copy outside it counts until it is moved).
    await wait_for(
        lambda: all(holders(s, k) == gpu for k in keys),
        "every key persisted at 2 copies, both on the GPU workers",
        show=lambda: {k: holders(s, k) for k in keys},
    )
    # Exactly those keys: nothing else holds a runtime target.
    assert set(policy_of(s).index.runtime) == set(keys)
    answer = await amm_rules.explain(keys[:1], client=c)
    (entry,) = answer.values()
    assert entry["cascade"][0]["sets"] == {"replicate": "2", "pool": "gpu"}


@cluster
async def test_persist_refuses_what_the_scheduler_does_not_know(c: Any, s: Any, *w: Any) -> None:
    """Checked before anything is persisted, and a refusal, not an error of the scheduler
    (it logged ``Exception while handling op amm_rules_set_target`` with a traceback,
    having persisted the collection without a target)."""
    with (
        captured_logger("distributed.core", level=logging.ERROR) as log,
        pytest.raises(ValueError, match="unknown pool 'gpus'"),
    ):
        await amm_rules.persist(array(), pool="gpus", client=c)
    assert not s.task_prefixes and not policy_of(s).index.runtime  # nothing ever persisted
    assert log.getvalue() == ""
    with pytest.raises(TypeError, match="needs a field"):
        amm_rules.persist(array(), client=c)
    with pytest.raises(ValueError, match="replicate: must be at least 1"):
        amm_rules.persist(array(), replicate=0, client=c)
