"""The named workloads of the workloads benchmark, sized from a cluster's memory, with
their expected answers; and the modes the benchmark runs them under.

Four workloads, written for amm-rules from the descriptions of the seed's benchmarks
(distributed's "Rebalance during a moving cluster" discussion looked at them on
coiled's runtime benchmarks):

- ``double_diff``: the double difference of two large random arrays, ``a`` shifted by
  one along both axes minus ``b`` (``a[1:, 1:] - b[:-1, :-1]``: every output chunk
  reads four chunks of each input), stored with ``da.store`` into a numpy memmap;
- ``vorticity``: the curl of two random fields ``u`` and ``v`` with periodic forward
  differences (``(roll(v, -1, 0) - v) / dx - (roll(u, -1, 1) - u) / dy``), in small
  chunks (many tasks), stored into a numpy memmap;
- ``anom_mean``: the mean over time of the anomaly of a (year, day, x) array against
  its climatology (the mean of each day of the year over the years), a chunk per
  year: the data is read twice, once for the climatology and once for the anomaly, so
  it is held whole between the two;
- ``dataframe_align``: two frames with the same index, one of them in shuffled order
  across its partitions, aligned on the index (an inner join, a task-based shuffle of
  both) and the difference of their columns summed.

Each workload's data is a fraction of the cluster's memory (:data:`FRACTIONS`), so that
a bigger cluster gets bigger data at the same chunk sizes. :func:`build` returns what
to compute and how to check it; :func:`expected` computes the same answer with numpy
or pandas alone (the tests compare the two at a tiny size).

The imbalance variant (:class:`Imbalance`): the workload's inputs are persisted first
on one or two workers only (``producers``: those workers ran the producers) or before
the other workers joined (``late``), then the computation runs on every worker.

The modes (:data:`MODES`) are what the scheduler's Active Memory Manager runs: nothing,
distributed's own ``ReduceReplicas``, amm-rules with an empty rules file, with one
section of its own, or with ``examples/rules/recommended.yaml``. :func:`amm_config` is
the dask config of a mode.

Imported by :mod:`benchmarks.workloads` and by the tests; :func:`ship` sends the task
functions here to worker processes by value.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
RECOMMENDED = ROOT / "examples" / "rules" / "recommended.yaml"
MiB = 2**20
AMM = "distributed.scheduler.active-memory-manager"

#: The workloads, in the order a round runs them.
WORKLOADS = ("double_diff", "vorticity", "anom_mean", "dataframe_align")

#: Bytes of each workload's inputs as a fraction of the cluster's memory (the sum of
#: the workers' memory limits), and bytes of one chunk (arrays) or one partition
#: (frames) as a fraction of one worker's limit. Chosen so that distributed's defaults
#: spill on 4 worker processes of 768 MiB (workers start spilling at 60% of their
#: limit): what spills is what a workload must hold (``anom_mean``'s data, a shuffle's
#: pieces) and the working set of a task on large chunks (the arrays'). Measured on
#: distributed 2026.8 with the stock AMM (docs/performance.md): the arrays' chunks at
#: a 48th of the limit did not spill at all.
FRACTIONS = {
    "double_diff": 1.0,
    "vorticity": 0.75,
    "anom_mean": 0.75,
    "dataframe_align": 0.3,
}
CHUNKS = {
    "double_diff": 1 / 12,
    "vorticity": 1 / 12,
    "anom_mean": 1 / 48,
    "dataframe_align": 1 / 96,
}
#: Columns of each frame of ``dataframe_align`` (float64), and days of ``anom_mean``'s
#: year (its groups).
FRAME_COLUMNS = 16
DAYS = 32


# -- task functions (shipped by value to worker processes) -------------------------


class MemmapSink:
    """A ``da.store`` target: writes each block into a ``.npy`` file through a numpy
    memmap opened for the write and closed after it (a worker keeps no mapping, so its
    process memory holds none of the file)."""

    def __init__(self, path: str, shape: tuple[int, ...], dtype: str = "float64"):
        self.path = path
        self.shape = shape
        self.dtype = dtype
        self.ndim = len(shape)

    def create(self) -> MemmapSink:
        out = np.lib.format.open_memmap(self.path, mode="w+", dtype=self.dtype, shape=self.shape)
        del out
        return self

    def __setitem__(self, region: Any, value: np.ndarray) -> None:
        out = np.load(self.path, mmap_mode="r+")
        out[region] = value
        del out

    def read(self) -> np.ndarray:
        return np.load(self.path)


def load_block(seed: int, latency: float, block_info: Any = None) -> np.ndarray:
    """One block of an input array: random numbers drawn from the block's own seed
    (the same wherever and however often it runs), after ``latency`` seconds (storage
    read time; 0 unless the imbalance variant asks for it)."""
    info = block_info[None]
    if latency:
        time.sleep(latency)
    rng = np.random.default_rng((seed, *info["chunk-location"]))
    return rng.random(info["chunk-shape"])


def frame_part(
    i: int, parts: int, rows: int, width: int, seed: int, shuffled: bool, latency: float = 0.0
) -> Any:
    """Partition ``i`` of a frame of ``parts`` partitions of ``rows`` rows: index ``id``
    in order, or (``shuffled``) the same ids spread over every partition (a
    multiplicative permutation of ``0 .. parts * rows - 1``: each partition holds ids
    from the whole range); after ``latency`` seconds, as :func:`load_block`."""
    import pandas as pd

    if latency:
        time.sleep(latency)
    ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
    if shuffled:
        n = parts * rows
        ids = (ids * stride(n)) % n
    rng = np.random.default_rng((seed, i))
    data = {f"c{j}": rng.random(rows) for j in range(width)}
    return pd.DataFrame(data, index=pd.Index(ids, name="id"))


def stride(n: int) -> int:
    """A multiplier coprime to ``n`` near ``n`` times the golden ratio's fraction: ids
    ``k * stride(n) % n`` visit every id once, neighbours far apart."""
    s = max(1, int(n * 0.6180339887)) | 1
    while math.gcd(s, n) != 1:
        s += 2
    return s


def sum_columns(df: Any, columns: int) -> Any:
    return sum(df[f"c{j}"] - df[f"c{j}_r"] for j in range(columns))


def ship() -> None:
    """Send this module's functions to worker processes by value."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


