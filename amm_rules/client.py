"""What a client calls: :func:`annotate`, :func:`persist`, :func:`replicate`,
:func:`explain`, :func:`status`, :func:`memory_flow`, :func:`drain`.

Arguments are checked here, on the client, by the functions the rules file and the
scheduler use (:func:`amm_rules.language.fields.parse_actions`), so that a field means
the same thing everywhere and the mistakes a client can find are raised before a graph
is built or a call is sent. The rest is the engine's: these are thin wrappers over the scheduler handlers
that :class:`amm_rules.RulesPolicy` registers when it attaches (``amm_rules_set_target``,
``amm_rules_explain``, ``amm_rules_status``, ``amm_rules_memory_flow``,
``amm_rules_drain``). Like ``client.amm`` in distributed, every function is synchronous
with a synchronous client and returns an awaitable with an asynchronous one.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Mapping
from functools import partial
from typing import Any, Literal, cast

import dask
from distributed import Client, Future, get_client

# _wait is what Client.replicate uses to let futures finish from inside a coroutine,
# for synchronous and asynchronous clients alike; the public wait() cannot do that.
from distributed.client import _wait, futures_of

from amm_rules.language.fields import ActionError, parse_actions, parse_target
from amm_rules.language.ruleset import ACTION_FIELDS, Actions, Desired, Target

__all__ = [
    "ActionError",
    "EngineNotFoundError",
    "annotate",
    "drain",
    "explain",
    "memory_flow",
    "persist",
    "plain_actions",
    "plain_target",
    "replicate",
    "status",
    "validate_annotation",
]

# --- annotations ----------------------------------------------------------------------

#: The annotation name the scheduler reads (``ts.annotations["amm"]``).
ANNOTATION = "amm"


def plain_target(target: Target) -> Any:
    """A :class:`Target` as the value a user would write: ``3``, ``"all"``,
    ``{"min": 2, "max": 5}`` or ``{"min": 2, "max": "all"}``."""
    if target.max == target.min:
        return target.min
    out: dict[str, Any] = {"min": target.min}
    if target.max is not None:
        out["max"] = target.max
    return out


def plain_actions(actions: Actions | Desired) -> dict[str, Any]:
    """Checked :class:`Actions` (or what a key wants) as plain, msgpack-friendly values.

    The result goes over the wire inside the task graph, so it uses only ints, strings,
    lists and dicts; :func:`parse_actions` turns it back into the same ``Actions``.
    """
    out: dict[str, Any] = {}
    for name in ACTION_FIELDS:
        value = getattr(actions, name)
        if value is None:
            continue
        if name == "replicate":
            value = plain_target(value)
        elif isinstance(value, tuple):
            # One pool is written as its name, several as a list, as in a rules file.
            value = value[0] if len(value) == 1 else list(value)
        out[name] = value
    return out


def validate_annotation(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Check an ``amm`` annotation the way the scheduler will, except for pool names.

    Returns the fields as plain values (``2.0`` becomes ``2``, a repeated pool name is
    kept once). Raises :class:`~amm_rules.language.fields.ActionError` (a ``ValueError``) naming
    the first invalid field.
    """
    try:
        actions = parse_actions(fields)
    except ActionError as err:
        # Re-raise with the context a user needs to find the call that failed.
        raise ActionError(err.field, f"{err.message} (in an amm annotation)") from None
    return plain_actions(actions)


def annotate(**fields: Any) -> AnnotateContext:
    """Annotate the tasks submitted inside the block with amm-rules action fields.

    ::

        with amm_rules.annotate(replicate=4, pool="gpu"):
            x = client.persist(x)

    The fields are checked now, on the client: ``amm_rules.annotate(replicate=0)``
    raises :class:`ValueError` before any graph is built. Pool *names* are only checked
    for their spelling here; whether a pool of that name exists is known only to the
    scheduler's rules, which ignore the annotation of a key naming an unknown pool and
    log a warning event under the topic ``amm-rules``.

    Inside the block, ``dask.annotate(amm={...})`` is in effect. Nested blocks combine
    field by field: the inner block's fields win, fields it does not set are kept from
    the outer ``amm`` annotation.

    Wrap the call that sends the graph to the scheduler (``client.persist``,
    ``client.compute``, ``client.submit``, ``dask.persist``): annotations set only
    around the construction of a collection may be dropped by graph optimization.
    """
    return AnnotateContext(validate_annotation(fields))


