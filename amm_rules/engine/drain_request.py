"""A drain's request and its report: what the scheduler, the client, the command line and
the worker preload share.

- **The request**: the workers, by address or name (:func:`named_workers` on the
  caller's side, :func:`resolve_workers` on the scheduler's), and the deadline
  (:func:`deadline_seconds`: a duration or seconds, more than 0 and at most
  :data:`MAX_DEADLINE`), checked with the same sentence wherever they are given.
- **The report**: :class:`DrainReport`, one record per drained worker, built by the
  scheduler's drain section (:mod:`amm_rules.engine.sections.drain`) and sent as plain
  data (:meth:`DrainReport.to_dict`). One count of the drain's keys: each is safe (held
  where its rules want it on workers that stay), left (still to move, or lost once the
  worker went) or unable to move (``cannot_stay``); ``moved_keys`` are the safe keys the
  drain copied; the outcome's ``unsafe_keys`` are those left and unable to move, and its
  ``below_min`` those held below their minimum. ``seconds_left`` and ``elapsed`` stop
  when the drain ends; ``state`` is ``draining``, then ``safe`` or ``expired``, then
  ``closed`` once the worker went after its drain, or ``left`` if it went before.
  Its sentences (:meth:`~DrainReport.headline`, :meth:`~DrainReport.notice`,
  :meth:`~DrainReport.progress`) are the ones status, the command line and the worker
  preload print.
- **Following it**: :func:`follow` asks for the reports until every drain is over
  (:func:`drain_over`), for :func:`amm_rules.drain`, ``amm-rules drain`` and the worker
  preload alike.

Imports neither distributed nor the engine's sections (the command line reads it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from amm_rules.engine.words import counted, duration, size
from amm_rules.language.fields import UnitError, parse_duration

#: The longest deadline a drain accepts.
MAX_DEADLINE = 86_400.0
#: The states of a drain (see the module docstring).
DRAINING, SAFE, EXPIRED, CLOSED, LEFT = "draining", "safe", "expired", "closed", "left"
#: Seconds :func:`follow` waits past the deadline for the drains to end (and close).
GRACE = 30.0


def deadline_seconds(value: Any, where: str = "deadline") -> float:
    """A drain's deadline in seconds: a duration (``"60s"``, ``"2 min"``) or a number,
    more than 0 and at most :data:`MAX_DEADLINE`; ``ValueError`` saying ``where``."""
    try:
        seconds = parse_duration(value)
    except UnitError as exc:
        raise ValueError(f"{where}: {exc}") from None
    if not 0 < seconds <= MAX_DEADLINE:
        raise ValueError(f"{where}: expected more than 0 s and at most 1 day, got {value!r}")
    return seconds


def named_workers(workers: Any) -> list[str]:
    """The workers a caller names: one (an address, a name) or several, as strings;
    ``ValueError`` for none."""
    names = [workers] if isinstance(workers, (str, int)) else list(workers)
    if not names:
        raise ValueError("workers: name at least one worker to drain")
    return [str(w) for w in names]


def resolve_workers(known: Mapping[str, Any], workers: Any) -> list[str]:
    """The addresses of ``workers`` (addresses or names) among ``known`` (the scheduler's
    workers); ``ValueError`` naming those that are neither."""
    if isinstance(workers, (str, bytes)) or not isinstance(workers, (list, tuple, set)):
        raise ValueError(f"workers: expected a list of workers, got {type(workers).__name__}")
    if not workers:
        raise ValueError("workers: name at least one worker to drain")
    by_name = {str(ws.name): a for a, ws in known.items()}
    out: list[str] = []
    unknown = []
    for w in workers:
        address = w if w in known else by_name.get(str(w))
        if address is None:
            unknown.append(str(w))
        elif address not in out:
            out.append(address)
    if unknown:
        raise ValueError(
            f"no worker of this scheduler has the address or name {', '.join(unknown)}"
        )
    return out


@dataclass
class DrainReport:
    """One worker's drain, as the scheduler reports it (see the module docstring)."""

    worker: str = ""
    name: str = ""
    #: Workers drained together share an id (``drain-<n>``).
    drain: str = ""
    state: str = DRAINING
    #: Whether the drain was asked to close the worker (``--close``). The worker
    #: preload closes its worker itself once the drain ended (its drains end
    #: ``closed`` too).
    close: bool = False
    #: Wall-clock time of the notice.
    started: float = 0.0
    #: Seconds from the notice to now, or to the end of the drain.
    elapsed: float = 0.0
    #: Seconds left before the deadline, now or when the drain ended (never below 0).
    seconds_left: float = 0.0
    #: The deadline, in seconds from the notice.
    deadline: float = 0.0
    moved_keys: int = 0
    moved_bytes: int = 0
    #: Copies asked for (a key may need more than one).
    copies: int = 0
    in_flight_bytes: int = 0
    keys_left: int = 0
    bytes_left: int = 0
    safe_keys: int = 0
    #: ``{"bytes_per_second", "source"}``: the transfer rate and where it came from.
    rate: dict[str, Any] = field(default_factory=dict)
    #: The latest prediction and the one made at the notice (their records, with text).
    prediction: dict[str, Any] | None = None
    first_prediction: dict[str, Any] | None = None
    #: What cannot stay where its rules want it, by reason.
    cannot_stay: list[dict[str, Any]] = field(default_factory=list)
    #: Seconds from the notice to each key's safety: ``{"keys", "median", "max"}``.
    time_to_safety: dict[str, Any] = field(default_factory=dict)
    #: What happened, once the drain ended: moved, copies, unsafe keys and their
    #: recompute seconds, keys below their minimum, and in words (``text``).
    outcome: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (what the handlers answer)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, line: Mapping[str, Any]) -> DrainReport:
        """A report read back from plain data (fields a scheduler did not send keep
        their defaults)."""
        return cls(**{f.name: line[f.name] for f in fields(cls) if f.name in line})

    @property
    def over(self) -> bool:
        """Whether the drain ended: its outcome is known and, with ``close``, the worker
        is gone."""
        if self.outcome is None:
            return False
        return not self.close or self.state in (CLOSED, LEFT)

    def headline(self) -> str:
        """``WORKER (NAME): 12 s left; 3 keys moved (2.00 MiB), 5 left`` (or the state
        and how long it took, once over)."""
        if self.outcome is None:
            when = f"{duration(self.seconds_left)} left"
        else:
            when = f"{self.state} after {duration(self.elapsed)}"
        return (
            f"{self.worker} ({self.name}): {when}; {counted(self.moved_keys, 'key')} moved "
            f"({size(self.moved_bytes)}), {self.keys_left:,} left"
        )

    def detail(self) -> str:
        """What happened, or the latest prediction."""
        if self.outcome is not None:
            return str(self.outcome.get("text", ""))
        return str((self.prediction or {}).get("text", ""))

    def notice(self) -> str:
        """What the drain says as it starts: within when, then what it predicts, and the
        keys that cannot move."""
        first = self.first_prediction or {}
        out = (
            f"{self.worker} ({self.name}): draining within {duration(self.deadline)}"
            f"{', then closing' if self.close else ''}: {first.get('text', '')}"
        )
        for entry in self.cannot_stay:
            shown = ", ".join(entry["shown"])
            more = entry["keys"] - len(entry["shown"])
            out += (
                f"\n  cannot move: {counted(entry['keys'], 'key')} ({entry['why']}): {shown}"
                + (f" and {more} more" if more > 0 else "")
            )
        return out

    def progress(self) -> str:
        """One line as the drain goes: the time left and the prediction, then what
        happened."""
        if self.outcome is not None:
            return f"{self.worker}: {self.state} after {duration(self.elapsed)}: {self.detail()}"
        return (
            f"{self.worker}: {duration(self.seconds_left)} left, "
            f"{counted(self.moved_keys, 'key')} moved: {self.detail()}"
        )

    def said(self) -> tuple[Any, ...]:
        """What a follower says a new line for when it changes: the state, the keys the
        prediction loses and where its rate came from."""
        prediction = self.prediction or {}
        return (self.state, prediction.get("lost_keys"), prediction.get("rate_source"))


