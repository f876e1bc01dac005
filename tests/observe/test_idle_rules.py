"""A rule that matches nothing is loud: ``idle`` in the status, with near-miss hints,
on a real cluster (issue 26); the hints themselves are in
tests/language/test_near_miss.py."""

from __future__ import annotations

from typing import Any

from distributed.utils_test import gen_cluster, inc

from amm_rules.observe import conformance as conformance_module
from amm_rules.observe.conformance import conformance
from benchmarks.support.waiting import wait_cycles, wait_for
from tests.support.cluster import amm_config, policy_of
from tests.support.rulesets import GPU

RULES = {
    "version": 1,
    "rules": [
        # Reads the annotation; the data carries a resource restriction.
        {"name": "gpu", "match": "task.annotations.resources.FPGA >= 1", "replicate": 2},
        {"name": "incs", "match": 'task.prefix == "inc"', "replicate": 2},
        {"name": "typo", "match": 'task.prefix == "incc"', "replicate": 2},
    ],
}


def states(s: Any) -> dict[str, Any]:
    return {r.name: r for r in conformance(policy_of(s)).rules}


@gen_cluster(client=True, nthreads=[("", 1, GPU), ("", 1)], config=amm_config(RULES), timeout=90)
async def test_a_rule_matching_nothing_is_idle_with_hints(c: Any, s: Any, *w: Any) -> None:
    policy = policy_of(s)
    await wait_cycles(s, 2)
    # No key in memory yet: nothing to match, nothing to say.
    assert {r.state for r in conformance(policy).rules} == {"satisfied"}
    futures = c.map(inc, range(12), resources={"GPU": 1})
    await c.gather(futures)
    await wait_for(lambda: states(s)["incs"].keys == 12, "the inc rule governs 12 keys")
    await wait_cycles(s, 2)
    rows = states(s)
    assert rows["incs"].state == "satisfied"
    typo, gpu = rows["typo"], rows["gpu"]
    assert typo.state == gpu.state == "idle"
    assert typo.sentence == (
        "0 keys since the rules were loaded, 12 keys in memory; "
        "12 keys of prefix inc in memory (the rule says incc)"
    )
    assert gpu.sentence.endswith(
        "12 keys were made by tasks with resources={'GPU': 1} (use task.resources.FPGA)"
    )
    text = policy.answers.status()
    (row,) = [r for r in text["conformance"]["rules"] if r["name"] == "typo"]
    assert row["state"] == "idle"


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(RULES), timeout=90)
async def test_a_rule_that_matched_once_is_not_idle(c: Any, s: Any, *w: Any) -> None:
    x = c.submit(inc, 1, key="inc-1")
    await x
    await wait_for(lambda: states(s)["incs"].keys == 1, "incs governs its key")
    await wait_cycles(s, 2)
    del x
    y = c.submit(str, 1, key="other")
    await y
    await wait_for(lambda: states(s)["incs"].keys == 0, "the key released")
    await wait_cycles(s, 2)
    assert states(s)["incs"].state == "satisfied"  # it matched since it was loaded
    assert states(s)["typo"].state == "idle"


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config(RULES), timeout=90)
async def test_hints_are_taken_again_after_a_while_the_key_count_at_once(
    c: Any, s: Any, *w: Any, monkeypatch: Any
) -> None:
    """A status every second (an open page) reuses the hints for HINTS_FOR seconds (a
    census and a parse per idle rule cost milliseconds); the keys in memory are counted
    at each status."""
    monkeypatch.setattr(conformance_module, "HINTS_FOR", 3600.0)  # no race with the clock
    futures = c.map(inc, range(3))
    await c.gather(futures)
    await wait_for(lambda: states(s)["incs"].keys == 3, "the inc rule governs 3 keys")
    await wait_cycles(s, 2)
    before = states(s)["typo"].sentence
    assert before == (
        "0 keys since the rules were loaded, 3 keys in memory; "
        "3 keys of prefix inc in memory (the rule says incc)"
    )
    more = c.map(inc, range(10, 15))
    await c.gather(more)
    await wait_for(lambda: states(s)["incs"].keys == 8, "the inc rule governs 8 keys")
    assert states(s)["typo"].sentence == (
        "0 keys since the rules were loaded, 8 keys in memory; "
        "3 keys of prefix inc in memory (the rule says incc)"
    )
    monkeypatch.setattr(conformance_module, "HINTS_FOR", 0.0)
    assert states(s)["typo"].sentence == (
        "0 keys since the rules were loaded, 8 keys in memory; "
        "8 keys of prefix inc in memory (the rule says incc)"
    )


SHADOWING = {
    "version": 1,
    "rules": [
        {"name": "checkpoints", "match": 'task.prefix == "checkpoint"', "replicate": 3},
        {"name": "arrays-everywhere", "match": 'task.type == "numpy.ndarray"', "replicate": "all"},
        {"name": "typo", "match": 'task.prefix == "checkpont"', "replicate": 2},
    ],
}


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(SHADOWING), timeout=90)
async def test_a_rule_whose_every_match_is_taken_is_shadowed(c: Any, s: Any, *w: Any) -> None:
    """``checkpoints`` (replicate: 3) before ``arrays-everywhere`` (numpy arrays,
    replicate: all), three numpy checkpoint keys: explain shows them "matched;
    overridden" for arrays-everywhere, and status says so too: ``shadowed``, with who
    took its keys, in the rows, the JSON, the text and the metrics; a rule matching
    nothing stays ``idle``."""
    import numpy as np
    import prometheus_client

    from amm_rules.observe.text import render_status

    futures = [c.submit(np.ones, 4, key=f"checkpoint-{i}") for i in range(3)]
    await c.gather(futures)
    await wait_for(lambda: states(s)["checkpoints"].keys == 3, "checkpoints governs 3 keys")
    await wait_cycles(s, 2)
    rows = states(s)
    shadowed = rows["arrays-everywhere"]
    assert shadowed.state == "shadowed"
    assert shadowed.sentence == "matches 3 keys, all taken by checkpoints (replicate)"
    assert rows["typo"].state == "idle"
    report = policy_of(s).answers.status()
    (row,) = [r for r in report["conformance"]["rules"] if r["name"] == "arrays-everywhere"]
    assert row["state"] == "shadowed"
    assert row["shadowed"] == {
        "matched": 3,
        "taken_by": {"checkpoints": {"keys": 3, "fields": ["replicate"]}},
    }
    assert report["states"]["arrays-everywhere"] == "shadowed"
    text = render_status(report)
    assert "shadowed" in text and "matches 3 keys, all taken by checkpoints (replicate)" in text
    scraped = prometheus_client.generate_latest().decode()
    assert (
        f'dask_amm_rules_rule_state{{rule="arrays-everywhere",scheduler="{s.address}",'
        'state="shadowed"} 1.0'
    ) in scraped
    # explain says the same of a key.
    from amm_rules.observe.explain import explain_keys

    (answer,) = explain_keys(policy_of(s), ["checkpoint-0"]).values()
    (entry,) = [e for e in answer["cascade"] if e.get("rule") == "arrays-everywhere"]
    assert entry["matched"] and entry["overridden"] == {"replicate": "rule checkpoints"}
