"""``enforcement: dry-run``: on a rule, on the rebalance section, on the whole file.

The engine classifies, plans and reports (status, explain, cycle events) what is in
dry-run, and enacts none of it; on a real scheduler and workers, and through the filter
on its own.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict

import numpy as np
from distributed.active_memory_manager import ActiveMemoryManagerExtension
from distributed.utils_test import gen_cluster

from amm_rules.engine.dryrun import DryRun, hold_back
from amm_rules.engine.policy import RulesPolicy
from amm_rules.language.loader import load_ruleset
from amm_rules.language.ruleset import Desired, Reason, Target
from benchmarks.support.waiting import cycles, wait_cycles, wait_for
from tests.support.cluster import amm_config, counts, events, inc, no_errors, policy_of, rules

MIXED = rules(
    {"name": "three", "match": 'task.prefix == "inc"', "replicate": 3, "enforcement": "dry-run"},
    {"name": "two", "match": 'task.key matches "x-*"', "replicate": 2},
)


@gen_cluster(client=True, nthreads=[("", 1)] * 4, config=amm_config(MIXED), timeout=120)
async def test_a_dry_run_rule_makes_no_copy_and_reports_what_it_would(c, s, *workers):
    dry = c.map(inc, range(3))
    acting = c.map(inc, range(2), key=["x-0", "x-1"])
    await c.gather([*dry, *acting])
    policy = policy_of(s)
    # The enforced rule acts ...
    await wait_for(lambda: counts(s, acting) == [2, 2], "x-0 and x-1 at 2 copies")
    # ... the dry-run rule plans two copies per key, every cycle, and makes none.
    await wait_for(
        lambda: policy.last_cycle.get("three", {}).get("would_request") == 6,
        "a cycle in which rule three would request 6 copies",
    )
    await wait_cycles(s, 5)
    assert counts(s, dry) == [1, 1, 1]
    status = s.handlers["amm_rules_status"]()
    assert status["dry_run"] == {"rules": ["three"], "rebalance": False}
    assert status["enforcement"] == "enforce"
    assert status["last_cycle"]["three"]["governed"] == 3
    assert status["last_cycle"]["three"]["unmet"] == 0  # it could be met: it is not acted on
    assert "three" not in status["totals"] or status["totals"]["three"]["requested"] == 0
    assert "would_request" not in status["last_cycle"].get("two", {})

    explained = await s.handlers["amm_rules_explain"](keys=[dry[0].key, "x-0"])
    mine = explained[str(dry[0].key)]
    assert mine["dry_run"] == "three"
    assert [w["op"] for w in mine["would"]] == ["replicate", "replicate"]
    assert explained["x-0"]["dry_run"] is None

    # Conformance: the rule is in dry-run, its keys held back (not "in progress").
    from amm_rules.observe.conformance import conformance

    (three,) = [r for r in conformance(policy).rules if r.name == "three"]
    assert (three.state, dict(three.unmet)) == ("dry-run", {"dry-run": 3})
    decisions = [d for d in policy.journal.decisions if d.source == "three"]
    assert decisions and {d.outcome for d in decisions} == {"dry-run"}

    await wait_for(
        lambda: any("dry_run" in e for e in events(s, "cycle")), "a dry-run cycle event"
    )
    (last,) = [e for e in events(s, "cycle") if "dry_run" in e][-1:]
    assert last["dry_run"]["three"] == {"would_request": 6}
    no_errors(s)


DRY_FILE = """\
version: 1
enforcement: {mode}
rules:
  - name: three
    match: task.prefix == "inc"
    replicate: 3
