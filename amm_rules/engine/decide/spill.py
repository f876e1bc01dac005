"""The value of keeping a key in a worker's memory, per byte (pure).

What giving a key up costs, in seconds, on worker W (docs/spill.md, "The model"):

- writing it to disk: ``OVERHEAD + nbytes * write`` (``write``: seconds per byte
  measured on W), unless another worker holds a copy and ``drop-copies`` is on: then
  the engine drops it rather than write it (nothing to write);
- each later read of it: ``OVERHEAD + nbytes * read`` (reading back from disk, or
  fetching it from a worker holding it: taken as equal). The reads counted here are
  the key's dependents that have not run, except those already on W (the worker counts
  its own and adds them itself, as they come and go), shared among the workers
  holding a copy (each dependent reads one copy), plus the reads the ``demand``
  tracker saw of it within its hold. A dependent running on another worker that holds a
  copy reads that copy, not W's: it is no read of W's copy, but once it is done W's copy
  is released (*releasing*, when no client holds the key and no other dependent waits).
  Writing such a copy frees W's memory only until it would have been freed anyway, and
  the memory its release would have freed must then be made by writing another key: it
  is valued as one read more (kept as a key about to be read is), unless
  ``drop-copies`` lets the engine drop it;

and a rule's ``spill`` decides over all of that: ``last`` is an infinite value (kept
while anything else can go), ``first`` is 0 (given up first). The value per byte is the
cost divided by ``nbytes``: a small key costs its :data:`OVERHEAD` for few bytes, so
small keys stay in memory before large ones of the same reads. It is sent in *writes*:
divided by the seconds per byte of a write on that worker, so that the worker, which
counts its own readers with the rates it measures, and a key no value was sent for (1:
written once, never read again) stand on the same scale.

Neighbours: :mod:`amm_rules.engine.sections.spill` computes the inputs and sends the
values; :mod:`amm_rules.engine.spill.order` orders by them on the worker.
"""

from __future__ import annotations

import math

#: Seconds of one write or read of a file, whatever its size (open, metadata): an
#: approximation, not measured per worker.
OVERHEAD = 1e-3
#: Values per byte are sent only when they move by more than this ratio (a band of the
#: worker's order is 2 ** 0.25 wide).
RESEND_RATIO = 1.15


def value_per_byte(
    nbytes: int,
    reads: float,
    copies: int,
    *,
    write: float,
    read: float,
    drop_copies: bool,
    spill: str | None = None,
    releasing: bool = False,
) -> float:
    """Seconds saved per byte by keeping the key in memory, in seconds per byte of a
    write on the worker (see the module docstring):
    ``reads`` later reads of it elsewhere than the worker's own tasks, ``copies`` the
    workers holding it, ``write`` and ``read`` seconds per byte on the worker;
    ``releasing``: the copy is released once dependents elsewhere finish."""
    ruled = rule_value(spill)
    if ruled is not None:
        return ruled
    size = max(1, nbytes)
    cost = (reads / max(1, copies)) * (OVERHEAD + size * read)
    if copies <= 1 or not drop_copies:
        cost += OVERHEAD + size * write
        if releasing:
            cost += OVERHEAD + size * read
    return cost / size / max(write, 1e-15)


def rule_value(spill: str | None) -> float | None:
    """A rule's ``spill`` as a value per byte: ``last`` infinite, ``first`` zero; None
    for no rule (the value is the model's)."""
    if spill == "last":
        return math.inf
    if spill == "first":
        return 0.0
    return None


def changed(old: float | None, new: float) -> bool:
    """Whether ``new`` is worth sending over ``old`` (see :data:`RESEND_RATIO`)."""
    if old is None:
        return True
    if old == new:
        return False
    if old <= 0.0 or new <= 0.0 or math.isinf(old) or math.isinf(new):
        return True
    return max(old, new) / min(old, new) > RESEND_RATIO
