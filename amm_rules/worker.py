"""The worker preload: SIGTERM becomes a drain before the worker exits.

``dask worker ... --preload amm_rules.worker`` (or ``distributed.worker.preload``): as
soon as SIGTERM arrives, the worker asks the scheduler's amm-rules engine to drain it
(its keys copied away in order of value) within ``amm-rules.drain.deadline``, dask
configuration of the worker's own process (default 25 s, under Kubernetes' 30 s grace
period), and exits once the drain ended: see docs/drain.md#sigterm-the-worker-preload. A
deadline that is not a duration fails the worker's start with a sentence naming it.

Where the signal arrives:

- **the worker process** (``--no-nanny``, or a container init that signals the whole
  process group, as ``tini -g`` does): the preload's handler replaces the one dask's
  command line installed (which would end the process at once), drains, then closes
  the worker; a second SIGTERM does what the first would have done without the preload;
- **the nanny** (the container's first process, which a plain SIGTERM reaches alone):
  a nanny closing on a signal stops its worker process after a few seconds. The
  preload gives its nanny a plugin (:class:`DrainOnSignal`) whose teardown, which the
  nanny awaits before it stops its worker, drains the worker when the nanny was
  signalled. The same module given as a nanny preload
  (``--preload-nanny amm_rules.worker``) installs that plugin directly.

A scheduler without the amm-rules engine (or of a release without drains) is said in
a warning, and the worker exits as it would have. Outside the main thread (workers of
an in-process ``LocalCluster``) no signal can be watched: a line at INFO says so.

Neighbours: :mod:`amm_rules.engine.sections.drain` drains (the ``amm_rules_drain`` and
``amm_rules_drain_report`` handlers of :mod:`amm_rules.engine.handlers`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
import weakref
from typing import Any

import dask
from distributed import Nanny
from distributed.diagnostics.plugin import NannyPlugin

logger = logging.getLogger("amm_rules.worker")

#: The dask configuration key of the deadline, and its default.
CONFIG_KEY = "amm-rules.drain.deadline"
DEFAULT_DEADLINE = "25s"
#: Seconds to wait for each answer of the scheduler.
ASK_TIMEOUT = 5.0
#: Seconds between two looks at the drain while it runs.
POLL = 0.25
#: The name of the nanny plugin.
PLUGIN_NAME = "amm-rules-drain-on-signal"

#: In this process: ``time.monotonic()`` when SIGTERM arrived (None: not yet).
_signalled: dict[str, float] = {}


def deadline_seconds() -> float:
    """``amm-rules.drain.deadline`` in seconds (``ValueError`` naming the key)."""
    from amm_rules.engine.drain_request import deadline_seconds as checked

    return checked(dask.config.get(CONFIG_KEY, DEFAULT_DEADLINE), f"dask config {CONFIG_KEY}")


async def drain_self(scheduler: Any, address: str, seconds: float) -> dict[str, Any] | None:
    """Ask the scheduler (an rpc) to drain the worker at ``address`` within ``seconds``,
    and wait until the drain ended or the time is up. Returns the drain's last report
    (None: the scheduler could not drain it, which a warning says)."""
    from amm_rules.engine.drain_request import DrainReport, follow
    from amm_rules.engine.handlers import refused

    async def ask(name: str, **kwargs: Any) -> Any:
        return refused(await asyncio.wait_for(getattr(scheduler, name)(**kwargs), ASK_TIMEOUT))

    try:
        started = await ask(
            "amm_rules_drain", workers=[address], deadline=seconds, close_workers=False
        )
    except Exception as exc:
        logger.warning(
            "amm-rules: SIGTERM: the scheduler did not drain %s (%s); leaving without a "
            "drain (is RulesPolicy, of a release with drains, in its active memory manager?)",
            address,
            _why(exc),
        )
        return None
    line = started.get(address) if isinstance(started, dict) else None
    if line is None:
        return None
    logger.warning("amm-rules: SIGTERM: %s", DrainReport.from_dict(line).notice())
    try:
        report = await follow(ask, {address: line}, seconds, POLL, grace=0.0)
    except Exception as exc:
        logger.warning("amm-rules: the drain of %s cannot be followed: %s", address, _why(exc))
        return line
    line = report.get(address) or line
    record = DrainReport.from_dict(line)
    if record.outcome is not None:
        logger.warning("amm-rules: %s", record.progress())
    return line


def _why(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return f"no answer within {ASK_TIMEOUT:g} s"
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _time_left(seconds: float) -> float:
    """The deadline counts from the signal, not from when the drain is asked for."""
    at = _signalled.get("at")
    return seconds if at is None else max(0.5, seconds - (time.monotonic() - at))


# --------------------------------------------------------------------------------------
# The nanny's side
# --------------------------------------------------------------------------------------


class DrainOnSignal(NannyPlugin):
    """In a nanny: note SIGTERM (its previous handler still runs), and at the nanny's
    close after it, drain the worker before the nanny stops the worker process."""

    idempotent = True
    name = PLUGIN_NAME

    def __init__(self, seconds: float | None = None):
        self.seconds = seconds

    def setup(self, nanny: Any) -> None:
        if self.seconds is None:
            self.seconds = deadline_seconds()
        _note_signals()

    async def teardown(self, nanny: Any) -> None:
        if "at" not in _signalled or _signalled.get("drained"):
            return  # an ordinary close, or the drain already ran
        _signalled["drained"] = time.monotonic()
        address = getattr(nanny, "worker_address", None)
        if not address:
            return
        await drain_self(nanny.scheduler, address, _time_left(self.seconds or 25.0))


def _note_signals() -> None:
    """Chain a SIGTERM handler that notes the time, once per process."""
    if _signalled.get("watching") or threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def noted(signum: int, frame: Any) -> None:
        _signalled.setdefault("at", time.monotonic())
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    signal.signal(signal.SIGTERM, noted)
    _signalled["watching"] = 1.0


# --------------------------------------------------------------------------------------
# The worker's side
# --------------------------------------------------------------------------------------


class SignalDrain:
    """In a worker process: SIGTERM drains the worker, then closes it."""

    def __init__(self, worker: Any, seconds: float):
        self.worker = worker
        self.seconds = seconds
        self.previous: Any = None
        self.task: asyncio.Future[Any] | None = None
        self.loop = asyncio.get_running_loop()

    def install(self) -> bool:
        if threading.current_thread() is not threading.main_thread():
            logger.info(
                "amm-rules: worker %s runs outside the main thread: SIGTERM is not watched",
                self.worker.address,
            )
            return False
        self.previous = signal.signal(signal.SIGTERM, self.handle)
        return True

    def uninstall(self) -> None:
        if self.previous is not None and signal.getsignal(signal.SIGTERM) == self.handle:
            signal.signal(signal.SIGTERM, self.previous)

    def handle(self, signum: int, frame: Any) -> None:
        # (No logging here: a signal handler must not re-enter the logging machinery.)
        _signalled.setdefault("at", time.monotonic())
        signal.signal(signal.SIGTERM, self.previous)  # a second SIGTERM: as before
        self.loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        if self.task is None:
            self.task = asyncio.ensure_future(self.drain_and_close())

    async def drain_and_close(self) -> None:
        worker = self.worker
        try:
            if not _signalled.get("drained"):
                _signalled["drained"] = time.monotonic()
                await drain_self(worker.scheduler, worker.address, _time_left(self.seconds))
        finally:
            if not await _stopped_by_nanny(worker):
                await worker.close(nanny=False, reason=CLOSED)


#: Why a worker closes after its drain (the worker's and the nanny's logs say it).
CLOSED = "amm-rules: drained after SIGTERM"
#: Seconds a nanny has to stop its worker process before it kills it.
STOP_TIMEOUT = 10.0


async def _stopped_by_nanny(worker: Any) -> bool:
    """Have the worker's nanny stop its process, the nanny's own way; False if it has
    no nanny or the nanny did not do it.

    The nanny stops a worker process through a queue that a thread of the process
    watches: the worker closes when that thread is told to. A worker closing itself
    leaves the thread waiting, and the process's exit then closes the queue under it:
    the nanny's code logged ``Worker process died unexpectedly`` with a ``TypeError``
    from ``watch_stop_q``. Stopped by the nanny, the process ends cleanly, and the
    nanny does what it does when a signal ends its worker: starts a new one, unless it
    is closing itself (it was signalled too, and waits for the drain)."""
    if not getattr(worker, "nanny", None):
        return False
    try:
        async with worker.rpc(worker.nanny) as nanny:
            # The answer never comes: the nanny answers once this process has ended.
            await asyncio.wait_for(nanny.kill(timeout=STOP_TIMEOUT, reason=CLOSED), ASK_TIMEOUT)
    except Exception:
        pass  # the comm closed with the worker, or the nanny did not answer in time
    return worker.status.name not in ("running", "paused", "init")


async def dask_setup(server: Any) -> None:
    """The preload's entry point, for a worker or a nanny."""
    seconds = deadline_seconds()
    if isinstance(server, Nanny):
        await server.plugin_add(DrainOnSignal(seconds), name=PLUGIN_NAME)
        return
    drain = SignalDrain(server, seconds)
    if drain.install():
        _installed[server] = drain
    if getattr(server, "nanny", None):
        # In the background: the nanny answers no one until its worker has started.
        _background.add(asyncio.ensure_future(_tell_nanny(server, seconds)))