"""


@gen_cluster(client=True, nthreads=[("", 1)] * 3, config=amm_config(None, start=False))
async def test_a_dry_run_file_holds_everything_back_until_enforced(c, s, *workers, tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(DRY_FILE.format(mode="dry-run"))
    policy = RulesPolicy(str(path))
    amm = ActiveMemoryManagerExtension(s, {policy}, register=False, start=False)
    futures = c.map(inc, range(2))
    other = c.submit(inc, 10, key="other-0")
    await c.gather([*futures, other])
    # A runtime target in a dry-run file is held back too.
    s.handlers["amm_rules_set_target"](keys=["other-0"], target=2)
    await cycles(amm)
    assert policy.last_cycle["three"]["would_request"] == 4
    assert policy.last_cycle["(runtime)"]["would_request"] == 1
    assert counts(s, [*futures, other]) == [1, 1, 1]

    # The same file, enforced: the next cycles act.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(DRY_FILE.format(mode="enforce"))
    os.replace(tmp, path)
    await cycles(amm)
    assert policy.dry_run.rules == frozenset()
    assert counts(s, [*futures, other]) == [3, 3, 2]
    no_errors(s)


#: Rebalancing by managed memory (gen_cluster's workers share one process, so process
#: memory says nothing about one of them), against a small limit, monitor off; a cycle
#: event for every cycle that did (or would have done) something.
REBALANCE_DRY = {
    **amm_config(
        rules(
            rebalance={
                "measure": "managed",
                "sender-min": "10%",
                "enforcement": "dry-run",
            }
        ),
        summary_interval=0,
    ),
    **{f"distributed.worker.memory.{n}": False for n in ("target", "spill", "pause", "terminate")},
}


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    worker_kwargs={"memory_limit": "10 MiB"},
    config=REBALANCE_DRY,
    timeout=60,
)
async def test_rebalancing_in_dry_run_moves_nothing(c, s, a, b):
    futures = [
        c.submit(np.full, 100_000 // 8, float(i), key=f"big-{i}", workers=[a.address])
        for i in range(20)
    ]
    await c.gather(futures)
    # A cycle's event, not the latest cycle: a move held back cools its key down, so
    # the next cycles may plan nothing (and the first plan can come before the gather
    # returns).
    await wait_for(
        lambda: any(
            e.get("dry_run", {}).get("(rebalance)", {}).get("would_request", 0) > 0
            for e in events(s, "cycle")
        ),
        "a cycle in which rebalancing would move copies",
        show=lambda: (policy_of(s).last_cycle, events(s, "cycle")[-3:]),
    )
    await wait_cycles(s, 3)
    assert all(s.tasks[f.key].who_has == {s.workers[a.address]} for f in futures)
    assert s.handlers["amm_rules_status"]()["dry_run"]["rebalance"] is True
    no_errors(s)


# -- the filter on its own --------------------------------------------------------------


def test_label_names_the_first_field_decided_in_dry_run() -> None:
    ruleset = load_ruleset(
        {
            "version": 1,
            "pools": {"gpu": "true"},
            "rules": [
                {"name": "pin", "match": "true", "pool": "gpu", "enforcement": "dry-run"},
                {"name": "keep", "match": "true", "replicate": 2},
            ],
        }
    )
    dry = DryRun(ruleset)
    both = Desired(
        replicate=Target(2, 2),
        pool=("gpu",),
        reasons={"replicate": Reason("rule", "keep"), "pool": Reason("rule", "pin")},
    )
    only_keep = Desired(replicate=Target(2, 2), reasons={"replicate": Reason("rule", "keep")})
    annotated = Desired(replicate=Target(3, 3), reasons={"replicate": Reason("annotation")})
    assert dry.label(both) == "pin"
    assert dry.label(only_keep) is None
    assert dry.label(annotated) is None  # the file acts: annotations act
    assert not dry.rebalance

    whole = DryRun(load_ruleset({"version": 1, "enforcement": "dry-run"}))
    assert whole.label(annotated) == "(annotation)"
    assert whole.rebalance


def test_hold_back_answers_none_counts_and_returns() -> None:
    class S:
        def __init__(self, op: str, key: str):
            self.op = op
            self.key = key

    answers = []

    def source():
        for op, key in [("replicate", "a"), ("drop", "b"), ("replicate", "c")]:
            answers.append((key, (yield S(op, key))))
        return "done"

    stats: defaultdict[str, Counter[str]] = defaultdict(Counter)
    gen = hold_back(source(), lambda s: "dry" if s.key != "b" else None, stats)
    passed = []
    reply = None
    try:
        while True:
            s = gen.send(reply)
            passed.append(s.key)
            reply = "worker"
    except StopIteration as stop:
        assert stop.value == "done"
    assert passed == ["b"]
    assert answers == [("a", None), ("b", "worker"), ("c", None)]
    assert stats["dry"] == Counter({"would_request": 2})


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    scheduler_kwargs={"dashboard": True, "dashboard_address": "127.0.0.1:0"},
    config=amm_config(MIXED),
)
async def test_metrics_show_what_dry_run_holds_back(c, s, *workers):
    from tornado.httpclient import AsyncHTTPClient

    futures = c.map(inc, range(3))
    await c.gather(futures)
    policy = policy_of(s)
    await wait_for(
        lambda: policy.last_cycle.get("three", {}).get("would_request") == 6,
        "a cycle in which rule three would request 6 copies",
    )
    url = f"http://127.0.0.1:{s.http_server.port}/metrics"
    text = (await AsyncHTTPClient().fetch(url)).body.decode()

    def sample(name: str, value: float, **labels: str) -> bool:
        wanted = [f'{k}="{v}"' for k, v in {**labels, "scheduler": s.address}.items()]
        return any(
            line.startswith(name + "{")
            and line.endswith(f" {value}")
            and all(w in line for w in wanted)
            for line in text.splitlines()
        )

    assert sample("dask_amm_rules_dry_run_would_request", 6.0, rule="three")
    assert sample("dask_amm_rules_dry_run_would_request", 0.0, rule="two")
    assert sample("dask_amm_rules_rule_state", 1.0, rule="three", state="dry-run")
    assert sample("dask_amm_rules_keys_unmet", 3.0, rule="three", reason="dry-run")
    assert counts(s, futures) == [1, 1, 1]
