"""Where the rules in force came from, and reloading them when their file changes.

:class:`RulesFile` owns the rules file of one :class:`~amm_rules.engine.policy.RulesPolicy`:
its path (None when the rules were given inline or as a compiled
:class:`~amm_rules.language.ruleset.Ruleset`), whether it is watched, when the rules in
force were loaded, and the recent reload errors. The policy asks :meth:`RulesFile.poll`
once per cycle; loading and checking is the language half's
(:func:`amm_rules.language.loader.load_ruleset`).

A changed file is read, parsed and checked off the event loop, in a thread of its own
(the language half is pure: it touches nothing of the scheduler): a file of 10,000
rules takes seconds to check. :meth:`RulesFile.poll` starts the load, waits for it a
moment (:data:`LOAD_WAIT`: a small file is installed in the same cycle), and
otherwise returns; the thread asks for an early cycle when it is done
(:attr:`RulesFile.ready`), and the poll of that cycle takes the compiled rules, which
the policy swaps in on the loop. One load at a time: a file that changes again meanwhile
is read again once the load in flight is done.

A file that cannot be used never replaces the running rules: the error is kept (and
reported once per distinct file state and error by the policy); the same state of a
file is read once, however long it stays.

A file may be caught half-written. One that changed *in place* (the same inode at the
same resolved path: an editor or a script writing into it) is therefore reloaded only
once it has stayed unchanged for ``reload-settle`` seconds (a setting of the rules in
force, 2 s by default): its state is watched cycle after cycle, and every further change
starts the wait again. A file that arrived by an atomic rename (a new inode), or a
Kubernetes ConfigMap update (the symlinks now resolve to another file), is complete by
construction and is reloaded at once. ``docs/deploy.md`` says how to edit the file safely:
write a temporary file next to it, then rename it over the rules file.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass
from functools import reduce
from operator import getitem
from typing import Any

from amm_rules.engine.events import clip_text
from amm_rules.language.diagnostics import RulesError
from amm_rules.language.ruleset import RELOAD_SETTLE, Ruleset

logger = logging.getLogger(__name__)

#: How many reload errors are kept (``amm_rules_status`` shows them).
RELOAD_ERRORS_KEPT = 10
#: Seconds the poll that starts a load waits for it on the event loop (a file of a
#: few rules takes a few milliseconds, and is then installed in the same cycle).
LOAD_WAIT = 0.02

Signature = tuple[Any, ...]


@dataclass(frozen=True)
class ReloadFailed:
    """A changed rules file that could not be used; the running rules stay."""

    #: The file's state when it was read (the policy reports each state once).
    signature: Signature | None
    #: The diagnostics, as ``validate`` prints them, or the I/O error.
    error: str


def in_dask_config(rules: Mapping[str, Any]) -> RulesError | None:
    """The errors of inline ``rules`` with the lines and columns of the dask config file
    they were written in, if one of the files dask read its config from has a
    ``RulesPolicy`` entry with exactly these rules (else None: they were set in code or
    in the environment, and have no position). Only called when the rules have
    errors, so reading the config files again costs nothing in normal operation."""
    import dask.config

    from amm_rules.language.dask_config import entries, inline_diagnostics
    from amm_rules.language.loader import read_rules_bytes
    from amm_rules.language.yaml_source import decode

    try:
        found = list(dask.config.collect_yaml(dask.config.paths, return_paths=True))
    except Exception:  # an unreadable config file: the errors keep no positions
        return None
    for path, config in found:
        if not any(reduce(getitem, at, config).get("rules") == rules for at in entries(config)):
            continue
        raw = read_rules_bytes(path)
        text = decode(raw)[0] if isinstance(raw, bytes) else None
        diagnostics = inline_diagnostics(text, str(path), rules) if text is not None else None
        if diagnostics and any(d.is_error for d in diagnostics):
            return RulesError(diagnostics, text)
    return None


class RulesFile:
    """The source of a policy's rules (see the module docstring)."""

    def __init__(self, rules: str | os.PathLike[str] | Mapping[str, Any] | Ruleset, reload: bool):
        #: The path, if the rules came from a file (watched for changes), else None.
        self.path = os.fspath(rules) if isinstance(rules, (str, os.PathLike)) else None
        #: Whether a changed file is reloaded.
        self.reload = bool(reload)
        #: The recent reload errors, newest last: ``{"time", "error"}``.
        self.errors: list[dict[str, Any]] = []
        #: Wall-clock time (seconds since the epoch) when the rules in force were loaded.
        self.loaded_at = time.time()
        #: Seconds a file changed in place must stay unchanged before it is reloaded (the
        #: ``reload-settle`` of the rules in force).
        self.settle = RELOAD_SETTLE
        self._signature = self._stat()
        #: A state of the file changed in place, and when it was first seen (monotonic).
        self._settling: tuple[Signature, float] | None = None
        #: Called, on the event loop, when a load started by :meth:`poll` is done (the
        #: policy asks for an early cycle, whose poll takes the rules).
        self.ready: Callable[[], None] | None = None
        #: The load in flight: the state of the file it reads, and its outcome to come.
        self._loading: tuple[Signature | None, Future[Ruleset | str]] | None = None

    def load(self, rules: str | os.PathLike[str] | Mapping[str, Any] | Ruleset) -> Ruleset:
        """The first rules: a :class:`RulesError` here fails the scheduler's start with the
        diagnostics, which is what a user configuring an invalid file should see."""
        if isinstance(rules, Ruleset):
            self.settle = rules.reload_settle
            return rules
        from amm_rules.language.loader import load_ruleset

        try:
            ruleset = load_ruleset(rules)
            self.settle = ruleset.reload_settle
            return ruleset
        except RulesError as exc:
            located = in_dask_config(rules) if isinstance(rules, Mapping) else None
            if located is None:
                raise
            raise located from exc

    def installed(self) -> None:
        """Note that the rules just loaded are now in force."""
        self.loaded_at = time.time()

    def poll(self) -> Ruleset | ReloadFailed | None:
        """A new ruleset if the file changed and can be used, :class:`ReloadFailed` if it
        changed and cannot, None if there is nothing to do now (not a file, not watched,
        unchanged, changed in place and not settled yet, read in the load thread and not
        done yet, or changing while it was read: then it is read again)."""
        if self.path is None or not self.reload:
            return None
        if self._loading is None:
            before = self._stat()
            if before == self._signature:
                self._settling = None
                return None
            if before is not None and self._in_place(before) and not self._settled(before):
                return None
            self._settling = None
            self._start(before)
        assert self._loading is not None
        before, loading = self._loading
        if not wait([loading], timeout=LOAD_WAIT).done:
            return None  # still loading: the thread asks for a cycle when it is done
        self._loading = None
        return self._taken(before, loading.result())

    def close(self) -> None:
        """Forget the load in flight (its thread ends when the load does)."""
        self._loading = None
        self.ready = None

    def _start(self, before: Signature | None) -> None:
        """Load the file in a thread of its own, which ends with the load."""
        path = self.path
        assert path is not None
        loading: Future[Ruleset | str] = Future()

        def load() -> None:
            loading.set_result(self._read(path))

        self._loading = (before, loading)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # polled outside an event loop: the next poll takes it
            loop = None
        ready = self.ready
        if loop is not None and ready is not None:
            loading.add_done_callback(lambda _: loop.call_soon_threadsafe(self._done, ready))
        threading.Thread(target=load, name="amm-rules-reload", daemon=True).start()

    def _done(self, ready: Callable[[], None]) -> None:
        if self._loading is not None and ready is self.ready:
            ready()

    @staticmethod
    def _read(path: str) -> Ruleset | str:
        """In the load thread: the compiled rules, or the error's words.

        The interpreter's cyclic garbage collector is off meanwhile. A load makes
        hundreds of thousands of objects, and each full collection they trigger walks
        every object of the process (the scheduler's too) holding the interpreter's
        lock: the event loop then waits. Measured, a file of 10,000 rules stalled the
        loop 80 to 240 ms four times with the collector on, 25 ms at most with it off.
        Objects are still freed by reference counting; cycles made meanwhile are
        collected once the load is done."""
        from amm_rules.language.loader import load_ruleset

        collecting = gc.isenabled()
        gc.disable()
        try:
            return load_ruleset(path)
        except RulesError as exc:
            return str(exc)
        except Exception as exc:  # OSError and anything else: the running rules stay
            return f"{path}: error: {exc}"
        finally:
            if collecting:
                gc.enable()

    def _taken(
        self, before: Signature | None, outcome: Ruleset | str
    ) -> Ruleset | ReloadFailed | None:
        """What :meth:`poll` makes of a finished load of the state ``before``."""
        if isinstance(outcome, Ruleset):
            if self._stat() != before:
                return None  # the file changed while being read: read it again
            self._signature = before
            self.settle = outcome.reload_settle
            return outcome
        self._signature = before
        return ReloadFailed(before, self.note_error(outcome))

    def note_error(self, error: str, **extra: Any) -> str:
        """Keep ``error`` among the recent ones (clipped: kept in the scheduler's memory,
        shown by status), with ``extra`` fields; returns it as kept."""
        error = clip_text(error)
        self.errors = [
            *self.errors[-(RELOAD_ERRORS_KEPT - 1) :],
            {"time": time.time(), "error": error, **extra},
        ]
        return error

    def _in_place(self, now: Signature | None) -> bool:
        """Whether the file changed in place since the state last handled: the same
        file (device, inode) at the same resolved path, its content or mode changed."""
        last = self._signature
        if now is None or last is None or now[0] == "error" or last[0] == "error":
            return False
        return now[2:5] == last[2:5]

    def _settled(self, now: Signature) -> bool:
        """Whether a state of the file changed in place has stayed unchanged for
        :attr:`settle` seconds (the wait starts when the state is first seen)."""
        clock = time.monotonic()
        if self._settling is None or self._settling[0] != now:
            self._settling = (now, clock)
            if self.settle > 0:
                logger.info(
                    "amm-rules: %s changed in place; reloading it once it stays unchanged "
                    "for %g s (reload-settle)",
                    self.path,
                    self.settle,
                )
        return clock - self._settling[1] >= self.settle

    def _stat(self) -> Signature | None:
        """What tells a changed file: its modification time, size, device, inode and
        resolved path (a ConfigMap's symlinks swapped to another file), and mode; or the
        error reading them (a file that disappears is a change too)."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
            target = os.path.realpath(self.path)
        except OSError as exc:
            return ("error", type(exc).__name__, exc.errno)
        return (st.st_mtime_ns, st.st_size, st.st_dev, st.st_ino, target, st.st_mode)