#: The tasks telling nannies to wait for drains (kept until done).
_background: set[asyncio.Future[Any]] = set()


async def _tell_nanny(worker: Any, seconds: float) -> None:
    """Give the worker's nanny the plugin that waits for a drain at its close."""
    from distributed.protocol.pickle import dumps

    try:
        async with worker.rpc(worker.nanny) as nanny:
            answer = await nanny.plugin_add(plugin=dumps(DrainOnSignal(seconds)), name=PLUGIN_NAME)
        if isinstance(answer, dict) and answer.get("status") != "OK":
            raise RuntimeError(answer.get("exception") or answer)
    except Exception as exc:
        logger.warning(
            "amm-rules: the nanny of %s will not wait for a drain on SIGTERM: %s",
            worker.address,
            _why(exc),
        )
    finally:
        for task in [t for t in _background if t.done()]:
            _background.discard(task)


def dask_teardown(server: Any) -> None:
    drain = _installed.pop(server, None)
    if drain is not None:
        drain.uninstall()


#: The SIGTERM handler of each worker of this process that has one.
_installed: weakref.WeakKeyDictionary[Any, SignalDrain] = weakref.WeakKeyDictionary()


__all__ = ["CONFIG_KEY", "DEFAULT_DEADLINE", "DrainOnSignal", "deadline_seconds", "drain_self"]
