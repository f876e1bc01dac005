"""Durations and sizes in the units a person reads, for the engine's sentences."""

from __future__ import annotations


def format_seconds(seconds: float | None) -> str:
    """``41 min``, ``3.2 h``, ``12 s``, ``2.5 s``, ``450 ms``."""
    if seconds is None:
        return "unknown"
    if seconds == float("inf"):
        return "forever"
    if seconds >= 5400:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 90:
        return f"{seconds / 60:.0f} min"
    if seconds >= 10:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    return f"{seconds * 1000:.0f} ms"


def format_size(n: float) -> str:
    """``1.2 GiB``, ``40 MiB``, ``512 B``."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024:
            if unit == "B":
                return f"{n:.0f} B"
            return f"{n:.1f} {unit}" if abs(n) < 10 else f"{n:.0f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB" if abs(n) < 10 else f"{n:.0f} TiB"


__all__ = ["format_seconds", "format_size"]
