"""The worker half of ``spill:``: a worker plugin that orders a worker's eviction by
value, reports which keys are on disk and reads back ahead the keys its tasks are about
to read.

The engine registers :class:`SpillPlugin` from the scheduler (docs/spill.md, "How it
is installed"). On a worker whose data is a ``SpillBuffer`` (a ``zict.Buffer`` whose
``fast`` mapping is a ``zict.LRU``), the plugin:

1. with ``order: value``, puts a :class:`~amm_rules.engine.spill.order.ValueOrder`
   in the place of the LRU's ``order``, with the keys already in memory in their order
   of use: every eviction, the buffer's own at its target and the memory monitor's
   ``evict()`` alike, then gives up the key of lowest value per byte; teardown puts
   back a plain ``order`` in the same order of use;
2. takes the values the scheduler sends (:data:`TO_WORKER`, one message per worker
   and cycle with the values that changed; in writes of the key's bytes, so that both
   sides measure alike) and counts, for each key in memory, the tasks of this worker
   about to read it (ready, waiting, constrained or executing), whose reads back from
   disk (as a share of a write, measured here) add to its value;
3. keeps which keys it wrote to disk and when, and sends the scheduler what changed
   (:data:`TO_SCHEDULER`: keys written, keys read back or gone, at most
   :data:`REPORT_KEYS` a message; the bytes and seconds written and read from the
   buffer's ``cumulative_metrics``; prefetches) every :data:`INTERVAL` seconds when
   anything changed;
4. with ``prefetch``, reads back the keys on disk that its tasks are about to read
   while the buffer is below :data:`PREFETCH_ROOM` of its target and the process
   below its target, on the event loop (where the worker reads a task's inputs: zict's
   buffer cannot read a key back from two threads at once), one key at a time, at
   most :data:`PREFETCH_BYTES` a turn.

A worker whose data is anything else is left alone: the plugin sends why, once.

Neighbours: :mod:`amm_rules.engine.sections.spill` installs it, computes the values
and reads the reports; :mod:`amm_rules.engine.spill.order` is the order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from amm_rules.engine.spill.order import ShadowLRU, ValueOrder

logger = logging.getLogger(__name__)

#: The plugin's name on the scheduler and the workers.
PLUGIN_NAME = "amm-rules-spill"
#: Stream operations: values from the scheduler, reports from the workers.
TO_WORKER = "amm-rules-spill-values"
TO_SCHEDULER = "amm-rules-spill-report"
#: Seconds between two turns of the plugin (report, readers, prefetch).
INTERVAL = 0.5
#: Keys written or read back told in one report, at most (the rest: the next one).
REPORT_KEYS = 5_000
#: A report is sent at least this often (seconds) while the counters move, else only
#: when keys were written or read back or the memory buffer's fill moved by more than
#: :data:`REPORT_FILL` of its target.
REPORT_EVERY = 5.0
REPORT_FILL = 0.05
#: Prefetch reads back while the memory buffer holds less than this share of its
#: target, and at most this many bytes a turn.
PREFETCH_ROOM = 0.8
PREFETCH_BYTES = 256 * 2**20
#: Seconds per byte of writing and of reading back assumed until the worker measured
#: its own (0.5 GB/s and 1 GB/s).
DEFAULT_WRITE = 2e-9
DEFAULT_READ = 1e-9
#: Task states in which a task of the worker is about to read its dependencies.
READING = frozenset({"waiting", "ready", "constrained", "executing", "long-running"})
#: The buffer's figures reported, as (label, unit) of ``cumulative_metrics``.
FIGURES = {
    "written_bytes": ("disk-write", "bytes"),
    "written_count": ("disk-write", "count"),
    "written_seconds": ("disk-write", "seconds"),
    "read_bytes": ("disk-read", "bytes"),
    "read_count": ("disk-read", "count"),
    "read_seconds": ("disk-read", "seconds"),
}


def foreign(data: Any) -> str | None:
    """Why a worker's data cannot be ordered (None: it can)."""
    fast = getattr(data, "fast", None)
    kind = type(data).__name__
    if fast is None or not hasattr(fast, "order") or not hasattr(fast, "weights"):
        return f"its data is a {kind}, not a SpillBuffer: eviction left as it is"
    if not hasattr(data, "slow") or not hasattr(data, "fast_to_slow_callbacks"):
        return f"its data is a {kind} without a zict.Buffer's disk: eviction left as it is"
    return None