def drain_over(line: Mapping[str, Any]) -> bool:
    """Whether the drain of a report's line ended (see :attr:`DrainReport.over`)."""
    return DrainReport.from_dict(line).over


async def follow(
    ask: Callable[..., Awaitable[Any]],
    started: Mapping[str, Mapping[str, Any]],
    seconds: float,
    poll: float,
    changed: Callable[[DrainReport], None] | None = None,
    grace: float = GRACE,
) -> dict[str, dict[str, Any]]:
    """Ask for the reports of the drains ``started`` (the answer of ``amm_rules_drain``)
    with ``ask(name, **kwargs)`` (the scheduler's handlers, refusals raised) every
    ``poll`` seconds, until every one is over or ``grace`` seconds past the deadline
    (``seconds`` from now); tell ``changed`` each report whose
    :meth:`~DrainReport.said` changed. Returns the last reports."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + seconds + grace
    said = {a: DrainReport.from_dict(line).said() for a, line in started.items()}
    report = {a: dict(line) for a, line in started.items()}
    while not all(drain_over(line) for line in report.values()) and loop.time() < give_up:
        await asyncio.sleep(poll)
        report = dict(await ask("amm_rules_drain_report", workers=list(started)))
        for address, line in report.items():
            record = DrainReport.from_dict(line)
            if changed is not None and said.get(address) != record.said():
                changed(record)
            said[address] = record.said()
    return report


__all__ = [
    "CLOSED",
    "DRAINING",
    "EXPIRED",
    "LEFT",
    "MAX_DEADLINE",
    "SAFE",
    "DrainReport",
    "deadline_seconds",
    "drain_over",
    "follow",
    "named_workers",
    "resolve_workers",
]
