"""The keys a cycle's classification budget left over, and the loop that classifies a
place of them at a time.

Keys that entered memory wait in the key index's table of arrivals
(:attr:`KeyIndex.dirty <amm_rules.engine.state.index.KeyIndex.dirty>`, key -> task, in
the order they arrived) until a cycle classifies them. When the budget stops a cycle in
that table, what is left of it becomes a :class:`Backlog` as it is, with the loop's place
in it, and a new table takes the keys that arrive next. Taking classified keys out of a
table of a million one at a time cost as much as classifying them; a key that leaves
memory meanwhile is marked (:meth:`Backlog.mark`) rather than taken out, so that the
table never changes size and the place (its iterators) stays valid.

:meth:`Backlog.take` is the loop: keys in chunks of :data:`CLASSIFY_CHUNK` (the clock is
read once per chunk, not once per key), handed to the index, which classifies and files
them.

Neighbours: :mod:`amm_rules.engine.state.index` owns the backlog and the arrivals.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator
from itertools import islice
from typing import Any

#: Keys classified between two looks at the clock.
CLASSIFY_CHUNK = 4096

#: Marks a key of the backlog that left memory (or was classified on its own).
LEFT: Any = object()


class Backlog:
    """Keys to classify, with the place the classification reached in them (see the
    module docstring): the table of keys (key -> task) kept whole."""

    __slots__ = ("keys", "marked", "table", "taken", "tasks")

    def __init__(self, table: dict[Hashable, Any] | None = None) -> None:
        self.table: dict[Hashable, Any] = {} if table is None else table
        self.keys: Iterator[Hashable] = iter(self.table)
        self.tasks: Iterator[Any] = iter(self.table.values())
        #: Entries passed so far, and entries marked.
        self.taken = 0
        self.marked = 0

    def __len__(self) -> int:
        """Entries not reached yet (marked ones count until reached)."""
        return len(self.table) - self.taken

    def mark(self, key: Hashable) -> None:
        """The key left memory, or was classified on its own: passed over when reached."""
        if self.table.get(key, LEFT) is not LEFT:
            self.table[key] = LEFT
            self.marked += 1

    def holds(self, key: Hashable) -> bool:
        """Whether the key is in the table and not marked (reached or not: a lookup
        cannot tell where the place is)."""
        return self.table.get(key, LEFT) is not LEFT

    def waits(self, key: Hashable) -> bool:
        """Whether the key is still to be reached (a walk over what is left)."""
        return self.holds(key) and key in islice(self.table, self.taken, None)

    def waiting_keys(self) -> list[Hashable]:
        """The keys still to be reached, in order (a walk over what is left)."""
        left = islice(self.table.items(), self.taken, None)
        return [k for k, ts in left if ts is not LEFT]

    def take(
        self,
        classify: Callable[[list[Hashable] | None, list[Any]], None],
        limit: int,
        deadline: float | None,
        keyed: bool = False,
    ) -> tuple[int, bool]:
        """Hand up to ``limit`` keys from the place on to ``classify(keys, tasks)``, a
        chunk at a time, until ``deadline`` (a ``time.perf_counter()`` value, if
        given). Returns the keys taken (marked ones not counted) and whether the
        deadline stopped the loop. ``keyed``: the keys are read from the table too
        (they may map to None: keys to classify again); else ``keys`` is None and the
        tasks alone say which keys they are (most of them need not be touched at all,
        see :meth:`Classifier.classify <amm_rules.engine.decide.classify.Classifier.classify>`)."""
        keys_left = self.keys if keyed else None
        tasks_left = self.tasks
        done = 0
        chunk: list[Hashable] | None = None
        while done < limit:
            # Keys and tasks in two lists: a list of pairs would allocate a tuple per
            # key, and with it the cyclic garbage collector's attention.
            chunk_tasks = list(islice(tasks_left, min(CLASSIFY_CHUNK, limit - done)))
            if not chunk_tasks:
                break
            taken = len(chunk_tasks)
            if keys_left is not None:
                chunk = list(islice(keys_left, taken))
            self.taken += taken
            if self.marked:
                # Keys that left memory meanwhile: passed over, and not counted.
                chunk_tasks = [ts for ts in chunk_tasks if ts is not LEFT]
            done += len(chunk_tasks)
            classify(chunk, chunk_tasks)
            if deadline is not None and time.perf_counter() >= deadline:
                return done, True
        return done, False


__all__ = ["CLASSIFY_CHUNK", "LEFT", "Backlog"]
