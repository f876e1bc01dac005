"""Runtime targets and introspection from a client: :func:`replicate`,
:func:`explain`, :func:`status`.

These are thin wrappers over scheduler handlers that :class:`amm_rules.RulesPolicy`
registers when it is attached to a scheduler's Active Memory Manager
(``amm_rules_set_target``, ``amm_rules_explain``, ``amm_rules_status``); the policy
owns the targets, this module only checks arguments on the client and calls it.

Like ``client.amm`` in distributed, every function is synchronous with a
synchronous client and returns an awaitable with an asynchronous one.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import dask
from distributed import Client, Future, get_client

# _wait is what Client.replicate uses to let futures finish from inside a coroutine,
# for synchronous and asynchronous clients alike; the public wait() cannot do that.
from distributed.client import _wait, futures_of

from amm_rules.actions import parse_target
from amm_rules.annotations import plain_target

__all__ = ["EngineNotFoundError", "explain", "replicate", "status"]

#: The scheduler handlers the helpers call; registered by RulesPolicy at attach.
HANDLERS = ("amm_rules_set_target", "amm_rules_explain", "amm_rules_status")


class EngineNotFoundError(RuntimeError):
    """The scheduler runs no :class:`amm_rules.RulesPolicy`."""


def replicate(
    futures_or_collection: Any,
    n: int | Mapping[str, int] | None = 4,
    client: Client | None = None,
) -> Any:
    """Hold ``n`` copies of data already in memory, until the keys are released.

    ``futures_or_collection`` is a Future, a list, set, tuple or dict of futures, or a
    persisted dask collection. ``n`` is a number of copies or ``{"min": a, "max": b}``
    (add copies below ``min``, trim above ``max``); ``None`` removes the target, so
    the rules decide again. A runtime target overrides the ``replicate`` field of the
    rules and of ``amm`` annotations; pools, ``avoid`` and ``spread`` still apply.

    ``n`` is checked here, before anything is sent. The call waits for the futures
    to finish, then returns the scheduler's answer ``{"set": <keys given the target>,
    "missing": [<keys not in memory>]}`` (an awaitable of it with an asynchronous
    client). The copies themselves are made by the Active Memory Manager in its next
    cycles, not by this call.
    """
    target = None if n is None else plain_target(parse_target(n, "n"))
    futures = _futures(futures_or_collection)
    client = _client(futures, client)
    return client.sync(_set_target, client, futures, target)


def explain(futures_or_collection: Any, client: Client | None = None) -> Any:
    """Why are these keys where they are?

    Returns the scheduler's answer for each key, by ``str(key)``: the workers holding
    it, what the rules, annotations and runtime targets want for it (each field with
    the rule or source that decided it), how many workers are eligible, copies in
    flight, and why a target is not met. Does not wait for the futures.
    """
    futures = _futures(futures_or_collection)
    client = _client(futures, client)
    return client.sync(_explain, client, [f.key for f in futures])


def status(client: Client | None = None) -> Any:
    """The rules engine's state: the rules' source, counters per rule (keys governed,
    copies requested and dropped, targets unmet) and recent reload errors."""
    client = client or get_client()
    return client.sync(_status, client)


# ----------------------------------------------------------------------------------
# Client side: arguments


def _futures(obj: Any) -> list[Future]:
    futures = futures_of(obj)
    if not futures and dask.is_dask_collection(obj):
        # A collection that was never persisted has tasks, not futures: there is no
        # data in memory to hold a target on.
        raise ValueError(
            "the collection holds no futures; persist it first "
            "(x = client.persist(x)) and pass the persisted collection"
        )
    return futures


def _client(futures: list[Future], client: Client | None) -> Client:
    if client is not None:
        return client
    for future in futures:
        if future.client is not None:
            return future.client
    return get_client()


# ----------------------------------------------------------------------------------
# Coroutines run by client.sync (on the client's event loop)


#: Clients known to talk to a scheduler with the handlers, with that scheduler's address.
_confirmed: weakref.WeakKeyDictionary[Client, str] = weakref.WeakKeyDictionary()


async def _require_engine(client: Client) -> None:
    # A scheduler without the handler does not answer an unknown operation: it logs
    # a warning and the caller would wait forever. Ask first, and say why. Handlers
    # are never unregistered, so a positive answer holds for that scheduler.
    address = client.scheduler.address
    if _confirmed.get(client) == address:
        return
    try:
        found = await client.run_on_scheduler(_engine_attached, asynchronous=True)
    except Exception:
        # run_function may be disabled on this scheduler; try the call anyway.
        return
    if found:
        _confirmed[client] = address
    else:
        raise EngineNotFoundError(
            "the scheduler runs no amm-rules engine: add "
            "{'class': 'amm_rules.RulesPolicy', 'rules': ...} to the dask config "
            "distributed.scheduler.active-memory-manager.policies of the scheduler"
        )


def _engine_attached(dask_scheduler: Any) -> bool:
    """Runs in the scheduler: are the amm-rules handlers registered?"""
    return all(name in dask_scheduler.handlers for name in HANDLERS)


async def _set_target(
    client: Client, futures: list[Future], target: int | dict[str, int] | None
) -> Any:
    if futures:
        # Like Client.replicate: the target is for data in memory, so let the data land.
        await _wait(futures)
    await _require_engine(client)
    keys = list(dict.fromkeys(f.key for f in futures))
    answer = await client.scheduler.amm_rules_set_target(keys=keys, target=target)
    # Lists come back as tuples over TCP (msgpack) but as lists in-process: pick one.
    return {**answer, "missing": list(answer.get("missing", ()))}


async def _explain(client: Client, keys: list[Any]) -> Any:
    await _require_engine(client)
    return await client.scheduler.amm_rules_explain(keys=list(dict.fromkeys(keys)))


async def _status(client: Client) -> Any:
    await _require_engine(client)
    return await client.scheduler.amm_rules_status()
