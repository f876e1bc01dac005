"""Hostile and careless input that reaches the dashboard page and the status report:
events of any shape, from clients or from the engine, and reload errors that are past.
The page is read as a person reads it, in a headless Chromium
(:mod:`tests.support.browser`; without one these tests skip, except with ``CI`` set).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from distributed.utils_test import gen_cluster

from amm_rules.cli import main
from amm_rules.observe.dashboard import STATE_COLORS, event_detail, header_html
from amm_rules.observe.status import status_report
from benchmarks.support.waiting import wait_for
from tests.support.browser import Browser, find_chromium
from tests.support.cluster import amm_config, copies, events, keep
from tests.support.env import in_ci
from tests.support.rules_files import write_atomically
from tests.support.rulesets import INVALID_RELOAD, RELOADABLE

PAGE = {"dashboard": True, "dashboard_address": "127.0.0.1:0", "preload": ["amm_rules.dashboard"]}

needs_chromium = pytest.mark.skipif(
    find_chromium() is None and not in_ci(),
    reason="no Chromium here (Debian: apt-get install chromium); with CI set it is required",
)


def url(s: Any, path: str) -> str:
    return f"http://127.0.0.1:{s.http_server.port}{path}"


def rules_file(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RELOADABLE.format(n=n))
    return path


# ---------------------------------------------------------------------------------
# 7, 8, 9 on the page


async def attach(s: Any, path: Path) -> Any:
    """A RulesPolicy of the file ``path`` on the scheduler's own AMM, started."""
    from amm_rules.engine.policy import RulesPolicy

    policy = RulesPolicy(str(path))
    amm = s.extensions["amm"]
    amm.add_policy(policy)
    amm.start()
    return policy


@needs_chromium
@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 3,
    scheduler_kwargs=PAGE,
    config=amm_config(None, start=False),
    timeout=120,
)
async def test_the_page_keeps_updating_through_reloads_and_client_events(c, s, a, b, w, tmp_path):
    """A successful reload made the page stop ("TypeError: object of type 'int' has no
    len()"), and so did any client logging ``{"time": "x"}`` to the topic; a reload
    error stayed red after a later successful reload."""
    path = rules_file(tmp_path, 2)
    policy = await attach(s, path)
    futures = await c.scatter({"x-1": 1})
    await wait_for(lambda: copies(s, "x-1") == 2, "x-1 at 2 copies")
    async with Browser() as browser:
        await browser.goto(url(s, "/amm-rules"))
        await browser.wait_for_text(lambda t: "keep" in t and "satisfied" in t)

        # Clients log whatever they like to the topic: the page shows none of it.
        await c.log_event("amm-rules", {"time": "x"})
        await c.log_event("amm-rules", {"action": "reload", "rules": 7, "time": None})
        await c.log_event("amm-rules", "not even a mapping")
        # A reload error, then a successful reload (of an integer count of rules).
        write_atomically(path, INVALID_RELOAD)
        await wait_for(lambda: events(s, "reload-error"), "a reload-error event")
        text = await browser.wait_for_text(lambda t: "reload-error" in t)
        assert "since reloaded" not in text
        write_atomically(path, RELOADABLE.format(n=3))
        await wait_for(lambda: copies(s, "x-1") == 3, "x-1 at 3 copies after the reload")
        text = await browser.wait_for_text(lambda t: f"{path}: 1 rule" in t)
        assert "failed to update" not in text
        assert "since reloaded" in text
        lines = text.splitlines()
        shown = [
            lines[i + 1] for i, line in enumerate(lines) if line in ("reload", "reload-error")
        ]
        assert shown[0] == f"{path}: 1 rule"  # newest first; the client's "reload" not shown
        assert len(shown) == 2, shown
        assert not browser.exceptions, browser.exceptions
    report = status_report(policy)
    assert report["last_reload_error"]["since_reloaded"] is True
    # Past: no longer in red on the page, and said so by ``amm-rules status``.
    assert STATE_COLORS["unsatisfiable"] not in header_html(report)
    printed = await asyncio.to_thread(
        CliRunner().invoke, main, ["status", "--scheduler", s.address], catch_exceptions=False
    )
    (line,) = [x for x in printed.output.splitlines() if "last reload error" in x]
    assert ", since reloaded: " in line, line
    keep(futures)


@pytest.mark.parametrize(
    "event, detail",
    [
        (
            {"action": "reload", "source": "r.yaml", "rules": 12, "pools": 2},
            "r.yaml: 12 rules, 2 pools",
        ),
        ({"action": "reload", "source": "r.yaml", "rules": ["a", "b"]}, "r.yaml: 2 rules"),
        ({"action": "reload", "rules": None}, ": None rules"),
        ({"action": "x", "error": ["not", "text"]}, "['not', 'text']"),
        ({"action": "x", "error": "e" * 1_000}, "e" * 297 + "..."),
        ({"action": "x", "n": {"a": 1}}, "n={'a': 1}"),
        ({}, ""),
    ],
)
def test_an_event_of_any_shape_has_a_detail(event: dict[str, Any], detail: str) -> None:
    assert event_detail(event) == detail