# -- sizes --------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """A workload's sizes, from the cluster's memory."""

    name: str
    #: Arrays: the inputs' shape and chunks. Frames: partitions and rows per partition.
    shape: tuple[int, ...]
    chunks: tuple[int, ...]

    @property
    def input_bytes(self) -> int:
        n = FRAME_COLUMNS if self.name == "dataframe_align" else 1
        inputs = 1 if self.name == "anom_mean" else 2
        return inputs * math.prod(self.shape) * 8 * n


def shape_of(
    name: str,
    workers: int,
    memory_limit: int,
    fraction: float | None = None,
    chunk_fraction: float | None = None,
) -> Shape:
    """The sizes of workload ``name`` on ``workers`` workers of ``memory_limit`` bytes,
    its inputs taking ``fraction`` (default: :data:`FRACTIONS`) of their memory, in
    chunks of ``chunk_fraction`` of a worker's limit (default: :data:`CHUNKS`)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    total = (FRACTIONS[name] if fraction is None else fraction) * workers * memory_limit
    chunk = (CHUNKS[name] if chunk_fraction is None else chunk_fraction) * memory_limit
    if name in ("double_diff", "vorticity"):
        side_chunk = max(2, int(math.sqrt(chunk / 8)))
        side = max(2 * side_chunk, int(math.sqrt(total / 2 / 8)))
        side = max(side_chunk + 1, side)
        return Shape(name, (side, side), (side_chunk, side_chunk))
    if name == "anom_mean":
        width = max(1, int(chunk / 8 / DAYS))
        years = max(2, int(total / 8 / DAYS / width))
        return Shape(name, (years, DAYS, width), (1, DAYS, width))
    rows = max(4, int(chunk / 8 / FRAME_COLUMNS))  # dataframe_align
    parts = max(2, int(total / 2 / 8 / FRAME_COLUMNS / rows))
    return Shape(name, (parts, rows), (1, rows))


# -- the workloads ------------------------------------------------------------------


@dataclass
class Built:
    """One workload ready to run: ``inputs`` (collections the imbalance variant
    persists first), ``compute(inputs)`` (what to compute on them: collections whose
    results :func:`check` compares to :func:`expected`), the sinks it writes."""

    name: str
    shape: Shape
    seed: int
    inputs: list[Any]
    compute: Callable[[list[Any]], list[Any]]
    sinks: list[MemmapSink] = field(default_factory=list)


def random_array(
    shape: tuple[int, ...], chunks: tuple[int, ...], seed: int, latency: float = 0.0
) -> Any:
    """An input array of :func:`load_block` blocks."""
    import dask.array as da

    return da.map_blocks(
        load_block,
        seed=seed,
        latency=latency,
        chunks=da.core.normalize_chunks(chunks, shape),
        dtype="float64",
        meta=np.empty((0,) * len(shape)),
        name=f"load-{seed}-{latency}-{'x'.join(map(str, shape))}-{chunks[0]}",
    )


def build(
    name: str, shape: Shape, seed: int, sink_dir: Path | None = None, latency: float = 0.0
) -> Built:
    """Workload ``name`` at ``shape``; its sinks (arrays) go in ``sink_dir``; each input
    chunk takes ``latency`` seconds more to load."""
    import dask.array as da

    if name in ("double_diff", "vorticity"):
        assert sink_dir is not None, f"{name} stores into a memmap: give sink_dir"
        a = random_array(shape.shape, shape.chunks, seed, latency)
        b = random_array(shape.shape, shape.chunks, seed + 1, latency)
        side = shape.shape[0]
        out_shape = (side - 1, side - 1) if name == "double_diff" else (side, side)
        sink = MemmapSink(str(sink_dir / f"{name}-{seed}.npy"), out_shape).create()
        op = double_diff if name == "double_diff" else vorticity

        def store(inputs: list[Any]) -> list[Any]:
            return [da.store(op(*inputs), sink, lock=False, compute=False)]

        return Built(name, shape, seed, [a, b], store, [sink])
    if name == "anom_mean":
        data = random_array(shape.shape, shape.chunks, seed, latency)
        return Built(name, shape, seed, [data], lambda inputs: [anom_mean(inputs[0])])
    if name == "dataframe_align":
        left, right = frames(shape, seed, latency)
        return Built(name, shape, seed, [left, right], lambda inputs: [dataframe_align(*inputs)])
    raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")


def double_diff(a: Any, b: Any) -> Any:
    return a[1:, 1:] - b[:-1, :-1]


def spacing(n: int, chunk: int) -> Any:
    """Grid spacings of a stretched grid (1 to 2), so the division is not a no-op."""
    import dask.array as da

    return 1.0 + da.arange(n, chunks=chunk) / n


def vorticity(u: Any, v: Any) -> Any:
    import dask.array as da

    n, chunk = u.shape[0], u.chunks[0][0]
    dx, dy = spacing(n, chunk), spacing(n, chunk)
    dvdx = (da.roll(v, -1, axis=0) - v) / dx[:, None]
    dudy = (da.roll(u, -1, axis=1) - u) / dy[None, :]
    return dvdx - dudy


def anom_mean(data: Any) -> Any:
    """``data``: (year, day of the year, x). The climatology is each day's mean over
    the years; the anomaly's mean is taken over time (years and days)."""
    climatology = data.mean(axis=0)
    return (data - climatology).mean(axis=(0, 1))


