"""The amm-rules page of the scheduler's dashboard, turned on as a scheduler preload:
``dask scheduler --preload amm_rules.preload``, or ``distributed.scheduler.preload`` in
the scheduler's dask configuration (``amm_rules.dashboard``, the name of earlier
releases, is the same preload; see docs/dashboard.md).

Importing this module (which the scheduler does while it is created, before it builds
its dashboard) adds the pages ``/amm-rules`` and ``/individual-amm-rules`` to the
dashboard's Bokeh applications (:mod:`amm_rules.observe.dashboard`). ``dask_setup``,
called once the scheduler has started, adds the JSON route ``/amm-rules/status.json``
(:mod:`amm_rules.observe.routes`) and logs where the page is. A scheduler that cannot
import Bokeh (dask's dashboard needs it too) logs one line saying so and still serves
the JSON route; nothing else changes. Neither does one whose distributed lacks a piece
the page is built of (:data:`amm_rules.engine.features.DASHBOARD`): the page is then off,
said in the log at import and, once the scheduler runs, by the engine (an
``unsupported`` event and its status).

Why a preload: the dashboard's pages are read once, when the scheduler builds its
dashboard, and a preload module is the one thing distributed imports before that.
"""

from __future__ import annotations

import importlib.util
import logging
from types import ModuleType
from typing import Any

from amm_rules.engine.features import DASHBOARD, Need, missing, words
from amm_rules.observe import extension, routes

logger = logging.getLogger(__name__)

_page: ModuleType | None = None
_missing: str | None = None
#: What the page needs of distributed and this one lacks (see amm_rules.engine.features).
_lacking: list[Need] = []
if importlib.util.find_spec("bokeh") is not None:
    _lacking = missing(DASHBOARD)
if _lacking:
    logger.warning("amm-rules: %s", words(DASHBOARD.name, _lacking))
else:
    try:
        from amm_rules.observe import dashboard as page
    except ImportError as exc:  # Bokeh missing, or a version dask's dashboard refuses
        _missing = f"{type(exc).__name__}: {exc}"
    else:
        page.register()
        _page = page


def dask_setup(scheduler: Any) -> None:
    """Serve ``/amm-rules/status.json``; say where the page is, or why there is none."""
    path = routes.add_routes(scheduler)
    if path is None:
        logger.warning("amm-rules: this scheduler has no HTTP server: no dashboard page")
        return
    prefix = routes.http_prefix(scheduler)
    if _lacking:
        # Said once at import (in the log); the engine's status and events say it too.
        policy = extension.engine_of(scheduler)
        if policy is not None:
            policy.unsupported_feature(DASHBOARD.name, _lacking)
    elif _page is None:
        from distributed.versions import BOKEH_REQUIREMENT

        logger.warning(
            "amm-rules: no dashboard page: Bokeh cannot be imported in this scheduler "
            "(%s); install %s, as dask's dashboard needs. %s is served.",
            _missing,
            BOKEH_REQUIREMENT,
            path,
        )
    elif not _has_page(scheduler, prefix):
        logger.warning(
            "amm-rules: the scheduler built its dashboard without the amm-rules page: "
            "its dashboard is off, or amm_rules.preload was imported after it was "
            "built (load it with --preload or distributed.scheduler.preload). %s is served.",
            path,
        )
    else:
        logger.info("amm-rules: dashboard page at %samm-rules; status at %s", prefix, path)


def _has_page(scheduler: Any, prefix: str) -> bool:
    """Whether the scheduler's Bokeh server has the page."""
    url = _page.URL if _page is not None else None  # Bokeh lists its paths without the prefix
    apps = getattr(scheduler.http_application, "applications", ())
    return any(url in getattr(app, "app_paths", ()) for app in apps)
