"""Which keys each worker holds on disk, as its ``spill`` plugin reported them.

The scheduler sees each worker's spilled total in its heartbeats (``ws.memory``), never
which keys. The worker plugin (:mod:`amm_rules.engine.spill.plugin`) reports what it
wrote and read back, in bounded batches; :class:`SpilledKeys` keeps it, per worker and
per key, with the time each key was written (the scheduler's clock: the worker says how
long ago, so clocks need not agree), the buffer's figures (bytes and seconds written
and read back, prefetches) and how full its memory buffer is. The ``spill`` section
feeds it from the reports; whoever wants to know what is on disk reads it from the
context (``ctx.spilled``): explain, status, the rebalancer and the drain.

Neighbours: :mod:`amm_rules.engine.sections.spill` feeds it.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterable, Mapping
from typing import Any

from amm_rules.engine.decide.spill import rule_value


class RuledKeys:
    """Keys whose rule sets ``spill``, filed or given a copy since the ``spill`` section
    last took them (:meth:`values`): the section sends their value to their holders in
    the next cycle, however full, where the sweep values a worker's keys only once it
    is near its target. Told by the governed keys (:meth:`GovernedKeys.follow_spill_rules
    <amm_rules.engine.state.governed.GovernedKeys.follow_spill_rules>`) and the key
    index's replica wrappers."""

    __slots__ = ("_keys", "told")

    def __init__(self) -> None:
        #: (task, the worker that gained a copy, or None: every holder).
        self._keys: list[tuple[Any, Any]] = []
        #: Whether any key was ever told (an annotation's or a runtime target's spill
        #: included, which no rule shows).
        self.told = False

    def filed(self, tasks: Iterable[Any]) -> None:
        """Keys filed with a rule's ``spill`` (every holder is told)."""
        self._keys.extend((ts, None) for ts in tasks)
        self.told = True

    def copied(self, ts: Any, ws: Any) -> None:
        """A key whose rule sets ``spill`` gained a copy on ``ws``."""
        self._keys.append((ts, ws))

    def values(
        self,
        desired: Mapping[Hashable, Any],
        reported: Container[str],
        sent: dict[str, dict[Hashable, float]],
    ) -> dict[str, list[tuple[Hashable, float]]]:
        """Take the keys told since the last call: worker -> the values to send it (a
        rule's ``last`` is an infinite value, ``first`` zero), for the holders whose
        plugin ``reported``, unless ``sent`` (worker -> key -> value, updated) has it."""
        keys, self._keys = self._keys, []
        out: dict[str, list[tuple[Hashable, float]]] = {}
        for ts, ws in keys:
            d = desired.get(ts.key)
            value = rule_value(d.spill) if d is not None else None
            who_has = ts.who_has
            if value is None or not who_has:
                continue
            for holder in (ws,) if ws is not None else who_has:
                address = holder.address
                if address not in reported or holder not in who_has:
                    continue
                mine = sent.setdefault(address, {})
                if mine.get(ts.key) != value:
                    mine[ts.key] = value
                    out.setdefault(address, []).append((ts.key, value))
        return out

    def clear(self) -> None:
        self._keys = []


class WorkerDisk:
    """One worker's report: keys on disk and the buffer's figures."""

    __slots__ = (
        "bytes",
        "fast",
        "figures",
        "keys",
        "order",
        "process",
        "spill_at",
        "target",
        "valued",
    )

    def __init__(self) -> None:
        #: Key -> (when it was written, on the engine's clock; bytes in memory).
        self.keys: dict[Hashable, tuple[float, int]] = {}
        #: Bytes (in memory) of the keys on disk, kept as they come and go.
        self.bytes = 0
        #: The buffer's cumulative figures (see ``plugin.FIGURES``), prefetches.
        self.figures: dict[str, float] = {}
        #: Bytes in the memory buffer, and its target (bytes), at the last report.
        self.fast = 0.0
        self.target = 0.0
        #: The process's memory, and where the worker's memory monitor starts writing
        #: to disk (0: it does not), at the last report.
        self.process = 0.0
        self.spill_at = 0.0
        #: The order it follows (``value`` or ``lru``) and keys it has a value for.
        self.order = ""
        self.valued = 0

    @property
    def fullness(self) -> float:
        """How near the worker is to writing to disk: its memory buffer's share of its
        target, or its process's share of the memory monitor's spill threshold,
        whichever is larger (0 when unknown)."""
        buffer = self.fast / self.target if self.target > 0 else 0.0
        process = self.process / self.spill_at if self.spill_at > 0 else 0.0
        return max(buffer, process)

    def excess(self, share: float) -> float:
        """Bytes to give up for the worker to be at ``share`` of both limits."""
        return max(
            self.fast - share * self.target,
            self.process - share * self.spill_at if self.spill_at > 0 else 0.0,
        )


