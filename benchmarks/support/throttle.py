"""A network of one machine with a slow link: a Linux network namespace whose loopback
sends at most a given rate (a token bucket, ``tc qdisc ... tbf``), for benchmarks that
need transfers to take time (a worker that cannot send everything before a deadline).

:func:`run_throttled` creates the namespace (named with this process's PID), brings its
loopback up with the rate limit, runs a command inside it (``ip netns exec``) and removes
the namespace afterwards, also when the command failed. Everything in the namespace
talks over that loopback: a scheduler and its workers started there share the rate, as
the processes of a machine share its network card.

Needs Linux, root, ``ip`` and ``tc`` (iproute2): :func:`unavailable` says why not.
Standard library only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence

#: The prefix of the namespaces made here.
PREFIX = "amrt"


def unavailable() -> str | None:
    """Why a throttled namespace cannot be made here (None: it can)."""
    if not sys.platform.startswith("linux"):
        return "needs Linux network namespaces"
    if os.geteuid() != 0:
        return "needs root (ip netns, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs the {tool!r} command (iproute2)"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def run_throttled(
    rate_mbit: float, command: Sequence[str], env: dict[str, str] | None = None
) -> int:
    """Run ``command`` in a fresh namespace whose loopback sends ``rate_mbit`` megabits
    per second at most; returns its exit status."""
    name = f"{PREFIX}{os.getpid()}"
    _ip("netns", "add", name)
    try:
        _ip("netns", "exec", name, "ip", "link", "set", "lo", "up")
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                name,
                "tc",
                "qdisc",
                "add",
                "dev",
                "lo",
                "root",
                "tbf",
                "rate",
                f"{rate_mbit:g}mbit",
                "burst",
                "256kb",
                "latency",
                "200ms",
            ],
            check=True,
            capture_output=True,
            timeout=10,
        )
        return subprocess.run(["ip", "netns", "exec", name, *command], env=env).returncode
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=10)


__all__ = ["run_throttled", "unavailable"]
