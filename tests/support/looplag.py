"""The loop-lag probe of the tests: :class:`benchmarks.support.looplag.LoopLag` (a
periodic callback on the scheduler's event loop recording its worst lateness), and
:func:`assert_no_stall`, through which the hostile-input tests assert that what they
sent did not block the loop.

Under ``gen_cluster`` the scheduler, its workers and the client share one event loop:
the probe started in the test runs beside the scheduler's handlers. Bounds are seconds
(:data:`STALL`), for stalls that took seconds before their fix and take milliseconds
after: they catch a stall, they never measure speed (``python -m benchmarks.hostile``
measures the lag per finding).
"""

from __future__ import annotations

from benchmarks.support.looplag import LoopLag

__all__ = ["STALL", "LoopLag", "assert_no_stall"]

#: The longest stall a test allows: the findings stalled the loop 4 to 40 s; fixed,
#: they stall it milliseconds (tens on a loaded machine).
STALL = 2.0


def assert_no_stall(lag: LoopLag, what: str, bound: float = STALL) -> None:
    """Fail if the probe saw the loop blocked longer than ``bound`` seconds."""
    worst = lag.worst
    assert lag.samples, f"{what}: the loop-lag probe never ran"
    assert worst <= bound, (
        f"{what}: the event loop was blocked {worst:.2f} s (bound {bound} s; "
        f"{len(lag.samples)} ticks of {lag.tick * 1000:.0f} ms)"
    )