def frames(shape: Shape, seed: int, latency: float = 0.0) -> tuple[Any, Any]:
    """The two frames of ``dataframe_align``: ids in order (known divisions), and the
    same ids shuffled over every partition."""
    parts, rows = shape.shape
    divisions = [i * rows for i in range(parts)] + [parts * rows - 1]
    left = frame(parts, rows, seed, False, latency, divisions, "left-part")
    right = frame(parts, rows, seed + 1, True, latency, None, "right-part")
    return left, right


def frame(
    parts: int,
    rows: int,
    seed: int,
    shuffled: bool,
    latency: float,
    divisions: list[int] | None,
    label: str,
) -> Any:
    import dask.dataframe as dd

    return dd.from_map(
        frame_part,
        range(parts),
        parts=parts,
        rows=rows,
        width=FRAME_COLUMNS,
        seed=seed,
        shuffled=shuffled,
        latency=latency,
        meta=frame_part(0, 1, 1, FRAME_COLUMNS, seed, False).iloc[:0],
        divisions=divisions,
        label=label,
        enforce_metadata=False,
    )


def dataframe_align(left: Any, right: Any) -> Any:
    joined = left.merge(
        right,
        how="inner",
        left_index=True,
        right_index=True,
        suffixes=("", "_r"),
        shuffle_method="tasks",
    )
    return joined.map_partitions(sum_columns, FRAME_COLUMNS, meta=("d", "f8")).sum()


def expected(built: Built) -> list[Any]:
    """The answer of ``built`` computed with numpy or pandas alone, in this process."""
    name, shape, seed = built.name, built.shape, built.seed
    if name == "dataframe_align":
        parts, rows = shape.shape
        import pandas as pd

        left = pd.concat(
            frame_part(i, parts, rows, FRAME_COLUMNS, seed, False) for i in range(parts)
        )
        right = pd.concat(
            frame_part(i, parts, rows, FRAME_COLUMNS, seed + 1, True) for i in range(parts)
        )
        joined = left.merge(right, left_index=True, right_index=True, suffixes=("", "_r"))
        return [float(sum_columns(joined, FRAME_COLUMNS).sum())]
    arrays = [np.asarray(x.compute(scheduler="sync")) for x in built.inputs]
    if name == "double_diff":
        a, b = arrays
        return [a[1:, 1:] - b[:-1, :-1]]
    if name == "vorticity":
        u, v = arrays
        n = u.shape[0]
        d = 1.0 + np.arange(n) / n
        return [(np.roll(v, -1, axis=0) - v) / d[:, None] - (np.roll(u, -1, axis=1) - u) / d]
    (data,) = arrays
    return [(data - data.mean(axis=0)).mean(axis=(0, 1))]