class AnnotateContext:
    """What :func:`annotate` returns: checked fields, entered later.

    A class rather than a generator-based context manager so that the fields are
    checked when ``annotate(...)`` is called, not when the ``with`` block is entered,
    and so that the outer annotation is read at entry, not at the call.
    """

    def __init__(self, fields: dict[str, Any]):
        #: The checked fields, as plain values.
        self.fields = fields
        self._stack: list[Any] = []

    def __repr__(self) -> str:
        return f"amm_rules.annotate({', '.join(f'{k}={v!r}' for k, v in self.fields.items())})"

    def __enter__(self) -> dict[str, Any]:
        outer = dask.get_annotations().get(ANNOTATION)
        merged = {**outer, **self.fields} if isinstance(outer, Mapping) else dict(self.fields)
        cm = dask.annotate(**{ANNOTATION: merged})
        cm.__enter__()
        self._stack.append(cm)
        return merged

    def __exit__(self, *exc_info: Any) -> None:
        self._stack.pop().__exit__(*exc_info)


# --- persist: targets on exactly the keys persisted -------------------------------------


def persist(
    collection: Any,
    *,
    replicate: int | str | Mapping[str, int | str] | None = None,
    pool: str | list[str] | None = None,
    avoid: str | list[str] | None = None,
    spread: str | None = None,
    move: str | None = None,
    client: Client | None = None,
    **persist_kwargs: Any,
) -> Any:
    """Persist ``collection`` and hold the given fields on exactly the keys persisted.

    ::

        df = amm_rules.persist(df, replicate=2, pool="gpu")

    The same fields as :func:`annotate` (checked now, on the client), set as a runtime
    target on the keys of the persisted collection, whatever their names: the output
    keys of the optimized graph, which for a dask DataFrame (query planning) or a fused
    graph are not the keys of the collection as written. Annotations set around the
    construction of such a collection are dropped by the planner; this is the form that
    cannot be. The target waits for keys still computing and holds from when each
    enters memory, until it is released (as :func:`replicate`'s). Fields other than
    ``replicate`` override the rules and the ``amm`` annotation as a runtime target
    overrides ``replicate``. The scheduler checks the fields with its pools before
    anything is persisted: an unknown pool raises :class:`ValueError` and persists
    nothing.

    ``persist_kwargs`` go to ``client.persist``. Returns the persisted collection (with
    an asynchronous client, an awaitable of it); a list or tuple of collections is
    persisted together and returned as a list.
    """
    given = {"replicate": replicate, "pool": pool, "avoid": avoid, "spread": spread, "move": move}
    fields = {name: value for name, value in given.items() if value is not None}
    if not fields:
        raise TypeError("amm_rules.persist needs a field: replicate, pool, avoid, spread or move")
    checked = validate_annotation(fields)
    target = checked.pop("replicate", None)
    others = checked or None
    client = client or get_client()
    if isinstance(collection, (list, tuple)):
        collection = list(collection)
    if client.asynchronous:
        return _persist_async(client, collection, target, others, persist_kwargs)
    client.sync(_set_pending, client, [], target, others)  # checked first: nothing persisted
    persisted = client.persist(collection, **persist_kwargs)
    keys = list(dict.fromkeys(f.key for f in futures_of(persisted)))
    client.sync(_set_pending, client, keys, target, others)
    return persisted


async def _persist_async(
    client: Client, collection: Any, target: Any, fields: Any, persist_kwargs: Any
) -> Any:
    await _set_pending(client, [], target, fields)  # checked first: nothing persisted
    persisted = client.persist(collection, **persist_kwargs)
    keys = list(dict.fromkeys(f.key for f in futures_of(persisted)))
    await _set_pending(client, keys, target, fields)
    return persisted


async def _set_pending(client: Client, keys: list[Any], target: Any, fields: Any) -> Any:
    """Set the target and fields on ``keys``, also on those still to compute; with no
    keys, only check them (the scheduler knows the pools): a ``ValueError`` if refused."""
    await _require_engine(client, "amm_rules_set_target")
    return _refused(
        await client.scheduler.amm_rules_set_target(
            keys=keys, target=target, fields=fields, pending=True
        )
    )


