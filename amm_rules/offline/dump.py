"""Reading cluster dumps: what ``Client.dump_cluster_state`` writes, as plain records.

distributed writes the scheduler's state (and each worker's) as ``.msgpack.gz`` (gzip of
msgpack) or ``.yaml``. Plain values survive as they are; references between objects do
not: ``who_has`` is a list of ``WorkerState`` reprs
(``"<WorkerState 'tcp://10.0.0.1:4000', name: a, status: running, memory: 3, ...>"``),
``waiters`` and ``has_what`` lists of ``TaskState`` reprs (``"<TaskState ('x', 0)
memory>"``), a task's prefix the repr of its ``TaskPrefix`` (``"<x: memory: 1>"``), a
status the repr of an enum. This module parses those texts (addresses and keys with
:func:`ast.literal_eval`, which reads Python literals and nothing else) into a
:class:`ClusterState`: :class:`WorkerRecord` and :class:`TaskRecord` objects, keyed by
address and by key (tuples for tuple keys, as the scheduler has them).

A file that is not a readable dump, or that would cost too much to read (the bounds
are listed in docs/simulate.md, "Cluster dumps"; msgpack's in
:mod:`amm_rules.offline.bounded`), raises :class:`DumpError`, whose text is one line
naming the file and what is wrong. References that cannot be resolved (a holder that is
not in the dump's workers, a repr in an unknown shape) are skipped and counted in
:attr:`ClusterState.warnings`.

Nothing here imports ``distributed`` or the engine: :mod:`amm_rules.offline.sim_cluster`
turns the records into the scheduler-shaped objects the engine reads, and
``amm-rules validate --dump`` reads pools from them.
"""

from __future__ import annotations

import ast
import os
import re
import stat
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from amm_rules.offline.bounded import Budget, Refused, Stream, limit_words
from amm_rules.offline.bounded import unpacker as bounded_unpacker

Key = Hashable

_WORKER_REPR = re.compile(r"""^<WorkerState (?P<addr>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""")
_TASK_REPR = re.compile(r"^<TaskState (?P<key>.+) (?P<state>[A-Za-z_-]+)>$", re.DOTALL)
# "<name: memory: 3, released: 1>": the name is everything before the last ": " that is
# followed by the state counts (names may contain ": " themselves).
_NAMED_REPR = re.compile(r"^<(?P<name>.*): (?:[a-z_-]+: \d+(?:, [a-z_-]+: \d+)*)?>$", re.DOTALL)
_STATUS_REPR = re.compile(r"Status\.(?P<name>\w+)")
_HOST = re.compile(r"^(?:[a-z+]+://)?(?P<host>\[[^\]]*\]|[^:/]*)")
#: The measures of ``distributed.scheduler.MemoryState`` a dump records per worker.
MEASURES = ("process", "managed", "spilled", "unmanaged_old")
#: Most bytes a dump may hold once decompressed; ``--max-dump-size`` raises it. (A
#: 194 kB .msgpack.gz can hold 2 GB.)
MAX_DUMP_BYTES = 2**30
#: Most values the aliases of a YAML dump may add when expanded (distributed writes an
#: alias for a mapping shared by many tasks, such as their annotations), and the
#: deepest nesting of a YAML dump.
MAX_ALIAS_VALUES = 1_000_000
MAX_DUMP_DEPTH = 200


class DumpError(Exception):
    """A cluster dump that cannot be read; ``str()`` is one line for the user."""


@dataclass(slots=True)
class WorkerRecord:
    """One worker as the scheduler saw it."""

    address: str
    name: str
    host: str
    #: The name of its ``distributed.core.Status``: ``running``, ``paused``,
    #: ``closing_gracefully``...
    status: str
    resources: dict[str, float] = field(default_factory=dict)
    nthreads: int = 1
    memory_limit: int = 0
    #: ``process``, ``managed``, ``spilled``, ``unmanaged_old`` in bytes (the parts
    #: every other measure is computed from).
    memory: dict[str, int] = field(default_factory=dict)
    #: Keys in memory on it, in the scheduler's order (oldest first).
    has_what: list[Key] = field(default_factory=list)


