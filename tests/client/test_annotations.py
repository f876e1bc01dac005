"""``amm`` annotations: eager checking on the client (:func:`amm_rules.annotate`) and
their effect on a real scheduler running :class:`amm_rules.RulesPolicy`."""

from __future__ import annotations

import dask
import dask.array as da
import pytest
from distributed.utils_test import gen_cluster, inc
from hypothesis import given
from hypothesis import strategies as st

import amm_rules
from amm_rules.client import validate_annotation
from amm_rules.language.fields import ActionError, parse_actions
from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import Requests, amm_config, copies, counts
from tests.support.rulesets import GPU, GPU_POOL

GPU_RULES = {"version": 1, "pools": GPU_POOL}


# ----------------------------------------------------------------------------------
# On the client


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"replicate": 0}, r"^replicate: must be at least 1"),
        ({"replicate": -3}, r"^replicate: must be at least 1"),
        ({"replicate": 2.5}, r"^replicate: expected a whole number"),
        ({"replicate": True}, r"^replicate: expected a whole number"),
        ({"replicate": "3"}, r"^replicate: expected a whole number"),
        ({"replicate": {"min": 3, "max": 2}}, r"^replicate: max \(2\) is below min \(3\)"),
        ({"replicate": {"mni": 2}}, r"^replicate: unknown key 'mni'"),
        ({"replicate": {}}, r"^replicate: expected at least one of 'min' and 'max'"),
        ({"pool": "2gpu"}, r"^pool: '2gpu' is not a pool name"),
        ({"pool": []}, r"^pool: expected a pool name or a non-empty list"),
        ({"avoid": ["gpu", 3]}, r"^avoid: 3 is not a pool name"),
        ({"spread": "rack"}, r"^spread: expected 'host' or 'none'"),
        ({"move": "sometimes"}, r"^move: expected 'allowed' or 'never'"),
        ({"replicat": 2}, r"^replicat: unknown action field; did you mean 'replicate'"),
        ({}, r"^amm: expected at least one of"),
    ],
)
def test_annotate_rejects_invalid_fields_at_call_time(fields, message):
    # The error comes from the call itself, before any `with` block or graph exists.
    with pytest.raises(ActionError, match=message) as info:
        amm_rules.annotate(**fields)
    assert isinstance(info.value, ValueError)
    assert "in an amm annotation" in str(info.value)
    assert "amm" not in dask.get_annotations()


def test_annotate_sets_the_dask_annotation():
    before = dask.get_annotations()
    with amm_rules.annotate(replicate=4, pool="gpu") as fields:
        assert dask.get_annotations()["amm"] == {"replicate": 4, "pool": "gpu"}
        assert fields == {"replicate": 4, "pool": "gpu"}
    assert dask.get_annotations() == before


def test_annotate_passes_plain_checked_values():
    with amm_rules.annotate(
        replicate=2.0, pool=["gpu", "gpu"], avoid=["a", "b"], spread="host", move="allowed"
    ):
        assert dask.get_annotations()["amm"] == {
            "replicate": 2,
            "pool": "gpu",
            "avoid": ["a", "b"],
            "spread": "host",
            "move": "allowed",
        }
    with amm_rules.annotate(replicate={"min": 2}):
        assert dask.get_annotations()["amm"] == {"replicate": {"min": 2}}
    with amm_rules.annotate(replicate={"min": 3, "max": 3}):
        assert dask.get_annotations()["amm"] == {"replicate": 3}


def test_annotate_does_not_know_the_schedulers_pools():
    # Pool names are checked for spelling only; the scheduler's rules decide if they exist.
    with amm_rules.annotate(pool="no-such-pool-here"):
        assert dask.get_annotations()["amm"] == {"pool": "no-such-pool-here"}


def test_nested_annotate_combines_field_by_field():
    with amm_rules.annotate(pool="gpu", replicate=2):
        with amm_rules.annotate(replicate=3):
            assert dask.get_annotations()["amm"] == {"pool": "gpu", "replicate": 3}
        assert dask.get_annotations()["amm"] == {"pool": "gpu", "replicate": 2}
    with dask.annotate(amm={"spread": "host"}), amm_rules.annotate(move="never"):
        assert dask.get_annotations()["amm"] == {"spread": "host", "move": "never"}


