"""``/amm-rules/status.json``: the status report over the scheduler's HTTP server.

The route serves what ``amm-rules status --format json`` prints (both are
:func:`~amm_rules.observe.status.status_json` of
:func:`~amm_rules.observe.status.status_report`), for scripts, probes and dashboards
that speak HTTP rather than Dask's comm. It answers 404 with a JSON ``error`` when no
:class:`~amm_rules.engine.policy.RulesPolicy` is attached to the scheduler.

Two ways in, as for any route of the scheduler's HTTP server:

- :func:`add_routes` at run time (the ``amm_rules.preload`` preload calls it from
  ``dask_setup``), under the scheduler's dashboard prefix (``--dashboard-prefix``);
- :data:`routes`, for dask's ``distributed.scheduler.http.routes`` list of modules.

Requests are answered from :func:`~amm_rules.observe.status.shared_json`: one report,
serialised once, per :data:`~amm_rules.observe.status.SHARED_FOR` seconds, however many
clients poll. Answers say ``X-Content-Type-Options: nosniff``: a browser never reads
them as anything but JSON.

Neighbours: :mod:`amm_rules.preload` (the preload) and
:mod:`amm_rules.observe.dashboard` (the Bokeh page, which draws the same report).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from distributed.http.utils import RequestHandler

from amm_rules.observe.extension import engine_of
from amm_rules.observe.status import shared_json

logger = logging.getLogger(__name__)

#: The route, relative to the dashboard's prefix.
STATUS_JSON = "amm-rules/status.json"
NO_POLICY = "no RulesPolicy attached to this scheduler's Active Memory Manager"


class StatusJSON(RequestHandler):
    """GET: the status report of the scheduler's RulesPolicy, as JSON."""

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        policy = engine_of(self.server)
        if policy is None:
            self._error(404, NO_POLICY)
            return
        try:
            text = shared_json(policy)
        except Exception as exc:  # a bug: answer, log it, and keep serving
            logger.exception("amm-rules: %s failed", STATUS_JSON)
            self._error(500, f"the status report failed: {type(exc).__name__}: {exc}")
            return
        self.write(text)

    def _error(self, status: int, message: str) -> None:
        self.set_status(status)
        self.write(json.dumps({"error": message}) + "\n")


#: For ``distributed.scheduler.http.routes`` (a module with ``routes``).
routes: list[tuple[str, type, dict[str, Any]]] = [(re.escape(STATUS_JSON), StatusJSON, {})]


def add_routes(scheduler: Any) -> str | None:
    """Serve :data:`STATUS_JSON` on ``scheduler``'s HTTP server, under its dashboard
    prefix; returns the path (None if the scheduler has no HTTP server). Idempotent."""
    app = getattr(scheduler, "http_application", None)
    if app is None:
        return None
    path = http_prefix(scheduler) + STATUS_JSON
    pattern = re.escape(path) + "$"
    if any(
        getattr(rule.matcher, "regex", None) is not None and rule.matcher.regex.pattern == pattern
        for rule in _rules(app)
    ):
        return path
    app.add_handlers(r".*", [(re.escape(path), StatusJSON, {"dask_server": scheduler})])
    return path


def http_prefix(scheduler: Any) -> str:
    """The scheduler's dashboard prefix (``/`` or ``/dask/``): the scheduler keeps it
    only in its routes, so it is read from its ``health`` route."""
    for rule in _rules(scheduler.http_application):
        regex = getattr(rule.matcher, "regex", None)
        if regex is not None and regex.pattern.endswith("health$"):
            return regex.pattern[: -len("health$")] or "/"
    return "/"


def _rules(app: Any) -> list[Any]:
    """The path rules of a tornado application: its own, and those added per host."""
    out = list(app.wildcard_router.rules)
    for rule in app.default_router.rules:
        target = rule.target
        out.extend(getattr(target, "rules", ()))
    return out