def answers(built: Built, computed: list[Any]) -> list[Any]:
    """What ``built`` produced: its sinks read back (arrays stored), else the computed
    results."""
    if built.sinks:
        return [sink.read() for sink in built.sinks]
    return [float(x) if np.ndim(x) == 0 else np.asarray(x) for x in computed]


def check(built: Built, computed: list[Any]) -> None:
    """Raise ``AssertionError`` unless ``built`` produced :func:`expected`'s answer."""
    for got, want in zip(answers(built, computed), expected(built), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=built.name)


# -- the imbalance variant ----------------------------------------------------------


@dataclass(frozen=True)
class Imbalance:
    """How the imbalance variant makes a few workers hold far more than the mean.

    ``producers``: the inputs are loaded and persisted on ``heavy`` workers only (they
    ran the producers); ``late``: they are persisted while only ``heavy`` workers run,
    and the others join once they are in memory. Either way the computation then runs
    on every worker. ``fraction`` of the cluster's memory is what the inputs take
    (instead of :data:`FRACTIONS`), in chunks of ``chunk_fraction`` of a worker's limit
    (instead of :data:`CHUNKS`); ``load_rate`` the bytes per second one thread
    loads (a chunk's load waits ``chunk bytes / load_rate``, storage's read time: a
    worker that runs the producers fills at a reader's pace, not at the pace numpy
    draws random numbers; None: no wait)."""

    kind: str = "producers"
    heavy: int = 1
    fraction: float = 0.35
    load_rate: float | None = 64 * MiB
    #: Chunks (and partitions) of this fraction of a worker's limit, smaller than the
    #: even runs' arrays': spread evenly, the computation does not spill, so what
    #: spills is the imbalance's doing.
    chunk_fraction: float = 1 / 48

    def __post_init__(self) -> None:
        if self.kind not in ("producers", "late"):
            raise ValueError(f"imbalance kind {self.kind!r}: producers or late")

    def latency(self, shape: Shape) -> float:
        """Seconds one input chunk of ``shape`` waits for storage."""
        if not self.load_rate:
            return 0.0
        per_chunk = math.prod(shape.chunks) * 8
        if shape.name == "dataframe_align":
            per_chunk = shape.shape[1] * FRAME_COLUMNS * 8
        return per_chunk / self.load_rate


# -- the modes ----------------------------------------------------------------------


#: Each mode's AMM: ``off`` (no AMM), ``stock`` (distributed's ``ReduceReplicas``), or
#: RulesPolicy with these rules. ``recommended`` is the shipped recommended file.
#: A section of the engine that lands later gets its mode here: one entry with the
#: section at its defaults, and its name in :data:`SECTION_MODES`. ``adaptive``
#: acts only on a cluster that adapts: on the benchmark's fixed cluster it answers
#: ``adaptive_target`` and nobody asks.
RULES: dict[str, dict[str, Any] | Path] = {
    "engine": {"version": 1},
    "rebalance": {"version": 1, "rebalance": {}},
    "memory-pressure": {"version": 1, "memory-pressure": {}},
    "protect": {"version": 1, "protect": {}},
    "spill": {"version": 1, "spill": {}},
    "adaptive": {"version": 1, "adaptive": {}},
    "recommended": RECOMMENDED,
}
#: The modes that turn on one section each (the section's name is the mode's).
SECTION_MODES = ("rebalance", "memory-pressure", "protect", "spill", "adaptive")
MODES = ("off", "stock", *RULES)
STOCK_POLICY = "distributed.active_memory_manager.ReduceReplicas"


def amm_config(mode: str, interval: float = 2.0) -> dict[str, Any]:
    """The dask config of ``mode`` (every mode at distributed's default AMM interval)."""
    if mode == "off":
        return {f"{AMM}.start": False}
    if mode == "stock":
        policy: dict[str, Any] = {"class": STOCK_POLICY}
    elif mode in RULES:
        rules = RULES[mode]
        policy = {
            "class": "amm_rules.RulesPolicy",
            "rules": str(rules) if isinstance(rules, Path) else rules,
        }
    else:
        raise ValueError(f"unknown mode {mode!r}; known: {', '.join(MODES)}")
    return {f"{AMM}.start": True, f"{AMM}.interval": interval, f"{AMM}.policies": [policy]}


def sections_of(mode: str) -> list[str]:
    """The sections of the rules file of ``mode`` (none for ``off`` and ``stock``)."""
    rules = RULES.get(mode)
    if isinstance(rules, Path):
        import yaml

        rules = yaml.safe_load(rules.read_text())
    return [k for k in rules or {} if k not in ("version", "rules", "pools")]