class SpilledKeys:
    """Keys on disk per worker and per key (see the module docstring)."""

    def __init__(self) -> None:
        #: Worker address -> its report.
        self.workers: dict[str, WorkerDisk] = {}
        #: Key -> worker address -> when it was written there (engine's clock).
        self.by_key: dict[Hashable, dict[str, float]] = {}
        #: Workers left alone, with why (their data is not a SpillBuffer).
        self.left_alone: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self.by_key)

    def __contains__(self, key: object) -> bool:
        return key in self.by_key

    def report(
        self,
        worker: str,
        now: float,
        spilled: Iterable[Any] = (),
        unspilled: Iterable[Hashable] = (),
        figures: Mapping[str, float] | None = None,
        fast: float = 0.0,
        target: float = 0.0,
        order: str = "",
        valued: int = 0,
        process: float = 0.0,
        spill_at: float = 0.0,
    ) -> WorkerDisk:
        """Take one report of ``worker``: ``spilled`` as (key, seconds ago, bytes)."""
        disk = self.workers.setdefault(worker, WorkerDisk())
        self.left_alone.pop(worker, None)
        keys = disk.keys
        by_key = self.by_key
        for key, ago, size in spilled:
            since = now - float(ago)
            old = keys.get(key)
            if old is not None:
                disk.bytes -= old[1]
            keys[key] = (since, int(size))
            disk.bytes += int(size)
            by_key.setdefault(key, {})[worker] = since
        for key in unspilled:
            left = keys.pop(key, None)
            if left is not None:
                disk.bytes -= left[1]
                self._forget(key, worker)
        if figures:
            disk.figures = dict(figures)
        disk.fast, disk.target = float(fast), float(target)
        disk.order, disk.valued = order, int(valued)
        disk.process, disk.spill_at = float(process), float(spill_at)
        return disk

    def alone(self, worker: str, why: str) -> None:
        """``worker`` runs the plugin but its data cannot be ordered."""
        self.left_alone[worker] = why
        self.worker_left(worker)

    def worker_left(self, worker: str) -> None:
        """Forget a worker (it left, or its plugin was removed)."""
        disk = self.workers.pop(worker, None)
        if disk is None:
            return
        for key in disk.keys:
            self._forget(key, worker)

    def clear(self) -> None:
        self.workers.clear()
        self.by_key.clear()
        self.left_alone.clear()

    def _forget(self, key: Hashable, worker: str) -> None:
        holders = self.by_key.get(key)
        if holders is not None:
            holders.pop(worker, None)
            if not holders:
                del self.by_key[key]

    def on_disk(self, key: Hashable) -> Mapping[str, float]:
        """Worker address -> when the key was written to disk there."""
        return self.by_key.get(key, {})

    def is_on_disk(self, key: Hashable, worker: str) -> bool:
        holders = self.by_key.get(key)
        return holders is not None and worker in holders

    def total_bytes(self) -> int:
        return sum(disk.bytes for disk in self.workers.values())

    def figure(self, name: str) -> float:
        """A figure added up over the workers (``written_bytes``, ...)."""
        return sum(disk.figures.get(name, 0.0) for disk in self.workers.values())
