"""Workers whose pool expressions may read something new: resources declared at run time
and memory reported by heartbeats.

A pool's membership is recomputed when workers join or leave and when a worker's status
changes (:mod:`amm_rules.engine.state.placement`), but two things a pool expression reads
change without either:

- ``worker.resources.NAME``: a worker's resources are replaced at run time
  (``Worker.set_resources``, and a heartbeat that carries them), through the
  scheduler's ``add_resources``;
- ``worker.memory`` and ``worker.memory_fraction``: they move with every heartbeat
  (process memory) and every key a worker gains or loses (managed memory).

:func:`watch_workers` wraps the scheduler's ``add_resources`` and ``heartbeat_worker``
(the methods and their comm handlers, ``set_resources`` and ``heartbeat_worker``) and
calls ``on_change(address, what)`` after a worker's resources changed (``what`` is
``"resources"``) or after any heartbeat (``"memory"``). The policy then evaluates that
worker's pools again and, if its membership changed, has the pools recomputed and may
ask for an early cycle (:meth:`amm_rules.engine.policy.RulesPolicy.worker_changed`).

The other worker attributes (address, name, host, memory limit, threads) are fixed for
a worker's lifetime: a worker that comes back with new ones is a worker that left and
joined. A pause moves no worker out of a pool (pools do not read status) and leaves its
copies counted, so it wakes nothing (see :mod:`amm_rules.engine.state.index`).

Neighbours: :mod:`amm_rules.engine.state.index` wraps the replica methods the same way;
:mod:`amm_rules.engine.state.placement` owns the membership this compares with.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from amm_rules.engine.wrapping import wrap_methods

#: Scheduler method -> the comm handler bound to it when the scheduler was built.
_WATCHED = {"add_resources": "set_resources", "heartbeat_worker": "heartbeat_worker"}
#: A worker's keys looked at, at most, for a governed one (see :func:`holds_governed`).
HELD_LOOKUP_LIMIT = 100_000


def watch_workers(scheduler: Any, on_change: Callable[[str, str], None]) -> Callable[[], None]:
    """Wrap ``add_resources`` and ``heartbeat_worker`` (see the module docstring).
    Returns the function that undoes it; until then ``on_change`` is called after the
    scheduler's own method returned, and an exception in it is the caller's to contain."""
    add_resources = scheduler.add_resources
    heartbeat_worker = scheduler.heartbeat_worker
    workers = scheduler.workers

    def add_resources_watched(worker: str, resources: dict | None = None) -> Any:
        ws = workers.get(worker)
        held = dict(ws.resources) if ws is not None else None
        result = add_resources(worker=worker, resources=resources)
        if ws is not None and ws.resources != held:
            on_change(worker, "resources")
        return result

    def heartbeat_worker_watched(**kwargs: Any) -> Any:
        result = heartbeat_worker(**kwargs)
        address = kwargs.get("address", "")
        if address in workers:  # the canonical address a worker reports (else ignored)
            on_change(address, "memory")
        return result

    wrappers: dict[str, Callable[..., Any]] = {
        "add_resources": add_resources_watched,
        "heartbeat_worker": heartbeat_worker_watched,
    }
    return wrap_methods(scheduler, wrappers, _WATCHED)


def holds_governed(ws: Any, desired: Mapping[Hashable, Any]) -> bool:
    """True if the worker holds a governed key. Stops at the first one; a worker with
    more keys than :data:`HELD_LOOKUP_LIMIT` and none governed among the first of them
    is taken to hold one (the cost stays bounded, and an early cycle too many is safe)."""
    for n, ts in enumerate(ws.has_what):
        if ts.key in desired:
            return True
        if n >= HELD_LOOKUP_LIMIT:
            return True
    return False
