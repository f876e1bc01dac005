"""What a drain moves first, and what it will lose: the pure half of the ``drain``
section (:mod:`amm_rules.engine.sections.drain`).

A worker that must leave within a deadline (a spot instance's notice, a pod's
termination grace period) cannot always send everything it holds in time. Each key it
holds that needs a copy elsewhere is a :class:`DrainItem`, and :func:`rank` orders them
by value, in the three tiers of docs/drain.md ("The order of value"): below its
minimum (those that would be lost outright first), recompute seconds saved per byte
(dearest first), the rest (smallest first).

A key the draining worker holds on disk must be read back before it is sent: its
bytes count twice in its cost (:attr:`DrainItem.cost`, a byte read back taken to cost
what a byte sent does), so that of two keys alike, the one in memory goes first.

Ties keep the order the keys came in. :func:`predict` then walks the ranked items at
a transfer rate with the seconds left, and says which leave in time and what the others
would cost: bytes, keys, recompute seconds, keys that fall below their minimum.

Figures only: their sentences ("at 40.00 MiB/s, 1.20 GiB of 3.00 GiB will leave in
time; ≈ 14m 0s of recompute will be lost: ...") are made by
:mod:`amm_rules.engine.words`, which formats sizes and durations as dask does (this
module imports no dask). Nothing here reads the scheduler: the section builds the items from the engine's views
and the evacuation planner (:mod:`amm_rules.engine.decide.evacuate`), and the simulator
(``amm-rules simulate --drain``) from a recorded cluster.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import asdict, dataclass, field

#: The tiers of :func:`rank`, and what status and explain call them.
BELOW_MIN, RECOMPUTE, REST = 0, 1, 2
TIER_NAMES = {BELOW_MIN: "below its minimum", RECOMPUTE: "recompute per byte", REST: "the rest"}
#: Groups named in a prediction's sentence (the dearest lost).
NAMED_GROUPS = 3


@dataclass(frozen=True)
class DrainItem:
    """One key a draining worker holds that needs copies elsewhere."""

    key: Hashable
    #: One copy's size in bytes.
    nbytes: int
    #: Copies it needs on the workers that stay.
    copies: int = 1
    #: Its recompute estimate, seconds (None: unknown).
    seconds: float | None = None
    #: A replication target of its own, and its ``min`` in copies (0: none).
    minimum: int = 0
    #: Copies on workers that stay (where they count).
    staying: int = 0
    #: The label of the key's target, for reports (``rule-name``, ``(annotation)``).
    rule: str = ""
    #: The key's group, for reports (``x`` of ``x-1a2b``).
    group: str = ""
    #: Bytes the draining worker must read back from disk before it can send the key
    #: (0: in memory there; the spill section's reports tell).
    on_disk: int = 0

    @property
    def lost_outright(self) -> bool:
        """No copy stays: the key is lost if it does not leave in time."""
        return self.staying == 0

    @property
    def bytes_needed(self) -> int:
        return max(0, self.nbytes) * max(1, self.copies)

    @property
    def tier(self) -> int:
        if self.minimum and self.staying < self.minimum:
            return BELOW_MIN
        if self.seconds and self.seconds > 0 and self.lost_outright:
            return RECOMPUTE
        return REST

    @property
    def cost(self) -> int:
        """Bytes the drain spends on the key: those it sends, and those it reads back
        from disk first (a byte read back taken to cost what a byte sent does)."""
        return self.bytes_needed + max(0, self.on_disk)

    @property
    def worth(self) -> float:
        """Recompute seconds saved per byte spent (0 when unknown)."""
        if not self.seconds or not self.lost_outright:
            return 0.0
        return self.seconds / max(1, self.cost)


def _order(item: DrainItem) -> tuple[int, int, float, int]:
    # (A key of the recompute tier is lost outright; the rest go by size alone.)
    tier = item.tier
    worth = 0.0 if tier == REST else -item.worth
    return (tier, 0 if item.lost_outright else 1, worth, item.cost)


def rank(items: Iterable[DrainItem]) -> list[DrainItem]:
    """The items in the order a drain moves them (see the module docstring)."""
    return sorted(items, key=_order)  # (sorted is stable: ties keep their order)


@dataclass
class LostGroup:
    """What a prediction loses of one group."""

    group: str
    keys: int = 0
    bytes: int = 0
    seconds: float = 0.0


@dataclass
class Prediction:
    """What :func:`predict` expects of a drain at a rate with the seconds left."""

    #: Bytes per second assumed, and where the figure came from (``heartbeats``,
    #: ``copies landed``, ``assumed``, ``given``).
    rate: float
    rate_source: str
    seconds_left: float
    #: Bytes still to move (each copy needed), and what leaves in time of them.
    total_bytes: int = 0
    in_time_bytes: int = 0
    in_time_keys: int = 0
    #: What does not: keys, bytes, recompute seconds (of the keys with an estimate),
    #: keys without an estimate, keys left below their minimum.
    lost_keys: int = 0
    lost_bytes: int = 0
    lost_seconds: float = 0.0
    lost_unknown: int = 0
    below_min: int = 0
    #: Keys that cannot move at all (``move: never``, no eligible worker stays), with
    #: their bytes and recompute seconds: lost whatever the rate.
    cannot_move: int = 0
    cannot_move_bytes: int = 0
    cannot_move_seconds: float = 0.0
    #: The groups lost, dearest first (at most :data:`NAMED_GROUPS`).
    groups: list[LostGroup] = field(default_factory=list)
    #: The first key that will not leave in time (its place in the order), or None.
    cutoff: int | None = None

    @property
    def seconds_needed(self) -> float:
        return self.total_bytes / self.rate if self.rate > 0 else float("inf")

    def as_dict(self) -> dict[str, object]:
        """Its figures as plain data, rounded (without :attr:`cutoff`)."""
        out = asdict(self)
        del out["cutoff"]
        out["rate"] = round(self.rate, 1)
        for name in ("seconds_left", "lost_seconds", "cannot_move_seconds"):
            out[name] = round(out[name], 3)
        for group in out["groups"]:
            group["seconds"] = round(group["seconds"], 3)
        return out


def predict(
    ranked: Iterable[DrainItem],
    rate: float,
    seconds_left: float,
    rate_source: str = "given",
    cannot_move: Iterable[DrainItem] = (),
) -> Prediction:
    """What leaves in time at ``rate`` bytes per second with ``seconds_left``, in the
    order of ``ranked`` (see :func:`rank`); ``cannot_move``: keys lost whatever the rate."""
    out = Prediction(max(0.0, rate), rate_source, max(0.0, seconds_left))
    budget = out.rate * out.seconds_left
    groups: dict[str, LostGroup] = {}
    for place, item in enumerate(ranked):
        need = item.bytes_needed
        out.total_bytes += need
        if out.in_time_bytes + need <= budget and out.cutoff is None:
            out.in_time_bytes += need
            out.in_time_keys += 1
            continue
        if out.cutoff is None:
            out.cutoff = place
        out.lost_bytes += need
        if item.tier == BELOW_MIN:
            out.below_min += 1
        if not item.lost_outright:
            continue  # a copy stays: below its minimum, but not lost
        out.lost_keys += 1
        _lose(groups, item)
        if item.seconds:
            out.lost_seconds += item.seconds
        else:
            out.lost_unknown += 1
    for item in cannot_move:
        out.cannot_move += 1
        out.cannot_move_bytes += max(0, item.nbytes)
        out.cannot_move_seconds += item.seconds or 0.0
        _lose(groups, item)
    out.groups = sorted(groups.values(), key=lambda g: (-g.seconds, -g.bytes, g.group))[
        :NAMED_GROUPS
    ]
    return out


def _lose(groups: dict[str, LostGroup], item: DrainItem) -> None:
    entry = groups.get(item.group)
    if entry is None:
        entry = groups[item.group] = LostGroup(item.group)
    entry.keys += 1
    entry.bytes += max(0, item.nbytes)
    entry.seconds += item.seconds or 0.0


__all__ = [
    "BELOW_MIN",
    "RECOMPUTE",
    "REST",
    "TIER_NAMES",
    "DrainItem",
    "LostGroup",
    "Prediction",
    "predict",
    "rank",
]