def rates(metrics: Any) -> tuple[float, float]:
    """Seconds per byte of writing and of reading back, measured by the buffer
    (``cumulative_metrics``), else :data:`DEFAULT_WRITE` and :data:`DEFAULT_READ`."""
    out = []
    for label, default in (("disk-write", DEFAULT_WRITE), ("disk-read", DEFAULT_READ)):
        size = metrics.get((label, "bytes"), 0.0) if metrics else 0.0
        seconds = metrics.get((label, "seconds"), 0.0) if metrics else 0.0
        out.append(seconds / size if size >= 2**20 and seconds > 0 else default)
    return out[0], out[1]


class SpillPlugin(WorkerPlugin):
    """See the module docstring. ``order``: ``"value"`` or ``"lru"`` (stock order,
    reports and prefetch only); ``young``: seconds a key stored without a value counts
    as read once more, at most (:class:`~amm_rules.engine.spill.order.ValueOrder`)."""

    name = PLUGIN_NAME

    def __init__(self, order: str = "value", prefetch: bool = False, young: float = 0.0) -> None:
        self.order = order
        self.prefetch = prefetch
        self.young = young
        self.worker: Any = None
        self.data: Any = None
        self.values: ValueOrder | None = None
        #: With ``order: value``: what least-recently-used would have read back under
        #: the same accesses (an estimate), and the bytes read back when it started.
        self.shadow: ShadowLRU | None = None
        self._read_before = 0.0
        self._weight: Any = None
        #: Key -> (time.time() it was written, bytes in memory), for keys on disk.
        self.on_disk: dict[Hashable, tuple[float, int]] = {}
        #: Keys written, and keys read back or gone, not told yet.
        self.news: dict[Hashable, None] = {}
        self.gone: dict[Hashable, None] = {}
        #: Tasks of the worker about to read each key.
        self.readers: dict[Hashable, int] = {}
        self.prefetched = [0, 0]
        #: A read back's cost in writes of the same bytes, as last measured.
        self.read_rate = DEFAULT_READ / DEFAULT_WRITE
        self._callback: Any = None
        self._prefetching: asyncio.Task[None] | None = None
        self._last_report = 0.0
        self._last_figures: dict[str, float] = {}
        self._last_fast = 0.0
        self._last_process = 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {"order": self.order, "prefetch": self.prefetch, "young": self.young}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]

    # -- setup and teardown ------------------------------------------------------------

    def setup(self, worker: Any) -> None:
        self.worker = worker
        data = worker.data
        why = foreign(data)
        if why is not None:
            logger.warning("amm-rules spill: worker %s left alone: %s", worker.address, why)
            worker.stream_handlers.setdefault(TO_WORKER, ignore)
            self._send({"attached": False, "why": why})
            return
        self.data = data
        fast = data.fast
        with fast.lock:
            if self.order == "value":
                # Values are in writes of the key (see amm_rules.engine.decide.spill):
                # a key the scheduler did not value is one no task reads again.
                shadow = self.shadow = ShadowLRU()
                for key in data.slow:
                    shadow.disk[key] = 0.0  # its weight is known once read back
                self._read_before = float(data.cumulative_metrics.get(("disk-read", "bytes"), 0))
                # The keys in memory reach the shadow as the order adds them, in their
                # order of use.
                self.values = ValueOrder(
                    fast.order,
                    neutral=1.0,
                    weights=fast.weights,
                    shadow=shadow,
                    young=self.young,
                    young_value=self.read_rate,
                    disk=data.slow,  # still there while a key is read back
                )
                fast.order = self.values
                # Stores (and reads back) reach the shadow through the weight function.
                self._weight = weight = fast.weight

                def weigh(key: Hashable, value: Any) -> Any:
                    w = weight(key, value)
                    shadow.touch(key, w)
                    return w

                fast.weight = weigh
            data.fast_to_slow_callbacks.append(self._written)
            data.slow_to_fast_callbacks.append(self._read_back)
            now = time.time()
            for key in list(data.slow.keys()):
                self.on_disk[key] = (now, 0)
                self.news[key] = None
        worker.stream_handlers[TO_WORKER] = self._values
        from tornado.ioloop import PeriodicCallback

        self._callback = PeriodicCallback(self._turn, INTERVAL * 1000)
        self._callback.start()
        self._report(force=True)

    def teardown(self, worker: Any) -> None:
        if self._callback is not None:
            self._callback.stop()
        if self._prefetching is not None:
            self._prefetching.cancel()
        if worker.stream_handlers.get(TO_WORKER) == self._values:
            # Values the scheduler sent before it heard of the teardown may still
            # arrive: an operation without a handler would end the worker's stream.
            worker.stream_handlers[TO_WORKER] = ignore
        data = self.data
        if data is None:
            return
        fast = data.fast
        with fast.lock:
            if self.values is not None and fast.order is self.values:
                fast.order = type_of_stock_order()(self.values.keys_by_use())
            if self._weight is not None:
                fast.weight = self._weight
            for callbacks, mine in (
                (data.fast_to_slow_callbacks, self._written),
                (data.slow_to_fast_callbacks, self._read_back),
            ):
                if mine in callbacks:
                    callbacks.remove(mine)
        self.values = None
        self.data = None

    # -- the buffer's callbacks (any thread) -------------------------------------------

    def _written(self, key: Hashable, value: Any) -> None:
        weight = self.data.fast.weights.get(key, 0) if self.data is not None else 0
        if self.shadow is not None and self.data is not None:
            # The buffer gives room up: so does a stock one of the same size.
            self.shadow.fit(self.data.fast.total_weight - weight)
        self.on_disk[key] = (time.time(), int(weight))
        self.gone.pop(key, None)
        self.news[key] = None

    def _read_back(self, key: Hashable, value: Any) -> None:
        data = self.data
        if data is not None and key in data.slow:
            return  # written again as it was read back (the buffer evicts before telling)
        self._left_disk(key)

    def _left_disk(self, key: Hashable) -> None:
        # Told already (not among the news): the scheduler hears that it left.
        if self.on_disk.pop(key, None) is not None and self.news.pop(key, None) is None:
            self.gone[key] = None

    # -- worker events -------------------------------------------------------------------

    def transition(self, key: Hashable, start: str, finish: str, **kwargs: Any) -> None:
        """A key released from disk is gone; a task that starts to wait, or stops
        running, on this worker counts as a reader of its inputs, or no longer does (at
        once: a turn recounts them all, in case a transition was missed)."""
        if finish in ("released", "forgotten"):
            if key in self.on_disk:
                self._left_disk(key)
            if self.values is not None:
                self.values.forget((key,))
            if self.shadow is not None:
                self.shadow.forget(key)
        reading, was_reading = finish in READING, start in READING
        if reading == was_reading or self.values is None or self.worker is None:
            return
        ts = self.worker.state.tasks.get(key)
        if ts is None or not ts.dependencies:
            return
        step = 1 if reading else -1
        changed: dict[Hashable, float] = {}
        readers = self.readers
        for dep in ts.dependencies:
            count = max(0, readers.get(dep.key, 0) + step)
            if count:
                readers[dep.key] = count
            else:
                readers.pop(dep.key, None)
            changed[dep.key] = count * self.read_rate
        with self.data.fast.lock:
            self.values.update_readers(changed)

    def _values(self, values: Any = (), forget: Any = (), **kwargs: Any) -> None:
        """The scheduler's values: pairs (key, value per byte), keys to forget."""
        order = self.values
        if order is None or self.data is None:
            return
        sent: dict[Hashable, float | None] = {key: float(v) for key, v in values}
        sent.update((key, None) for key in forget)
        with self.data.fast.lock:
            order.set_values(sent)

    # -- each turn -----------------------------------------------------------------------

    def _turn(self) -> None:
        if self.data is None:
            return
        try:
            self._count_readers()
            self._report()
            if self.prefetch and (self._prefetching is None or self._prefetching.done()):
                self._prefetching = asyncio.ensure_future(self._prefetch())
        except Exception:  # never take the worker's loop down
            logger.exception("amm-rules spill: a turn of the worker plugin failed")

    def _count_readers(self) -> None:
        counts: dict[Hashable, int] = {}
        for ts in self.worker.state.tasks.values():
            if ts.state in READING:
                for dep in ts.dependencies:
                    counts[dep.key] = counts.get(dep.key, 0) + 1
        self.readers = counts
        if self.values is None:
            return
        write, read = rates(self.data.cumulative_metrics)
        self.read_rate = read = read / write  # in writes, as the scheduler's values
        with self.data.fast.lock:
            self.values.set_readers({k: n * read for k, n in self.readers.items()})
            self.values.set_young_value(read)

    def figures(self) -> dict[str, float]:
        metrics = getattr(self.data, "cumulative_metrics", None) or {}
        out = {name: float(metrics.get(spec, 0.0)) for name, spec in FIGURES.items()}
        out["prefetched_count"], out["prefetched_bytes"] = map(float, self.prefetched)
        shadow = self.shadow
        if shadow is not None:
            # What least-recently-used would have read back since the plugin started,
            # and what was (an estimate: see ShadowLRU).
            out["lru_read_bytes"] = float(shadow.read_bytes)
            out["read_since_bytes"] = out["read_bytes"] - self._read_before
        return out

    def _report(self, force: bool = False) -> None:
        now = time.monotonic()
        figures = self.figures()
        fast = self.data.fast
        process, spill_at = self._process()
        moved = figures != self._last_figures and now - self._last_report >= REPORT_EVERY
        filled = abs(fast.total_weight - self._last_fast) > REPORT_FILL * fast.n
        filled |= abs(process - self._last_process) > REPORT_FILL * spill_at
        if not (force or self.news or self.gone or moved or filled):
            return
        wall = time.time()
        spilled = []
        for key in list(self.news)[:REPORT_KEYS]:
            del self.news[key]
            since, size = self.on_disk.get(key, (wall, 0))
            spilled.append((key, max(0.0, wall - since), size))
        unspilled = list(self.gone)[:REPORT_KEYS]
        for key in unspilled:
            del self.gone[key]
        self._last_fast = fast.total_weight
        self._last_process = process
        self._send(
            {
                "attached": True,
                "order": self.order,
                "spilled": spilled,
                "unspilled": unspilled,
                "figures": figures,
                "target": float(fast.n),
                "fast": float(fast.total_weight),
                "process": float(process),
                "spill_at": float(spill_at),
                "valued": self.values.valued if self.values is not None else 0,
            }
        )
        self._last_report = now
        self._last_figures = figures

    def _send(self, msg: dict[str, Any]) -> None:
        worker = self.worker
        try:
            worker.batched_send({"op": TO_SCHEDULER, **msg})
        except Exception:  # a worker closing: nothing to tell
            logger.debug("amm-rules spill: report not sent", exc_info=True)

    # -- prefetch ------------------------------------------------------------------------

    def _process(self) -> tuple[float, float]:
        """The process's memory and the memory at which the worker's memory monitor
        starts writing to disk ((0, 0) where it does not: ``memory.spill: false``)."""
        manager = getattr(self.worker, "memory_manager", None)
        limit = getattr(manager, "memory_limit", None)
        fraction = getattr(manager, "memory_spill_fraction", False)
        monitor = getattr(self.worker, "monitor", None)
        if not limit or not fraction or monitor is None:
            return 0.0, 0.0
        return float(monitor.get_process_memory()), float(limit * fraction)

    def _room(self) -> float:
        """Bytes the buffer may read back now (0: none)."""
        fast = self.data.fast
        room = fast.n * PREFETCH_ROOM - fast.total_weight
        manager = getattr(self.worker, "memory_manager", None)
        limit = getattr(manager, "memory_limit", None)
        fraction = getattr(manager, "memory_target_fraction", None)
        monitor = getattr(self.worker, "monitor", None)
        # The process's memory counts where the memory monitor spills by it.
        spills = getattr(manager, "memory_spill_fraction", False) is not False
        if limit and fraction and spills and monitor is not None:
            room = min(room, limit * fraction - monitor.get_process_memory())
        return room

    async def _prefetch(self) -> None:
        budget = PREFETCH_BYTES
        for key in [k for k in self.readers if k in self.on_disk]:
            size = self.on_disk.get(key, (0.0, 0))[1]
            room = self._room()
            if size > min(room, budget) or room <= 0:
                return
            # On the event loop, as the worker reads a task's inputs before running it:
            # zict's buffer cannot read one key back from two threads at once.
            if self.shadow is not None:
                self.shadow.paused = True  # a stock buffer would not read it now
            try:
                done = self._read(key)
            finally:
                if self.shadow is not None:
                    self.shadow.paused = False
            await asyncio.sleep(0)
            if done:
                budget -= size
                self.prefetched[0] += 1
                self.prefetched[1] += size

    def _read(self, key: Hashable) -> bool:
        data = self.data
        if data is None or key not in data.slow:
            return False
        try:
            data[key]
        except KeyError:
            return False  # released meanwhile
        return True


def ignore(**msg: Any) -> None:
    """The handler of messages that arrive once their plugin is gone."""


def type_of_stock_order() -> Any:
    """The class of a stock LRU's ``order``."""
    from zict.utils import InsertionSortedSet

    return InsertionSortedSet