@dataclass(slots=True)
class TaskRecord:
    """One task as the scheduler saw it."""

    key: Key
    state: str
    prefix: str
    group: str
    type: str | None = None
    nbytes: int = 0
    #: Addresses of the workers holding it in memory.
    who_has: tuple[str, ...] = ()
    #: Keys of the tasks waiting for it.
    waiters: tuple[Key, ...] = ()
    #: Address of the worker it is processing on, if it is.
    processing_on: str | None = None
    annotations: dict[str, Any] = field(default_factory=dict)
    actor: bool = False
    #: The task's resource restriction (``resources=``), as recorded.
    resources: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class GroupRecord:
    """One task group as the scheduler saw it (for the recompute estimates)."""

    name: str
    #: Seconds its tasks computed (``all_durations["compute"]``).
    compute: float = 0.0
    #: Its tasks per state.
    states: dict[str, int] = field(default_factory=dict)
    #: Names of the groups it depends on.
    dependencies: tuple[str, ...] = ()


@dataclass
class ClusterState:
    """A cluster at one moment: from a dump, a running scheduler or a test fixture."""

    #: Where it came from (a path, an address, a test file).
    source: str
    workers: dict[str, WorkerRecord] = field(default_factory=dict)
    tasks: dict[Key, TaskRecord] = field(default_factory=dict)
    #: What could not be read and was left out (one line each).
    warnings: list[str] = field(default_factory=list)
    #: Runtime targets the engine recorded in the dump: key -> (min, max or None), each
    #: a number or ``"all"``.
    runtime: dict[Key, tuple[Any, Any]] = field(default_factory=dict)
    #: Where the runtime targets not set with ``amm_rules.replicate`` came from: key ->
    #: ``"client.replicate"`` or ``"scatter broadcast"``.
    runtime_origins: dict[Key, str] = field(default_factory=dict)
    #: Task groups by name (empty for a dump without them).
    groups: dict[str, GroupRecord] = field(default_factory=dict)

    def in_memory(self) -> Iterable[TaskRecord]:
        return (t for t in self.tasks.values() if t.state == "memory" and t.who_has)

    def __repr__(self) -> str:
        n = sum(1 for _ in self.in_memory())
        return f"<ClusterState {self.source}: {len(self.workers)} workers, {n} keys in memory>"


# -- files --------------------------------------------------------------------------


def read_dump(path: str | os.PathLike[str], max_bytes: int = MAX_DUMP_BYTES) -> ClusterState:
    """Read a ``.msgpack.gz`` or ``.yaml`` cluster dump (also ``.msgpack``, ``.yaml.gz``)
    of at most ``max_bytes`` once decompressed."""
    name = os.fspath(path)
    return parse_state(decode(read_bytes(name, max_bytes), name, max_bytes), name)


