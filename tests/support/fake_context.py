"""A small engine context with no cluster behind it, to unit-test one section.

:func:`engine` builds an :class:`~amm_rules.engine.context.EngineContext` on a recorded
cluster made from a few lines of specs (:class:`~amm_rules.offline.sim_cluster.SimCluster`:
scheduler-shaped tasks and workers), with distributed's own Active Memory Manager over it,
the rules installed and the keys in memory classified, as the policy has them after
attaching. Sections are built with its context (``Replication(e.ctx)``);
:meth:`Engine.cycle` runs one cycle of the sections given (each attached first), as the
policy runs its steps (:func:`amm_rules.engine.sections.steps`), and returns what the
AMM asked the workers for; the clock is the test's.

    e = engine("rules: [...]", workers={"a": {}, "b": {"host": "h2"}}, keys={"x": ["a"]})
    assert e.cycle(Replication(e.ctx)) == [("replicate", "b", "x")]

Worker addresses are the names given; a key is given by its holders, or a mapping with
``holders`` and any of ``nbytes``, ``prefix``, ``waiters``, ``annotations``.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import yaml
from dask.utils import key_split
from distributed.active_memory_manager import (
    ActiveMemoryManagerPolicy,
    Suggestion,
)

from amm_rules.engine.sections import steps
from amm_rules.engine.sections.base import Cycle, Section
from amm_rules.language.loader import load_ruleset
from amm_rules.offline.dump import ClusterState, TaskRecord, WorkerRecord
from amm_rules.offline.sim_cluster import SimCluster
from amm_rules.offline.simulate import offline_context


class _Sections(ActiveMemoryManagerPolicy):
    """The sections of one cycle, as an AMM policy."""

    def __init__(self, engine: Engine, sections: Iterable[Section]):
        self.engine = engine
        self.sections = tuple(sections)

    def run(self) -> Any:
        engine = self.engine
        cycle = Cycle(engine.full, engine.now, time.perf_counter())
        engine.full = False
        for section in steps(engine.ctx, cycle, self.sections):
            yield from section.run(cycle)


class Engine:
    """An engine context on a recorded cluster (see the module docstring)."""

    def __init__(self, rules: str | Mapping[str, Any], state: ClusterState, measure: str):
        self.cluster = SimCluster(state)
        self.now = 0.0
        #: The next cycle checks every governed key (as after workers changed).
        self.full = True
        mapping = yaml.safe_load(rules) if isinstance(rules, str) else rules
        self.ctx = ctx = offline_context(
            load_ruleset(mapping),
            self.cluster,
            clock=lambda: self.now,
            policies=set(),
            measure=measure,
        )
        ctx.placements.refresh(measure, True)
        #: The sections attached so far.
        self.sections: list[Section] = []

    def attach(self, *sections: Section) -> None:
        """Configure and attach ``sections`` (built with :attr:`ctx`)."""
        ctx = self.ctx
        for section in sections:
            assert section.ctx is ctx, "build the section with the engine's context"
            self.sections.append(section)
            section.configure(ctx.ruleset, ctx.dry_run)
            section.attach()

    def cycle(self, *sections: Section, now: float = 0.0) -> list[tuple[str, str, Hashable]]:
        """One AMM cycle of ``sections`` (attached first if they are not), at ``now``;
        returns what the AMM asked the workers for: ``(op, address, key)``."""
        self.attach(*(s for s in sections if s not in self.sections))
        self.now = now
        amm = self.ctx.manager
        assert amm is not None
        policy = _Sections(self, sections)
        amm.policies.clear()
        amm.add_policy(policy)
        self.cluster.requested = []
        amm.run_once()
        return sorted(self.cluster.requested, key=repr)

    def suggest(self, section: Section, now: float = 0.0) -> list[Suggestion]:
        """What one section yields in a cycle, every suggestion answered as accepted
        (no AMM in between)."""
        self.attach(*(() if section in self.sections else (section,)))
        self.now = now
        cycle = Cycle(self.full, now, time.perf_counter())
        out = []
        gen = iter(next(steps(self.ctx, cycle, (section,))).run(cycle))
        send = getattr(gen, "send", None)
        answer = None
        while True:
            try:
                s = next(gen) if send is None or answer is None else send(answer)
            except StopIteration:
                return out
            out.append(s)
            answer = next(iter(s.candidates)) if s.candidates else object()


def engine(
    rules: str | Mapping[str, Any],
    workers: Mapping[str, Mapping[str, Any]],
    keys: Mapping[Hashable, Any],
    measure: str = "managed",
) -> Engine:
    """An :class:`Engine` on ``workers`` (address -> ``host``, ``resources``, ``status``,
    ``memory_limit``) holding ``keys`` (key -> holders, or a mapping with ``holders``)."""
    tasks = {}
    held: dict[str, list[Hashable]] = {a: [] for a in workers}
    for key, spec in keys.items():
        spec = {"holders": spec} if not isinstance(spec, Mapping) else spec
        holders = tuple(spec["holders"])
        nbytes = int(spec.get("nbytes", 1000))
        prefix = spec.get("prefix", key_split(key))
        tasks[key] = TaskRecord(
            key=key,
            state="memory",
            prefix=prefix,
            group=prefix,
            nbytes=nbytes,
            who_has=holders,
            waiters=tuple(spec.get("waiters", ())),
            annotations=dict(spec.get("annotations", {})),
        )
        for a in holders:
            held[a].append(key)
    records = {}
    for address, spec in workers.items():
        managed = sum(tasks[k].nbytes for k in held[address])
        records[address] = WorkerRecord(
            address=address,
            name=address,
            host=spec.get("host", "h1"),
            status=spec.get("status", "running"),
            resources=dict(spec.get("resources", {})),
            memory_limit=int(spec.get("memory_limit", 1_000_000)),
            memory={"managed": managed, "process": managed, "unmanaged_old": 0},
            has_what=held[address],
        )
    return Engine(rules, ClusterState("test", records, tasks), measure)
