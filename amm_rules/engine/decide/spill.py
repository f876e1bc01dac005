"""The value of keeping a key in a worker's memory, per byte (pure).

The model is docs/spill.md's ("The model"): what giving the key up costs on worker W,
in seconds (its write, unless ``drop-copies`` lets the engine drop a copy another worker
holds; each later read of it elsewhere than W's own tasks, shared among the copies; one
read more for a copy about to be released), divided by ``nbytes``, in writes of W (so
that the worker's own count of its readers stands on the same scale); a rule's ``spill``
overrides it (``last``: infinite, ``first``: 0). A key no value was sent for is worth 1
(written once, never read again).

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
