"""The words of the package's sentences: counts with nouns, sizes, rates, durations and
times, as dask writes them, and the sentences of what the engine's pure parts compute.

- **Sizes** are dask's (:func:`dask.utils.format_bytes`: ``2.00 MiB``, ``1.21 kiB``,
  ``512 B``), so that status, explain, the dashboard page, the offline reports and
  dask's own dashboard write one size one way.
- **Durations** are dask's (:func:`dask.utils.format_time`: ``20m 34s``, ``3hr 25m``,
  ``14d 6hr``) from ten minutes up. Below, dask writes two decimals (``95.00 s``,
  ``450.00 ms``, ``400.00 us``), a precision the engine's estimates and countdowns do
  not have: seconds, and milliseconds below a second, whole from ten and with one
  decimal below (``95 s``, ``2.5 s``, ``450 ms``, ``3.2 ms``).
- **Counts**: :func:`~amm_rules.language.plurals.counted` (``1 key``, ``3 copies``).

Why here: the language half may not import dask, nor may the engine's pure parts
(``engine/decide/``, ``tests/test_layout.py``), while the engine's sections (drain,
protect, recompute costs, departures) speak in these words as well as status, explain,
the page, the command line and the offline reports above the engine. The engine is the
lowest place open both to dask and to every part that writes sentences. The plural rule
alone needs no dask and lives in the language half (:mod:`amm_rules.language.plurals`),
which its reporters and the pure parts use; it is given here with the rest.

The pure parts compute figures; the sentences made of them with sizes and durations
(those of :mod:`amm_rules.engine.decide.drain` and :mod:`~amm_rules.engine.decide.adaptive`)
are here.
"""

from __future__ import annotations

import time
from collections.abc import Container, Sequence
from typing import Any

from dask.utils import format_bytes, format_time

from amm_rules.engine.decide import adaptive
from amm_rules.engine.decide.drain import BELOW_MIN, RECOMPUTE, DrainItem, Prediction
from amm_rules.language.plurals import counted, plural


def size(n: float) -> str:
    """``2.00 MiB``, ``512 B`` (dask's); a negative size keeps its sign."""
    n = int(n)
    return "-" + format_bytes(-n) if n < 0 else format_bytes(n)


def signed_size(n: float | None) -> str:
    """``+16.00 MiB``, ``-7.63 MiB``; ``-`` for None."""
    if n is None:
        return "-"
    return ("-" if n < 0 else "+") + format_bytes(int(abs(n)))


def bytes_per_second(n: float) -> str:
    """``40.00 MiB/s``."""
    return f"{size(n)}/s"


def duration(seconds: float | None) -> str:
    """``450 ms``, ``2.5 s``, ``95 s``, ``20m 34s``, ``3hr 25m``; ``unknown`` for None,
    ``forever`` for infinity (see the module docstring)."""
    if seconds is None:
        return "unknown"
    if seconds == float("inf"):
        return "forever"
    if seconds < 0:
        return "-" + duration(-seconds)
    if seconds > TEN_MINUTES:
        return format_time(seconds)
    if seconds >= 0.9995:
        return f"{_figure(seconds)} s"
    return f"{_figure(seconds * 1000)} ms"


#: From here up, dask's words (``format_time`` changes its form there too).
TEN_MINUTES = 600.0


def _figure(x: float) -> str:
    """Whole from ten, one decimal below (``0`` for zero)."""
    if x == 0:
        return "0"
    return f"{x:.0f}" if x >= 9.95 else f"{x:.1f}"


def ago(seconds: float) -> str:
    """``3.0 s ago``, ``20m 34s ago``; ``just now`` under a second (a negative age,
    from clocks apart, too)."""
    return f"{duration(seconds)} ago" if seconds >= 1 else "just now"


def local_time(stamp: float | None) -> str:
    """A wall-clock time as a local date: ``2026-11-30 14:02:11 +0100``; ``-`` for None."""
    if stamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(stamp))


