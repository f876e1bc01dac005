"""Workers on their way out, and why.

A worker's copies are about to vanish when it retires (the scheduler says so by its
status), when a drain empties it before a deadline, or when the paused-workers section
empties it to restart it: placements for other keys pass it over, and an evacuation
counts none of its copies. The sections that send a worker away say so here
(:meth:`Leaving.leave`); :meth:`~amm_rules.engine.context.EngineContext.leaving` adds the
workers the scheduler retires. A departure may say that the worker keeps its copies
until it goes (a drained one: nothing is lost if it outlives its deadline) and who paces
the retirement of its keys (:class:`Pacer`: a drain), which the retirement section
follows while it places retirements by the rules (:attr:`Leaving.paced`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    from amm_rules.engine.decide.evacuate import Copy, Evacuation
    from amm_rules.engine.decide.view import ClusterView, KeyView


class Pacer(Protocol):
    """What paces the retirement of one worker (a drain)."""

    def rank(self, ws: Any, views: list[KeyView], cluster: ClusterView) -> list[KeyView]:
        """The worker's key views in the order their copies should be made."""

    def admit(self, ws: Any, plan: Evacuation, now: float) -> Evacuation:
        """The part of ``plan`` to enact now."""

    def asked(self, ws: Any, copy: Copy, now: float) -> None:
        """The AMM accepted ``copy``."""

    def placed(self, address: str) -> None:
        """Every key of ``address`` is held where its rules want it on the workers that
        stay (the retirement's ``done()``)."""


class Departure(NamedTuple):
    """Why one worker is on its way out: who sends it (``retirement``, ``drain``,
    ``paused-workers``), in a few words, whether its copies stay until it goes, and who
    paces the retirement of its keys."""

    by: str
    why: str
    keeps_copies: bool = False
    pacer: Pacer | None = None


#: The departure of a worker the scheduler retires.
RETIRING = Departure("retirement", "retiring")


def retirement_owner(address: str) -> str:
    """Who asks for the copies the retirement of ``address`` makes (in the ledger)."""
    return f"retirement of {address}"


class Leaving:
    """The workers the sections send away: address -> :class:`Departure`."""

    def __init__(self) -> None:
        self.workers: dict[str, Departure] = {}
        #: Retirements are placed by the rules, following the departures' pacers (set
        #: by the retirement section while it is attached).
        self.paced = False

    def leave(self, address: str, departure: Departure) -> None:
        self.workers[address] = departure

    def stay(self, address: str, by: str) -> None:
        """``by`` no longer sends ``address`` away."""
        known = self.workers.get(address)
        if known is not None and known.by == by:
            del self.workers[address]


__all__ = ["RETIRING", "Departure", "Leaving", "Pacer", "retirement_owner"]
