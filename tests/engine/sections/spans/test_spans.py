"""Rules that read spans on a real scheduler: ``task.span`` from distributed's span
annotation, and ``task.span_done`` kept current by the spans section, so that copies
are kept while a span's computation runs and given up once it is done."""

from __future__ import annotations

from typing import Any

from distributed import Event, span
from distributed.utils_test import gen_cluster, inc

from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import amm_config, counts, policy_of

WHILE_RUNNING = {
    "version": 1,
    "rules": [
        {
            "name": "training",
            "match": 'task.span matches "train/*" and not task.span_done',
            "replicate": 2,
        },
        {"name": "loading", "match": 'task.span == "etl/load"', "replicate": 3},
    ],
}


def wait_event(event: Any) -> int:
    event.wait()
    return 1


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(WHILE_RUNNING), timeout=90)
async def test_copies_are_kept_while_the_span_runs(c: Any, s: Any, *workers: Any) -> None:
    event = Event()
    with span("train", "epoch-1"):
        early = c.submit(inc, 1, key="early")
        late = c.submit(wait_event, event, key="late")
    outside = c.submit(inc, 2, key="outside")
    with span("etl"), span("load"):
        loaded = c.submit(inc, 3, key="loaded")
    await wait_for(lambda: counts(s, [early]) == [2], "the span's key at 2 copies")
    await wait_for(lambda: counts(s, [loaded]) == [3], "etl/load's key at 3 copies")
    policy = policy_of(s)
    assert policy.ruleset.rules[0].name == "training"
    assert counts(s, [outside]) == [1]  # the default span: no rule
    # train/epoch-1 (running), the default span and etl/load (done).
    assert policy.answers.status()["spans"] == {"followed": 3, "done": 2}
    # The span is done once its last task finished: its keys go back to one copy.
    await event.set()
    await late
    await wait_for(lambda: counts(s, [early, late]) == [1, 1], "the span's keys at 1 copy")
    assert counts(s, [loaded]) == [3]
    await wait_cycles(s, 3)
    assert counts(s, [early]) == [1]


@gen_cluster(client=True, nthreads=[("", 1)] * 2, config=amm_config(WHILE_RUNNING), timeout=60)
async def test_a_span_running_again_is_not_done(c: Any, s: Any, *workers: Any) -> None:
    """A key classified once its span is done is not governed; ``span_done`` is read as
    the span is when the key is classified."""
    with span("train", "epoch-2"):
        x = c.submit(inc, 10, key="x")
    await x
    await wait_cycles(s, 3)
    assert counts(s, [x]) == [1]
    states = policy_of(s).ctx.spans.published
    assert list(states.values()) == [True]