def columns(
    rows: Sequence[Sequence[str]], right: Container[int] = (), ruled: bool = False
) -> list[str]:
    """Rows of cells as lines of a plain-text table, each column as wide as its widest
    cell and two spaces from the next: the columns numbered in ``right`` (figures) aligned
    right, the others left; ``ruled``, a line of dashes under the first row (the header)."""
    widths = [max(map(len, column)) for column in zip(*rows, strict=True)]
    lines = [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    if ruled:
        lines.insert(1, "  ".join("-" * width for width in widths))
    return lines


# ---------------------------------------------------------------------------------
# The sentences of a drain's pure half
# ---------------------------------------------------------------------------------


def drain_item_why(item: DrainItem) -> str:
    """Why a key stands where it does in a drain's order, in a few words."""
    tier = item.tier
    if tier == BELOW_MIN:
        where = "no copy stays" if item.lost_outright else f"{item.staying} stay"
        return f"below its minimum: replicate min {item.minimum} ({item.rule}), {where}"
    if tier == RECOMPUTE:
        return f"recompute ≈ {duration(item.seconds)}, {item.worth:.3g} s per byte"
    if not item.lost_outright:
        return "a copy stays elsewhere"
    return "no recompute estimate"


def prediction_sentence(p: Prediction) -> str:
    """``at 40.00 MiB/s (heartbeats), 1.20 GiB of 3.00 GiB will leave in time; ≈ 14m 0s
    of recompute will be lost: 310 keys (x 12m 0s, y 2m 0s)``."""
    speed = f"{bytes_per_second(p.rate)} ({p.rate_source})"
    lost_seconds = p.lost_seconds + p.cannot_move_seconds
    lost_keys = p.lost_keys + p.cannot_move
    if not lost_keys:
        if not p.total_bytes:
            return "every key is safe: nothing left to move"
        return (
            f"at {speed}, all {size(p.total_bytes)} will leave in time "
            f"(≈ {duration(p.seconds_needed)} of {duration(p.seconds_left)} left)"
        )
    out = f"at {speed}, {size(p.in_time_bytes)} of {size(p.total_bytes)} will leave in time; "
    if lost_seconds > 0:
        out += f"≈ {duration(lost_seconds)} of recompute will be lost: "
    else:
        out += "lost: "
    out += counted(lost_keys, "key")
    named = [f"{g.group} {duration(g.seconds)}" for g in p.groups if g.seconds]
    if named:
        out += f" ({', '.join(named)})"
    extra = []
    if p.lost_unknown:
        extra.append(f"{p.lost_unknown:,} without an estimate")
    if p.below_min:
        extra.append(f"{p.below_min:,} left below their minimum")
    if p.cannot_move:
        extra.append(f"{p.cannot_move:,} that cannot move")
    if extra:
        out += "; " + ", ".join(extra)
    return out


def prediction_record(p: Prediction) -> dict[str, Any]:
    """The prediction as data (:meth:`~amm_rules.engine.decide.drain.Prediction.as_dict`)
    with its sentence (``text``)."""
    return {**p.as_dict(), "text": prediction_sentence(p)}


# ---------------------------------------------------------------------------------
# The sentences of adaptive scaling's pure half
# ---------------------------------------------------------------------------------


def _pools(names: tuple[str, ...]) -> str:
    return f"pool {names[0]}" if len(names) == 1 else f"pools {', '.join(names)}"


def kept_why(kept: adaptive.Kept) -> str:
    """``12 keys of rule precious would fall below min 2``."""
    keys = f"{counted(kept.keys, 'key')} of {kept.source}"
    if kept.kind == adaptive.MIN:
        return f"{keys} would fall below min {kept.bound}"
    if kept.kind == adaptive.POOL:
        return f"{keys} would have no worker in {_pools(kept.pools)}"
    if kept.kind == adaptive.SPREAD:
        hosts = "one host" if kept.bound == 1 else counted(kept.bound, "host")
        return f"{keys} (spread: host) would be left on {hosts}"
    if kept.kind == adaptive.NEVER:
        return f"{keys} (move: never) would have no copy left"
    return f"{keys} have no worker in {_pools(kept.pools)} to go to and no copy elsewhere"


def kept_sentence(worker: str, reasons: list[adaptive.Kept]) -> str:
    """``kept tcp://10.0.0.3:4567: 12 keys of rule precious would fall below min 2``."""
    return f"kept {worker}: {'; '.join(kept_why(r) for r in reasons)}"


def target_sentence(t: adaptive.MemoryTarget) -> str:
    """``memory asks for 4 workers: 2.40 GiB to hold (1.20 GiB expected from the tasks
    to run: load 1.10 GiB), 614.40 MiB each under the headroom; rising: the workers
    write to disk or read back 12.00 MiB/s``."""
    if not t.running:
        return "memory asks for nothing: no worker is running (its memory limit is unknown)"
    if not t.per_worker:
        return "memory asks for nothing: a worker has no memory limit"
    return f"memory asks for {counted(t.workers, 'worker')}: {target_details(t)}"


def target_details(t: adaptive.MemoryTarget, headroom: str = "") -> str:
    """What :func:`target_sentence` says after the workers asked for (``headroom``: how
    to name the headroom, e.g. ``60%``)."""
    out = f"{size(t.needed)} to hold"
    if t.expected:
        named = ", ".join(f"{p} {size(b)}" for p, _, b in t.top)
        out += f" ({size(t.expected)} expected from the tasks to run: {named})"
    out += f", {size(t.per_worker)} each under the headroom"
    if headroom:
        out += f" of {headroom}"
    whys = []
    if adaptive.DISK in t.rising and t.disk_rate is not None:
        whys.append(f"the workers write to disk or read back {bytes_per_second(t.disk_rate)}")
    if adaptive.HELD_BACK in t.rising:
        whys.append("producers are held back")
    if whys:
        out += f"; one more than running: {', '.join(whys)}"
    elif t.keeps_rise and t.disk_rate is not None:
        out += (
            "; the worker added while the workers spilled is kept: they write to disk or "
            f"read back {bytes_per_second(t.disk_rate)}"
        )
    return out


__all__ = [
    "ago",
    "bytes_per_second",
    "counted",
    "drain_item_why",
    "duration",
    "kept_sentence",
    "kept_why",
    "local_time",
    "plural",
    "prediction_record",
    "prediction_sentence",
    "signed_size",
    "size",
    "target_details",
    "target_sentence",
]
