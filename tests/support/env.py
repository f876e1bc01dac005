"""Where the tests run: :func:`in_ci` reads the ``CI`` environment variable as CI
services set it (``true``, ``1``, ``yes``); ``CI=false`` or ``CI=0`` is a developer's
machine. In CI, tests that need an optional part of the system run or fail; elsewhere
they may skip with a reason."""

from __future__ import annotations

import os


def in_ci() -> bool:
    """True when the ``CI`` variable says this is a CI run."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}
