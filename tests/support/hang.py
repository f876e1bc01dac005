"""A hang detector for work that takes milliseconds: :func:`hang_bound` fails a block
that runs past its bound, interrupting it with an alarm where the platform has one (so a
real hang ends) and measuring it in any case.

Bounds are seconds for what takes milliseconds on a quiet machine (and stays far below
them on a loaded one): they catch a hang, they never measure speed.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The default bound: checking a rules file, matching a glob or running a cycle takes
#: milliseconds (the slowest, a 1,000-class glob on a 100,000-character key, about
#: 0.3 s on a loaded machine).
HANG_SECONDS = 10.0


class Hang(BaseException):
    """Raised by the alarm. A BaseException, so that the loader's own safety net
    (which turns any Exception into an "internal error" diagnostic) cannot swallow it."""


@contextmanager
def hang_bound(seconds: float = HANG_SECONDS) -> Iterator[None]:
    """Fail if the block runs longer than ``seconds``: by an alarm where the platform
    has one (interrupting a real hang), and by measuring in any case."""
    use_alarm = hasattr(signal, "setitimer") and (
        threading.current_thread() is threading.main_thread()
    )
    previous: Any = None
    if use_alarm:

        def on_alarm(signum: int, frame: Any) -> None:
            raise Hang(f"still running after {seconds} s")

        previous = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    elapsed = time.monotonic() - start
    if elapsed > seconds:
        raise Hang(f"took {elapsed:.1f} s (bound {seconds} s)")