def read_bytes(name: str, max_bytes: int = MAX_DUMP_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` (what is not a regular file
    is refused before it is opened: a named pipe would wait for a writer, a device
    never end)."""
    try:
        st = os.stat(name)
    except FileNotFoundError:
        raise DumpError(f"{name}: no such file") from None
    except OSError as exc:
        raise DumpError(f"{name}: cannot read the file: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise DumpError(f"{name}: is a directory, not a cluster dump")
    if not stat.S_ISREG(st.st_mode):
        raise DumpError(f"{name}: not a regular file ({_kind(st.st_mode)}), not a cluster dump")
    if st.st_size > max_bytes:
        raise DumpError(f"{name}: larger than {_limit(max_bytes)}")
    try:
        with open(name, "rb") as f:  # (a read of max_bytes would allocate as much)
            raw = f.read(st.st_size + 1)
    except OSError as exc:
        raise DumpError(f"{name}: cannot read the file: {exc.strerror or exc}") from None
    if len(raw) > max_bytes:
        raise DumpError(f"{name}: larger than {_limit(max_bytes)}")
    return raw


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a file"


def _limit(max_bytes: int) -> str:
    from amm_rules.engine.words import size

    return f"the limit of {size(max_bytes)} for a cluster dump (--max-dump-size raises it)"


def decode(raw: bytes, name: str, max_bytes: int = MAX_DUMP_BYTES) -> Any:
    """The plain data of a dump file's bytes (gzip, then msgpack or YAML). gzip is
    decompressed as it is read and msgpack decoded within bounds
    (:mod:`amm_rules.offline.bounded`): a msgpack dump is never held whole."""
    too_large = f"decompresses to more than {_limit(max_bytes)}; a decompression bomb?"
    stream = Stream(raw, max_bytes, too_large)
    try:
        first = stream.peek()
        if 0x80 <= first <= 0x8F or first in (0xDE, 0xDF):  # a msgpack map
            return _msgpack(stream, name, max_bytes)
        text = stream.read()
    except Refused as exc:
        raise DumpError(f"{name}: {exc}") from None
    if not text.strip():
        raise DumpError(f"{name}: the file is empty")
    return _yaml(text, name)


#: The parts of ``scheduler`` a dump is read for; the rest (the transition log, events,
#: clients...) is skipped unread in msgpack dumps, where it is often most of the file.
#: The workers' own states (top-level ``workers``) are skipped too. Task groups are
#: read for their compute time, states and dependencies (the recompute estimates).
SCHEDULER_PARTS = frozenset({"address", "id", "workers", "tasks", "memory", "task_groups"})
#: The engine's own part of a dump (``scheduler.extensions``), the one extension read.
ENGINE_EXTENSION = "amm-rules"


def _msgpack(stream: Stream, name: str, max_bytes: int) -> Any:
    """The dump's plain data, streamed: only the parts that are read are built, within
    the decoder's bounds."""
    import msgpack

    budget = Budget(stream)
    unpacker = bounded_unpacker(stream, budget, max_bytes)
    try:
        out: dict[Any, Any] = {}
        for _ in range(unpacker.read_map_header()):
            key = unpacker.unpack()
            if key == "scheduler":
                extensions = {"extensions": (ENGINE_EXTENSION,)}
                out[key] = _only(unpacker, budget, SCHEDULER_PARTS, extensions)
            elif key == "workers":
                budget.skip(unpacker)
                out[key] = {}
            else:
                out[key] = unpacker.unpack()
    except Refused:
        raise
    except msgpack.OutOfData:
        raise DumpError(f"{name}: the msgpack data ends early (the file is truncated)") from None
    except Exception as exc:  # ValueError and msgpack's own (format, stack, type) errors
        bomb = limit_words(exc)
        if bomb is not None:
            raise DumpError(f"{name}: {bomb}") from None
        why = str(exc) or type(exc).__name__  # a StackError (nesting too deep) says nothing
        raise DumpError(f"{name}: not readable as msgpack ({why})") from None
    try:
        unpacker.unpack()
    except msgpack.OutOfData:
        return out
    except Refused:
        raise
    except Exception:
        pass
    raise DumpError(f"{name}: data after the end of the dump (not one msgpack document)")


def _only(unpacker: Any, budget: Budget, names: Any, inner: Any = None) -> Any:
    """A mapping with only its entries ``names`` read, and the entries of ``inner``
    (name -> names) read likewise; the others are skipped unread. A non-mapping is read
    as is, for :func:`parse_state` to refuse."""
    try:
        n = unpacker.read_map_header()
    except ValueError:
        return unpacker.unpack()
    out = {}
    for _ in range(n):
        key = unpacker.unpack()
        if key in names:
            out[key] = unpacker.unpack()
        elif inner is not None and key in inner:
            out[key] = _only(unpacker, budget, inner[key])
        else:
            budget.skip(unpacker)
    return out


def _yaml(raw: bytes, name: str) -> Any:
    import yaml

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DumpError(
            f"{name}: not a cluster dump (neither msgpack nor YAML text; "
            "Client.dump_cluster_state writes .msgpack.gz or .yaml)"
        ) from None
    # The safe loader below, driven as yaml.safe_load drives its own, with the node
    # graph's expansion measured before anything is built from it.
    loader = _loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_nodes(node, name)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DumpError(f"{name}{where}: not readable as YAML ({problem})") from None
    finally:
        loader.dispose()


def _check_nodes(root: Any, name: str) -> None:
    """Refuse a YAML node graph whose aliases (shared nodes) stand for more than
    :data:`MAX_ALIAS_VALUES` values beyond the graph's own, that contains itself, or
    that nests deeper than :data:`MAX_DUMP_DEPTH`; and integers PyYAML would build in
    quadratic time. One pass over the distinct nodes (sizes are remembered per node)."""
    from yaml.nodes import MappingNode, ScalarNode

    from amm_rules.language.yaml_source import MAX_INT_CHARS, long_integer_message

    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: Any, depth: int) -> int:
        known = sizes.get(id(node))
        if known is not None:
            return known
        where = f"{name}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"
        if isinstance(node, ScalarNode):
            if node.tag == "tag:yaml.org,2002:int" and len(node.value) > MAX_INT_CHARS:
                raise DumpError(f"{where}: {long_integer_message(node.value)}")
            sizes[id(node)] = 1
            return 1
        if depth > MAX_DUMP_DEPTH:
            raise DumpError(f"{where}: nesting deeper than {MAX_DUMP_DEPTH} levels")
        if id(node) in open_:
            raise DumpError(f"{where}: an alias refers to a node that contains it")
        open_.add(id(node))
        children = (
            [x for pair in node.value for x in pair]
            if isinstance(node, MappingNode)
            else node.value
        )
        total = 1 + sum(size(child, depth + 1) for child in children)
        open_.discard(id(node))
        sizes[id(node)] = total
        return total

    expanded = size(root, 0)
    if expanded > len(sizes) + MAX_ALIAS_VALUES:
        raise DumpError(
            f"{name}: its aliases expand to {expanded - len(sizes):,} more values than "
            f"the file holds (at most {MAX_ALIAS_VALUES:,}); an alias bomb?"
        )


def _loader() -> Any:
    """PyYAML's safe loader (libyaml's when there), remembering the tag of each distinct
    plain scalar: a dump repeats the same field names and reprs hundreds of thousands of
    times, and resolving a scalar's tag runs regular expressions in Python."""
    import yaml
    from yaml.nodes import ScalarNode

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    # The base is chosen at run time (the C loader when PyYAML has it): mypy cannot
    # type a class whose base is a variable.
    class DumpLoader(base):  # type: ignore[misc, valid-type]
        def __init__(self, stream: Any):
            super().__init__(stream)
            self._tags: dict[tuple[Any, Any], Any] = {}

        def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
            if kind is not ScalarNode:
                return super().resolve(kind, value, implicit)
            memo = (value, implicit)
            try:
                return self._tags[memo]
            except KeyError:
                tag = self._tags[memo] = super().resolve(kind, value, implicit)
                return tag

    return DumpLoader


# -- layout ---------------------------------------------------------------------------


def parse_state(data: Any, source: str) -> ClusterState:
    """A :class:`ClusterState` from a dump's plain data."""
    scheduler = _section(data, source)
    state = ClusterState(source)
    refs = _Refs()
    for address, entry in _mapping(scheduler, "workers", source).items():
        worker = _worker(address, entry, source, refs)
        state.workers[worker.address] = worker
    for name, entry in _mapping(scheduler, "tasks", source).items():
        task = _task(name, entry, source, refs, state.workers)
        state.tasks[task.key] = task
    for worker in state.workers.values():
        worker.has_what = [k for k in worker.has_what if k in state.tasks]
    state.runtime, state.runtime_origins = _runtime_targets(scheduler)
    state.groups = _groups(scheduler.get("task_groups"), refs)
    state.warnings.extend(refs.warnings())
    return state


def _groups(entries: Any, refs: _Refs) -> dict[str, GroupRecord]:
    """The task groups of a dump: compute seconds, states, dependencies; entries of
    another shape are left out (the estimates are then unknown for their keys)."""
    out: dict[str, GroupRecord] = {}
    for name, entry in entries.items() if isinstance(entries, Mapping) else ():
        if not isinstance(entry, Mapping):
            continue
        durations = entry.get("all_durations")
        compute = durations.get("compute") if isinstance(durations, Mapping) else None
        states = entry.get("states")
        deps = entry.get("dependencies")
        out[str(name)] = GroupRecord(
            str(name),
            float(compute) if isinstance(compute, (int, float)) else 0.0,
            {
                str(k): int(v)
                for k, v in (states.items() if isinstance(states, Mapping) else ())
                if isinstance(v, int)
            },
            tuple(n for d in (deps if isinstance(deps, list) else ()) if (n := refs.named(d))),
        )
    return out


def _runtime_targets(
    scheduler: Mapping[str, Any],
) -> tuple[dict[Key, tuple[Any, Any]], dict[Key, str]]:
    """The runtime targets the engine wrote into the dump (none from a dump of a cluster
    without amm-rules, or from an older one), and the origins of those that distributed's
    own calls set; entries of another shape are left out."""
    extensions = scheduler.get("extensions")
    engine = extensions.get(ENGINE_EXTENSION) if isinstance(extensions, Mapping) else None
    entries = engine.get("runtime_targets") if isinstance(engine, Mapping) else None
    out: dict[Key, tuple[Any, Any]] = {}
    origins: dict[Key, str] = {}
    for entry in entries if isinstance(entries, list) else ():
        if not (isinstance(entry, list) and len(entry) in (3, 4)):
            continue
        key, lo, hi = freeze_key(entry[0]), entry[1], entry[2]
        if not (_bound(lo) and (hi is None or _bound(hi))):
            continue
        out[key] = (lo, hi)
        if len(entry) == 4 and entry[3] in _LEGACY_ORIGINS:
            origins[key] = entry[3]
    return out, origins


#: The origins of runtime targets set by distributed's own calls (see
#: :mod:`amm_rules.engine.sections.legacy`).
_LEGACY_ORIGINS = ("client.replicate", "scatter broadcast")


def _bound(value: Any) -> bool:
    """A bound of a target as a dump writes it: a whole number, or ``"all"``."""
    return value == "all" or (isinstance(value, int) and not isinstance(value, bool))


def _section(data: Any, source: str) -> Mapping[str, Any]:
    hint = "a dump from Client.dump_cluster_state has 'scheduler', 'workers' and 'versions'"
    if not isinstance(data, Mapping):
        raise DumpError(f"{source}: not a cluster dump ({hint})")
    scheduler = data.get("scheduler")
    if not isinstance(scheduler, Mapping):
        raise DumpError(f"{source}: not a cluster dump: no 'scheduler' section ({hint})")
    for section in ("versions", "workers"):
        if section not in data:
            raise DumpError(
                f"{source}: incomplete cluster dump: no '{section}' section "
                "(was the file cut short?)"
            )
    return scheduler


def _mapping(scheduler: Mapping[str, Any], name: str, source: str) -> Mapping[Any, Any]:
    value = scheduler.get(name)
    if not isinstance(value, Mapping):
        raise DumpError(
            f"{source}: unknown cluster dump layout: scheduler.{name} is "
            f"{'missing' if value is None else type(value).__name__}, expected a mapping"
        )
    return value


def _worker(address: Any, entry: Any, source: str, refs: _Refs) -> WorkerRecord:
    if not isinstance(entry, Mapping):
        raise DumpError(
            f"{source}: unknown cluster dump layout: worker {address!r} is not a mapping"
        )
    address = str(entry.get("address") or address)
    memory = entry.get("memory")
    memory = memory if isinstance(memory, Mapping) else {}
    name = entry.get("name")
    return WorkerRecord(
        address=address,
        name=address if name is None else str(name),
        host=str(entry.get("host") or host_of(address)),
        status=status_name(entry.get("status")),
        resources=_restrictions(entry.get("resources")),
        nthreads=_int(entry.get("nthreads"), 1),
        memory_limit=_int(entry.get("memory_limit"), 0),
        memory={m: _int(memory.get(m), 0) for m in MEASURES},
        has_what=[k for k in map(refs.task, _items(entry.get("has_what"), refs)) if k is not None],
    )


def _task(
    name: Any, entry: Any, source: str, refs: _Refs, workers: Mapping[str, WorkerRecord]
) -> TaskRecord:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("state"), str):
        raise DumpError(f"{source}: unknown cluster dump layout: task {name!r} has no 'state'")
    key = freeze_key(entry["key"]) if "key" in entry else refs.literal_key(name)
    who_has = []
    for ref in _items(entry.get("who_has"), refs):
        address = refs.worker(ref)
        if address is not None and address in workers:
            who_has.append(address)
        elif address is not None:
            refs.unknown_holders += 1
    processing_on = refs.worker(entry.get("processing_on")) if entry.get("processing_on") else None
    annotations = entry.get("annotations")
    type_ = entry.get("type")
    return TaskRecord(
        key=key,
        state=entry["state"],
        prefix=refs.named(entry.get("prefix")) or prefix_of(key),
        group=str(entry.get("group_key") or refs.named(entry.get("group")) or prefix_of(key)),
        type=type_ if isinstance(type_, str) else None,
        nbytes=max(_int(entry.get("nbytes"), 0), 0),
        who_has=tuple(who_has),
        waiters=tuple(
            k for k in map(refs.task, _items(entry.get("waiters"), refs)) if k is not None
        ),
        processing_on=processing_on,
        annotations=dict(annotations) if isinstance(annotations, Mapping) else {},
        actor=bool(entry.get("actor")),
        resources=_restrictions(entry.get("resource_restrictions")),
    )


def _restrictions(value: Any) -> dict[str, float]:
    """Recorded resources (a worker's, or a task's restriction): names to amounts,
    numbers only (a boolean is no amount)."""
    if not isinstance(value, Mapping):
        return {}
    return {
        str(k): v
        for k, v in value.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


# -- the texts that stand for objects ----------------------------------------------------


class _Refs:
    """Parses reprs, each distinct text once, and counts those it cannot read."""

    def __init__(self) -> None:
        self._workers: dict[str, str | None] = {}
        self._tasks: dict[str, Key | None] = {}
        self._named: dict[str, str | None] = {}
        self.bad: Counter[str] = Counter()
        self.unknown_holders = 0

    def worker(self, ref: Any) -> str | None:
        """The address in a ``WorkerState`` repr (or a plain address)."""
        if not isinstance(ref, str):
            self.bad["worker reference"] += 1
            return None
        if ref in self._workers:
            return self._workers[ref]
        address: str | None
        if ref.startswith("<"):
            m = _WORKER_REPR.match(ref)
            address = _literal(m["addr"]) if m else None
            if not isinstance(address, str):
                self.bad["worker reference"] += 1
                address = None
        else:
            address = ref
        self._workers[ref] = address
        return address

    def task(self, ref: Any) -> Key | None:
        """The key in a ``TaskState`` repr."""
        if not isinstance(ref, str):
            self.bad["task reference"] += 1
            return None
        if ref in self._tasks:
            return self._tasks[ref]
        m = _TASK_REPR.match(ref)
        text = m["key"] if m else ""
        if (
            len(text) > 1
            and text[0] == text[-1] == "'"
            and "'" not in text[1:-1]
            and "\\" not in text
        ):
            key: Key | None = text[1:-1]  # a plain string key: its repr is itself in quotes
        else:
            key = freeze_key(_literal(text)) if m else None
        if key is None:
            self.bad["task reference"] += 1
        self._tasks[ref] = key
        return key

    def literal_key(self, text: Any) -> Key:
        """A key written as a mapping key of ``scheduler.tasks`` (``"['x', 0]"``)."""
        if isinstance(text, str) and text[:1] in "[(":
            value = _literal(text)
            if value is not None:
                return freeze_key(value)
        return freeze_key(text)

    def named(self, ref: Any) -> str | None:
        """The name in a ``TaskPrefix``/``TaskGroup`` repr (or a plain name)."""
        if not isinstance(ref, str) or not ref:
            return None
        if ref in self._named:
            return self._named[ref]
        if ref.startswith("<"):
            m = _NAMED_REPR.match(ref)
            name = m["name"] if m else None
        else:
            name = ref
        self._named[ref] = name
        return name

    def warnings(self) -> list[str]:
        out = [f"{n} {what}s could not be read and were left out" for what, n in self.bad.items()]
        if self.unknown_holders:
            out.append(
                f"{self.unknown_holders} copies on workers that are not in the dump were left out"
            )
        return out


def _items(value: Any, refs: _Refs) -> list[Any] | tuple[Any, ...]:
    """A list of references as a dump writes them (``who_has``, ``has_what``,
    ``waiters``); anything else (a number, a mapping) is counted and left out."""
    if value is None or isinstance(value, (list, tuple)):
        return value or ()
    refs.bad["reference list"] += 1
    return ()


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def freeze_key(value: Any) -> Key:
    """A key as the scheduler has it: lists (how dumps store tuples) become tuples."""
    if isinstance(value, list):
        return tuple(freeze_key(v) for v in value)
    if isinstance(value, (str, bytes, int, float, tuple)) or value is None:
        return value
    return str(value)


def status_name(value: Any) -> str:
    """``"<Status.running: 'running'>"`` (or ``"running"``) -> ``"running"``."""
    if not isinstance(value, str):
        return "running" if value is None else str(value)
    m = _STATUS_REPR.search(value)
    return m["name"] if m else value


def host_of(address: str) -> str:
    """The host part of an address (``tcp://10.0.0.1:4000`` -> ``10.0.0.1``)."""
    m = _HOST.match(address)
    host = m["host"] if m else ""
    return host.strip("[]") or address


def prefix_of(key: Key) -> str:
    """What dask names the prefix of a key (its first word without a hash), as
    :func:`dask.utils.key_split` does; used when a dump has no prefix for a task."""
    from dask.utils import key_split

    return str(key_split(key))


def group_of(key: Key) -> str:
    """What the scheduler names the task group of a key, as
    :func:`distributed.utils.key_split_group` does: a tuple key's group keeps its
    hash (``('x-bd20...', 0)`` is of group ``x-bd20...``, prefix ``x``)."""
    from distributed.utils import key_split_group

    return str(key_split_group(key))


def _int(value: Any, default: int) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value == value and abs(value) < 2**63:
        return int(value)
    return default
