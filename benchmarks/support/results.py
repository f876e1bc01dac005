"""What every cluster benchmark's JSON says of the run before its own figures: when, how
long, on what machine (shared: the load average before each run is in the runs), with
which Python and distributed."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import distributed


def run_header(started: float) -> dict[str, Any]:
    """The header of a results file for a run that started at ``started`` (``time.time()``)."""
    return {
        "date": time.strftime("%Y-%m-%d", time.localtime(started)),
        "duration_s": round(time.time() - started),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "shared": "yes: other work ran on the machine; see load_before per run",
        },
        "python": platform.python_version(),
        "distributed": distributed.__version__,
    }