# --- runtime targets and introspection --------------------------------------------------


class EngineNotFoundError(RuntimeError):
    """The scheduler runs no :class:`amm_rules.RulesPolicy`."""


def replicate(
    futures_or_collection: Any,
    n: int | str | Mapping[str, int | str] | None = 4,
    client: Client | None = None,
) -> Any:
    """Hold ``n`` copies of data already in memory, until the keys are released.

    ``futures_or_collection`` is a Future, a persisted dask collection, a key (a
    string, or a tuple such as ``('x-1a2b', 0)``), or a list, set, tuple or dict of
    those; anything else raises :class:`TypeError`. ``n`` is a number of copies,
    ``"all"`` (one copy on every eligible worker, following workers as they join and
    leave) or ``{"min": a, "max": b}`` (add copies below ``min``, trim above ``max``;
    either may be ``"all"``); ``None`` removes the target, so the rules decide again. A
    runtime target overrides the ``replicate`` field of the rules and of ``amm``
    annotations; pools, ``avoid`` and ``spread`` still apply. It replaces a target set
    by an earlier call, including distributed's own ``client.replicate`` and
    ``scatter(broadcast=...)``, which set runtime targets too unless the rules say
    ``legacy-replicate: ignore``.

    ``n`` is checked here, before anything is sent. The call waits for the futures
    to finish, then returns the scheduler's answer ``{"set": <keys given the target>,
    "missing": [<keys not in memory>]}`` (an awaitable of it with an asynchronous
    client). The copies themselves are made by the Active Memory Manager in its next
    cycles, not by this call.
    """
    target = None if n is None else plain_target(parse_target(n, "n"))
    futures, keys = _futures_and_keys(futures_or_collection)
    client = _client(futures, client)
    return client.sync(_set_target, client, futures, keys, target)


def explain(futures_or_collection: Any, client: Client | None = None) -> Any:
    """Why are these keys where they are?

    ``futures_or_collection`` is what :func:`replicate` takes: futures, persisted
    collections, keys (strings or tuples), or containers of those.

    Returns the scheduler's answer for each key, by ``str(key)``: a one-line
    ``summary``, the key's ``facts``, the ``cascade`` of rules, a decision per worker
    (``decisions``: yes, no, throttled, holds, with the deciders), the engine's last
    decisions for it (``history``), and the earlier fields (holders, what the rules,
    annotations and runtime targets want with the source of each field, eligible
    workers, copies in flight, why a target is not met...). Does not wait for the
    futures. The scheduler explains at most 1,000 keys in one call (fewer at hundreds
    of workers, see docs/observe.md): for more, the first are explained and a
    :class:`UserWarning` says how many.
    """
    futures, keys = _futures_and_keys(futures_or_collection)
    client = _client(futures, client)
    return client.sync(_explain, client, [f.key for f in futures] + keys)


def memory_flow(client: Client | None = None) -> Any:
    """Memory flow per task prefix, as the engine saw it since it started:
    ``{prefix: {"produced", "freed", "freed_by", "live", "tasks", "net_per_task"}}``.

    ``produced``: bytes of results of the prefix's tasks (each task once); ``tasks``:
    how many finished; ``freed``: bytes of the prefix's keys that left memory (each key
    once, whatever its replicas); ``freed_by``: bytes of inputs released because a
    task of the prefix finished (it was the last to need them); ``live``: bytes of the
    prefix's keys in memory now; ``net_per_task``: ``(produced - freed_by) / tasks``
    (None before the first task finished). See docs/memory-flow.md.
    """
    client = client or get_client()
    return client.sync(_memory_flow, client)


