"""What every benchmark's JSON opens with: when it ran, how long, on what."""

from __future__ import annotations

import os
import platform
import time
from typing import Any

import distributed


def header(started: float) -> dict[str, Any]:
    """Date and duration of a run started at ``started`` (``time.time()``), the machine
    (shared: the load before each run is in the runs), Python and distributed."""
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
