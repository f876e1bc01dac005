"""The demo's workload plan (:mod:`amm_rules.demo_workload`), without a cluster: keys each
rule matches and decides, placed where the rule does not want them."""

from __future__ import annotations

from amm_rules.demo_workload import KINDS, MAX_NBYTES, plan, workers_for
from amm_rules.language.loader import check_text


def ruleset(text: str):
    rules, diagnostics = check_text(text)
    assert rules is not None, diagnostics
    return rules


def test_each_rule_gets_keys_it_matches_and_decides() -> None:
    rules = ruleset(
        "version: 1\npools:\n  gpu: worker.resources.GPU >= 1\nrules:\n"
        '  - name: big\n    match: task.nbytes > 4 MiB and task.key matches "blob-*"\n'
        "    move: never\n"
        '  - name: tagged\n    match: task.annotations["cache-tier"] == 2\n    avoid: gpu\n'
        '  - name: later\n    match: task.prefix == "blob"\n    replicate: 2\n'
        '  - name: arrays\n    match: task.type == "numpy.ndarray"\n    replicate: 2\n'
    )
    workload = plan(rules, kinds=["bytes", "numpy"])
    by_rule = {s.rule: s for s in workload.specs}
    big = by_rule["big"]
    assert (big.prefix, big.kind, big.placement, big.count) == ("blob", "bytes", "two-workers", 2)
    assert 4 * 2**20 < big.nbytes <= MAX_NBYTES
    assert by_rule["tagged"].annotations == {"cache-tier": 2}
    assert by_rule["tagged"].placement == "avoided"
    # 'later' also matches the big blobs; it gets small ones, which only it governs.
    later = by_rule["later"]
    assert (later.prefix, later.nbytes, later.desired.move) == ("blob", 256 * 2**10, None)
    assert by_rule["arrays"].kind == "numpy"
    assert workload.unmatched == []
    assert workload.scratch == "scratch"


def test_what_the_demo_cannot_make_is_listed() -> None:
    rules = ruleset(
        "version: 1\nrules:\n"
        '  - name: device\n    match: task.type == "cupy.ndarray"\n    replicate: 2\n'
        "  - name: huge\n    match: task.nbytes >= 1 GiB\n    replicate: 2\n"
        '  - name: arrays\n    match: task.type == "numpy.ndarray"\n    replicate: 2\n'
    )
    workload = plan(rules, kinds=["bytes"])  # as if numpy were not installed
    assert workload.unmatched == ["device", "huge", "arrays"]
    assert set(KINDS) >= {"bytes", "numpy", "pandas"}
    # The cause, where a module that is not installed would make the keys.
    assert workload.missing == {"arrays": [("numpy", "numpy.ndarray")]}


def test_a_rule_on_a_type_of_a_missing_module_names_the_module() -> None:
    rules = ruleset(
        "version: 1\nrules:\n"
        '  - name: frames\n    match: task.type == "pandas.core.frame.DataFrame"\n'
        "    replicate: 2\n"
        '  - name: any-pandas\n    match: task.type matches "pandas.*"\n    replicate: 2\n'
        '  - name: device\n    match: task.type == "cupy.ndarray"\n    replicate: 2\n'
    )
    workload = plan(rules, kinds=["bytes", "numpy"])  # as if pandas were not installed
    assert workload.missing == {
        "frames": [("pandas", "pandas.DataFrame")],
        "any-pandas": [("pandas", "pandas.DataFrame")],
    }
    assert workload.unmatched == ["frames", "any-pandas", "device"]


def test_a_rule_decided_first_by_another_is_unmatched_and_scratch_moves_aside() -> None:
    rules = ruleset(
        "version: 1\nrules:\n"
        "  - name: all\n    match: true\n    replicate: 2\n"
        '  - name: never-decides\n    match: task.prefix == "x"\n    replicate: 3\n'
    )
    workload = plan(rules, kinds=["bytes"])
    assert [s.rule for s in workload.specs] == ["all"]
    assert workload.unmatched == ["never-decides"]
    assert workload.scratch is None  # every key is governed


def test_keys_go_where_the_rule_does_not_want_them() -> None:
    rules = ruleset(
        "version: 1\npools:\n  gpu: worker.resources.GPU >= 1\nrules:\n"
        '  - name: on-gpu\n    match: task.prefix == "dev"\n    pool: gpu\n'
        '  - name: off-gpu\n    match: task.prefix == "host"\n    avoid: gpu\n'
    )
    specs = {s.rule: s for s in plan(rules, kinds=["bytes"]).specs}
    pools = {"a": ("gpu",), "b": (), "c": ("gpu",), "d": ()}
    order = ["a", "b", "c", "d"]
    assert workers_for(specs["on-gpu"], pools, order) == ["b", "d"]
    assert workers_for(specs["off-gpu"], pools, order) == ["a", "c"]
    # No such place: any one worker.
    assert workers_for(specs["on-gpu"], {w: ("gpu",) for w in order}, order) == ["a"]
