"""Claims: keys a part of the engine holds, which the others leave alone.

Sections never look each other up; one that needs the others to keep off a key for a
while holds it here, saying who holds it, why and what the hold covers (the model: the
reservations of Kubernetes' scheduling framework, typed state plugins share):

- ``alone``: the key is the holder's, the others neither copy nor drop it: a
  ``replicate``/``scatter`` call copying it, a drain's key waiting for its turn;
- ``keeps=EVERY``: the others may copy it, never drop a copy: a move in flight;
- ``keeps=n``: the others never drop the key's last ``n`` copies: ``protect:``.

Explain says who holds a key and why (:meth:`Claims.explain`: "held by the drain of
tcp://...:4567 until 12:01:07: copied in its turn"). The replication and reduce-replicas
sections, the audit and the planner's view
(:meth:`~amm_rules.engine.context.EngineContext.key_view`) honour them.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterable, Mapping
from typing import NamedTuple

#: :attr:`Claim.keeps` of a claim that keeps every copy of the key.
EVERY = -1


class Claim(NamedTuple):
    """One holder's hold on one key (see the module docstring)."""

    owner: str
    why: str
    alone: bool = True
    keeps: int = EVERY
    #: ``time.monotonic()`` when the hold ends by itself (None: when released).
    until: float | None = None

    def sentence(self, now: float | None = None) -> str:
        """``held by OWNER[ until HH:MM:SS]: WHY``."""
        when = ""
        if self.until is not None:
            wall = time.time() + self.until - (time.monotonic() if now is None else now)
            when = f" until {time.strftime('%H:%M:%S', time.localtime(wall))}"
        return f"held by {self.owner}{when}: {self.why}"


_NONE: Mapping[str, Claim] = {}


class Claims:
    """The keys held, by key and by owner."""

    def __init__(self) -> None:
        #: key -> {owner: claim}: the hot loops test membership here first.
        self.held: dict[Hashable, dict[str, Claim]] = {}
        self._owned: dict[str, dict[Hashable, Claim]] = {}
        #: (key, owner) of the holds that end by themselves -> until.
        self._timed: dict[tuple[Hashable, str], float] = {}

    def __repr__(self) -> str:
        return f"<Claims {len(self.held)} keys held by {len(self._owned)} owners>"

    def __len__(self) -> int:
        return len(self.held)

    def hold(
        self,
        key: Hashable,
        owner: str,
        why: str,
        *,
        alone: bool = True,
        keeps: int = EVERY,
        until: float | None = None,
    ) -> None:
        """``owner`` holds ``key`` (its earlier hold of it replaced)."""
        claim = Claim(owner, why, alone, keeps, until)
        self.held.setdefault(key, {})[owner] = claim
        self._owned.setdefault(owner, {})[key] = claim
        if until is not None:
            self._timed[key, owner] = until
        elif self._timed:
            self._timed.pop((key, owner), None)

    def release(self, owner: str, keys: Iterable[Hashable] | None = None) -> None:
        """``owner`` lets go of ``keys`` (None: of every key it holds)."""
        owned = self._owned.get(owner, {})
        for key in list(owned) if keys is None else keys:
            claim = owned.pop(key, None)
            if claim is None:
                continue
            if claim.until is not None:
                self._timed.pop((key, owner), None)
            claims = self.held[key]
            del claims[owner]
            if not claims:
                del self.held[key]
        if not owned:
            self._owned.pop(owner, None)

    def expire(self, now: float) -> None:
        """The holds whose ``until`` passed end (once per cycle)."""
        for key, owner in [pair for pair, until in self._timed.items() if until <= now]:
            self.release(owner, (key,))

    def holder(self, key: Hashable) -> Claim | None:
        """The first hold on ``key`` (None: nobody holds it)."""
        return next(iter(self.held.get(key, _NONE).values()), None)

    def of(self, owner: str) -> Mapping[Hashable, Claim]:
        """What ``owner`` holds: key -> claim."""
        return self._owned.get(owner, {})

    def alone(self, key: Hashable) -> Claim | None:
        """A hold that leaves ``key`` alone (None: others may copy and drop it)."""
        return next((c for c in self.held.get(key, _NONE).values() if c.alone), None)

    def keeping(self, key: Hashable) -> Claim | None:
        """A hold that keeps every copy of ``key`` (None: some may be dropped)."""
        claims = self.held.get(key, _NONE).values()
        return next((c for c in claims if c.alone or c.keeps == EVERY), None)

    def keeps(self, key: Hashable) -> int:
        """The most copies of ``key`` a hold keeping a number of them keeps (0: none)."""
        return max((c.keeps for c in self.held.get(key, _NONE).values() if c.keeps > 0), default=0)

    def explain(self, key: Hashable, now: float | None = None) -> list[str]:
        """Who holds ``key`` and why, a sentence each (empty: nobody)."""
        return [claim.sentence(now) for claim in self.held.get(key, _NONE).values()]


__all__ = ["EVERY", "Claim", "Claims"]