def drain(
    workers: Any,
    deadline: str | float = "60s",
    close: bool = False,
    client: Client | None = None,
) -> Any:
    """Drain ``workers`` (addresses or names; one or a list) before ``deadline``: their
    keys are copied away in order of value (a rule's ``replicate`` minimum first, then
    recompute seconds saved per byte, then the rest), where their rules allow, and the
    engine predicts at once what cannot leave in time. The workers stop receiving
    tasks. With ``close``, each is retired (closed) once its keys are safe, or at the
    deadline, whichever comes first.

    Waits until every drain ended (its keys safe, the deadline, or its worker gone) and
    returns the scheduler's report per worker address: ``state`` (``safe``,
    ``expired``, ``closed``, ``left``), what moved, the ``first_prediction`` made at
    the notice beside the last ``prediction``, what could not stay where its rules want
    it (``cannot_stay``) and the ``outcome`` (see docs/drain.md). An awaitable of it
    with an asynchronous client. ``deadline`` is checked here: seconds, or a duration
    such as ``"60s"`` or ``"2 min"``.
    """
    from amm_rules.engine.drain_request import deadline_seconds, named_workers

    seconds = deadline_seconds(deadline)
    names = named_workers(workers)
    client = client or get_client()
    return client.sync(_drain, client, names, seconds, bool(close))


def status(client: Client | None = None) -> Any:
    """The rules engine's status report: per-rule conformance (``satisfied``,
    ``in-progress`` or ``unsatisfiable``, with a sentence, keys and bytes, targets met
    and unmet), the rules in force, counters per rule, cycle times, workers and memory
    by pool, recent events and decisions (see ``docs/observe.md``)."""
    client = client or get_client()
    return client.sync(_status, client)


# ----------------------------------------------------------------------------------
# Client side: arguments


#: How deep containers of futures and keys are looked into.
NESTING_LIMIT = 10


def is_key(obj: Any) -> bool:
    """A dask key as a user names one: a string, or a tuple that starts with a string
    and holds strings, numbers and such tuples (``('x-1a2b', 0)``)."""
    if isinstance(obj, str):
        return True
    if not isinstance(obj, tuple) or not obj or not isinstance(obj[0], str):
        return False
    return all(
        isinstance(x, (str, int, float)) and not isinstance(x, bool) or is_key(x) for x in obj
    )


def _futures_and_keys(obj: Any, depth: int = 0) -> tuple[list[Future], list[Any]]:
    """The futures and the plain keys ``obj`` names (see :func:`replicate`)."""
    if isinstance(obj, Future):
        return [obj], []
    if is_key(obj):
        return [], [obj]
    if dask.is_dask_collection(obj):
        persisted = futures_of(obj)
        if not persisted:
            # A collection that was never persisted has tasks, not futures: there is
            # no data in memory to hold a target on.
            raise ValueError(
                "the collection holds no futures; persist it first "
                "(x = client.persist(x)) and pass the persisted collection"
            )
        return persisted, []
    if isinstance(obj, Mapping):
        items: Any = obj.values()
    elif isinstance(obj, (list, tuple, set, frozenset)):
        items = obj
    else:
        items = None
    if items is None or depth >= NESTING_LIMIT:
        raise TypeError(
            "expected a Future, a persisted dask collection, a key (a string, or a tuple "
            "such as ('x-1a2b', 0)), or a list, set, tuple or dict of those; "
            f"got {type(obj).__name__}"
        )
    futures: list[Future] = []
    keys: list[Any] = []
    for item in items:
        f, k = _futures_and_keys(item, depth + 1)
        futures += f
        keys += k
    return futures, keys


def _refused(answer: Any) -> Any:
    """A handler's answer, or the ``ValueError`` of a refusal (the engine is imported
    when a call is made, not with this module)."""
    from amm_rules.engine.handlers import refused

    return refused(answer)


def _client(futures: list[Future], client: Client | None) -> Client:
    if client is not None:
        return client
    for future in futures:
        if future.client is not None:
            return future.client
    return get_client()


# ----------------------------------------------------------------------------------
# Coroutines run by client.sync (on the client's event loop)


async def _require_engine(client: Client, op: str) -> None:
    # Asked at every call (one round trip): a policy that detaches takes its handlers
    # with it, and a call to a handler that is gone is answered with None.
    found = await engine_found(client.scheduler, op)
    if found == "absent":
        raise EngineNotFoundError(
            "the scheduler runs no amm-rules engine: add "
            "{'class': 'amm_rules.RulesPolicy', 'rules': ...} to the dask config "
            "distributed.scheduler.active-memory-manager.policies of the scheduler"
        )
    elif found == "without-op":
        raise EngineNotFoundError(
            f"the scheduler's amm-rules engine has no {op!r} handler: upgrade amm-rules "
            "on the scheduler"
        )