def test_annotate_keeps_other_annotations():
    with dask.annotate(retries=2), amm_rules.annotate(replicate=2):
        assert dask.get_annotations() == {"retries": 2, "amm": {"replicate": 2}}


_pool = st.sampled_from(["gpu", "cpu", "big_mem", "x-1"])
_count = st.integers(1, 50)
_fields = st.fixed_dictionaries(
    {},
    optional={
        "replicate": _count
        | st.builds(lambda a, b: {"min": min(a, b), "max": max(a, b)}, _count, _count)
        | st.builds(lambda a: {"min": a}, _count)
        | st.builds(lambda a: {"max": a}, _count),
        "pool": _pool | st.lists(_pool, min_size=1, max_size=3),
        "avoid": _pool | st.lists(_pool, min_size=1, max_size=3),
        "spread": st.sampled_from(["host", "none"]),
        "move": st.sampled_from(["allowed", "never"]),
    },
).filter(bool)


@given(_fields)
def test_plain_values_mean_the_same_as_the_input(fields):
    # What the client sends must parse, on the scheduler, to what the user wrote.
    plain = validate_annotation(fields)
    assert parse_actions(plain) == parse_actions(fields)
    assert validate_annotation(plain) == plain


# ----------------------------------------------------------------------------------
# On a cluster


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(), timeout=60)
async def test_annotate_around_submit_holds_copies(c, s, *workers):
    with amm_rules.annotate(replicate=2):
        x = c.submit(inc, 1, key="x-1")
    y = c.submit(inc, 2, key="y-1")  # outside the block: not annotated
    await c.gather([x, y])
    assert s.tasks["x-1"].annotations["amm"] == {"replicate": 2}
    assert "amm" not in (s.tasks["y-1"].annotations or {})
    await wait_for(lambda: copies(s, "x-1") == 2, "x-1 at its annotated 2 copies")
    # The target is held, not just reached: more cycles ask for nothing more.
    requests = Requests(s)
    await wait_cycles(s, 10)
    assert (requests.acquire, requests.remove) == ({}, {})
    assert counts(s, ["x-1", "y-1"]) == [2, 1]


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config())
async def test_dask_annotate_around_persist_of_an_array(c, s, *workers):
    x = da.ones(100, chunks=25) + 1
    with dask.annotate(amm={"replicate": 3}):
        x = c.persist(x)
    await x
    keys = [f.key for f in c.futures_of(x)]
    assert len(keys) == 4
    await wait_for(lambda: counts(s, keys) == [3] * 4, "every chunk at 3 copies")


@gen_cluster(client=True, nthreads=[("", 1), ("", 1, GPU)], config=amm_config(GPU_RULES))
async def test_annotation_pool_moves_data_into_the_pool(c, s, a, b):
    with amm_rules.annotate(pool="gpu"):
        x = c.submit(inc, 1, key="x-1", workers=[a.address])
    await x
    await wait_for(lambda: s.tasks["x-1"].who_has == {s.workers[b.address]}, "x-1 moved to b")


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(GPU_RULES), timeout=60)
async def test_invalid_annotation_is_ignored_with_a_warning_event(c, s, *workers):
    # Raw dask.annotate is not checked on the client, so bad values reach the scheduler.
    with dask.annotate(amm={"replicate": 0}):
        bad = c.submit(inc, 1, key="bad-1")
    with dask.annotate(amm={"pool": "no-such-pool"}):
        unknown = c.submit(inc, 2, key="unknown-1")
    with dask.annotate(amm="three"):
        garbage = c.submit(inc, 3, key="garbage-1")
    await c.gather([bad, unknown, garbage])

    def warned(key: str) -> bool:
        return any(
            msg.get("action") == "invalid-annotation" and msg.get("example_key") == key
            for _, msg in s.get_events("amm-rules")
        )

    await wait_for(
        lambda: all(warned(k) for k in ("bad-1", "unknown-1", "garbage-1")),
        "an invalid-annotation event for each key",
    )
    # The scheduler and the policy keep working: a valid annotation is still obeyed,
    # and the keys with invalid annotations are left under the rules (one copy).
    with amm_rules.annotate(replicate=3):
        good = c.submit(inc, 4, key="good-1")
    await good
    await wait_for(lambda: copies(s, "good-1") == 3, "good-1 at its annotated 3 copies")
    assert counts(s, ["bad-1", "unknown-1", "garbage-1"]) == [1, 1, 1]
    assert await c.submit(inc, 10) == 11
