"""A graph whose memory flow is known: ``n`` inputs of one prefix, each ``size`` bytes,
consumed by one task (``cons-NAME``), so that the consumer is the last to need each
input. Used by the memory-flow tests of the engine and of the observe parts."""

from __future__ import annotations

from typing import Any

from dask import delayed

SIZE = 100_000


def make(i: int, n: int = SIZE) -> bytes:
    return bytes([i % 256]) * n


def consume(*parts: bytes) -> int:
    return sum(len(p) for p in parts)


def graph(n: int, name: str = "inp", size: int = SIZE, consumer: str | None = None) -> Any:
    """The delayed consumer of ``n`` inputs with keys ``(name, i)``; its key is
    ``consumer`` (default ``cons-NAME``)."""
    parts = [delayed(make, pure=True)(i, size, dask_key_name=(name, i)) for i in range(n)]
    return delayed(consume, pure=True)(*parts, dask_key_name=consumer or f"cons-{name}")