Found = Literal["said", "found", "absent", "without-op", "unknown"]


async def engine_found(scheduler: Any, op: str, timeout: float | None = None) -> Found:
    """Whether the scheduler (``client.scheduler``, or an ``rpc`` to it) runs the engine
    with the handler ``op``. A scheduler does not answer an operation it has no handler
    for, so a caller asks first and says why rather than waiting forever.

    ``"said"``: its metadata says so (then every handler of this release is there: the
    entry came with them). Else (no engine, or one older than the entry) what
    :func:`engine_attached` answers when run there, or ``"unknown"`` when running
    functions is not allowed there: then call the handler anyway.
    """
    from distributed.protocol.pickle import dumps

    from amm_rules.engine.handlers import METADATA_KEY, engine_in_metadata

    try:
        said = await asyncio.wait_for(
            scheduler.get_metadata(keys=[METADATA_KEY], default=None), timeout
        )
    except Exception:
        said = None
    if engine_in_metadata(said):
        return "said"
    try:
        answer = await asyncio.wait_for(
            scheduler.run_function(function=dumps(partial(engine_attached, op=op))), timeout
        )
    except Exception:
        return "unknown"
    if not isinstance(answer, dict) or answer.get("status") != "OK":
        return "unknown"
    return cast(Found, answer.get("result"))


#: The handlers every release of the engine registers (the others came later).
CORE_HANDLERS = ("amm_rules_set_target", "amm_rules_explain", "amm_rules_status")


def engine_attached(dask_scheduler: Any, op: str) -> Found:
    """Runs in the scheduler: are the amm-rules handlers registered? ``"without-op"``
    when the engine is there but has no handler ``op`` (an older release)."""
    handlers = dask_scheduler.handlers
    if not all(name in handlers for name in CORE_HANDLERS):
        return "absent"
    return "found" if op in handlers else "without-op"


async def _set_target(client: Client, futures: list[Future], keys: list[Any], target: Any) -> Any:
    if futures:
        # Like Client.replicate: the target is for data in memory, so let the data land.
        await _wait(futures)
    await _require_engine(client, "amm_rules_set_target")
    keys = list(dict.fromkeys([*(f.key for f in futures), *keys]))
    answer = _refused(await client.scheduler.amm_rules_set_target(keys=keys, target=target))
    # Lists come back as tuples over TCP (msgpack) but as lists in-process: pick one.
    return {**answer, "missing": list(answer.get("missing", ()))}


async def _explain(client: Client, keys: list[Any]) -> Any:
    await _require_engine(client, "amm_rules_explain")
    got = _refused(
        await client.scheduler.amm_rules_explain(keys=list(dict.fromkeys(keys)), counts=True)
    )
    if got["shown"] < got["total"]:
        warnings.warn(
            f"amm_rules.explain: explained {got['shown']:,} of {got['total']:,} keys (the "
            f"scheduler explains at most {got['most']:,} in one call); pass fewer keys, "
            "or call again with the others",
            stacklevel=3,
        )
    return got["keys"]


async def _memory_flow(client: Client) -> Any:
    await _require_engine(client, "amm_rules_memory_flow")
    return dict(await client.scheduler.amm_rules_memory_flow())


#: Seconds between two looks at a drain while :func:`drain` waits for it.
DRAIN_POLL = 0.25


async def _drain(client: Client, workers: list[str], seconds: float, close: bool) -> Any:
    from amm_rules.engine.drain_request import follow

    await _require_engine(client, "amm_rules_drain")
    started = _refused(
        await client.scheduler.amm_rules_drain(
            workers=workers, deadline=seconds, close_workers=close
        )
    )

    async def ask(name: str, **kwargs: Any) -> Any:
        return _refused(await getattr(client.scheduler, name)(**kwargs))

    return await follow(ask, started, seconds, DRAIN_POLL)


async def _status(client: Client) -> Any:
    await _require_engine(client, "amm_rules_status")
    return await client.scheduler.amm_rules_status()
