"""The dashboard page ``/amm-rules`` and the route ``/amm-rules/status.json``, on real
schedulers started with the ``amm_rules.preload`` preload.

The page is looked at as a person sees it, in a headless Chromium (the system's:
Debian's ``chromium`` package); without one, those tests skip, except in CI (``CI``
set), where they must run. The chart is drawn on a canvas, which a browser's text does
not show: its thresholds are checked on the page's Bokeh models instead. Schedulers
started from the command line (``dask scheduler``) check both ways of turning the page
on, and a scheduler that cannot import Bokeh.
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
from bokeh.document import Document
from click.testing import CliRunner
from distributed import Worker
from distributed.utils_test import gen_cluster, inc
from tornado.httpclient import AsyncHTTPClient

import amm_rules
from amm_rules import RulesPolicy
from amm_rules.cli import main
from amm_rules.observe.dashboard import RulesPage
from amm_rules.observe.routes import NO_POLICY
from amm_rules.observe.status import status_report
from benchmarks.support.waiting import wait_for
from tests.support.browser import Browser, find_chromium
from tests.support.cluster import CountingDict, amm_config, copies, policy_of, rules
from tests.support.env import in_ci

#: Run in the version matrix too (.ci/run): the floor and the newest dask/distributed.
pytestmark = pytest.mark.compat

#: A scheduler with its dashboard and the page, as ``--preload amm_rules.preload``.
PAGE = {"dashboard": True, "dashboard_address": "127.0.0.1:0", "preload": ["amm_rules.preload"]}
GPU = {"resources": {"GPU": 1}}
RULES = rules(
    {"name": "precious", "match": 'task.prefix == "precious"', "replicate": 2},
    {"name": "gpu-triple", "match": 'task.prefix == "gpu"', "replicate": 3, "pool": "gpu"},
    pools={"gpu": "worker.resources.GPU >= 1"},
)
PACKAGE_ROOT = Path(amm_rules.__file__).resolve().parent.parent

needs_chromium = pytest.mark.skipif(
    find_chromium() is None and not in_ci(),
    reason="no Chromium here (Debian: apt-get install chromium); with CI set it is required",
)


def url(s: Any, path: str) -> str:
    return f"http://127.0.0.1:{s.http_server.port}{path}"


def row(text: str, rule: str) -> list[str]:
    """The cells of a rule's row in the page's text (state, keys, bytes, copies held /
    wanted, met, unmet, why), or [] if the row is not shown."""
    lines = text.splitlines()
    if "why" not in lines:
        return []
    start = lines.index("why")
    if rule not in lines[start:]:
        return []
    i = lines.index(rule, start)
    return lines[i + 1 : i + 8]


def state(text: str, rule: str) -> str | None:
    cells = row(text, rule)
    return cells[0] if cells else None


def no_script_errors(browser: Browser) -> None:
    assert not browser.exceptions, browser.exceptions
    errors = [m for m in browser.console if re.search(r"error|failed", m, re.IGNORECASE)]
    assert not errors, errors


@needs_chromium
@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1, GPU), ("", 1)],
    scheduler_kwargs=PAGE,
    config=amm_config(RULES),
    timeout=120,
)
async def test_the_page_shows_every_rule_and_its_state_live(c, s, *workers):
    keys = ["precious-1", "precious-2", "gpu-1", "gpu-2"]
    futures = c.map(inc, range(len(keys)), key=keys)
    await c.gather(futures)
    await wait_for(
        lambda: copies(s, "precious-2") == 2 and copies(s, "gpu-2") == 2,
        "precious-2 and gpu-2 at 2 copies",
    )
    async with Browser() as browser:
        await browser.goto(url(s, "/amm-rules"))
        text = await browser.wait_for_text(
            lambda t: (
                row(t, "precious")[:2] == ["satisfied", "2"]
                and row(t, "gpu-triple")[:2] == ["unsatisfiable", "2"]
            )
        )
        assert row(text, "precious") == [
            "satisfied",
            "2",
            row(text, "precious")[2],
            "4 / 4",
            "2",
            "0",
            "all 2 keys hold their target and placement",
        ]
        assert row(text, "gpu-triple")[3:6] == ["4 / 6", "0", "2 (2 too-few-workers)"]
        assert row(text, "gpu-triple")[6] == (
            "2 keys of 2 cannot be satisfied now: wants 3 copies, only 2 workers in pool gpu"
        )
        assert state(text, "(annotation)") == state(text, "(runtime)") == "satisfied"
        assert "50.0% of 4 governed keys meet their target and placement" in text
        assert "No RulesPolicy attached" not in text

        # An annotation that cannot be used: in the events, newest first.
        with dask.annotate(amm={"replicate": "lots"}):
            bad = c.submit(inc, 1, key="annotated-1")
        await bad
        text = await browser.wait_for_text(lambda t: "invalid-annotation" in t)
        event = text.splitlines()[text.splitlines().index("invalid-annotation") + 1]
        assert event == (
            "replicate: expected a whole number of copies or 'all', got 'lots'"
            " (e.g. key annotated-1)"
        )

        # A third GPU worker: the page follows, without a reload.
        async with Worker(s.address, nthreads=1, resources={"GPU": 1}):
            text = await browser.wait_for_text(
                lambda t: state(t, "gpu-triple") == "satisfied" and "100.0%" in t, timeout=30
            )
            assert row(text, "gpu-triple")[3] == "6 / 6"
            assert "100.0% of 4 governed keys" in text
        no_script_errors(browser)

        # The same page among the individual plots, without the navigation bar.
        await browser.goto(url(s, "/individual-amm-rules"))
        text = await browser.wait_for_text(lambda t: state(t, "precious") == "satisfied")
        assert "Documentation" not in text  # the navigation bar's last link
        no_script_errors(browser)
    status_page = await AsyncHTTPClient().fetch(url(s, "/status"))
    assert b'href="individual-amm-rules"' in status_page.body


@needs_chromium
@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1)],
    scheduler_kwargs=PAGE,
    config=amm_config(
        rules(
            {"name": "fpga", "match": "task.annotations.resources.FPGA >= 1", "replicate": 2},
            {"name": "typo", "match": 'task.prefix == "incc"', "replicate": 2},
        )
    ),
    timeout=120,
)
async def test_the_why_of_a_rule_is_read_whole_on_a_page_1400_pixels_wide(c, s, a, b):
    """Idle rules' hints make long sentences: the rules table's rows grow to show them
    whole in the ``why`` column (they were cut at the width of the column)."""
    futures = c.map(inc, range(12), key=[f"inc-{i}" for i in range(12)], resources={"GPU": 1})
    await c.gather(futures)
    policy = policy_of(s)
    await wait_for(
        lambda: "(use task.resources.FPGA)" in str(status_report(policy)["conformance"]),
        "the fpga rule is idle, with its hint",
    )
    async with Browser(width=1400) as browser:
        await browser.goto(url(s, "/amm-rules"))
        text = await browser.wait_for_text(
            lambda t: "(use task.resources.FPGA)" in t and "(the rule says incc)" in t
        )
        assert state(text, "fpga") == state(text, "typo") == "idle"
        clipped = await browser.clipped()
        assert not [t for t in clipped if "in memory" in t], clipped
        no_script_errors(browser)


@needs_chromium
@gen_cluster(
    client=True,
    nthreads=[("", 1), ("", 1)],
    scheduler_kwargs=PAGE,
    config=amm_config(
        rules({"name": "precious", "match": 'task.prefix == "precious"', "replicate": 2})
    ),
    timeout=120,
)
async def test_the_page_says_when_a_worker_left_and_shows_an_event_whole(c, s, a, b):
    """Nothing governed yet: the header says so (not "100.0% of 0"); one governed key
    is one key, one copy in flight one copy. A worker holding a copy leaves: the header
    names it with what it left below target, and so does its event, which a click
    shows whole under the table."""
    async with Browser() as browser:
        await browser.goto(url(s, "/amm-rules"))
        text = await browser.wait_for_text(lambda t: "conformance" in t)
        assert "no governed key in memory" in text and "% of 0" not in text
        assert "0 keys waiting for classification" in text
        assert "copies in all: held / wanted" in text
        async with Worker(s.address, nthreads=1) as spot:
            x = c.submit(inc, 1, key="precious-1", workers=[spot.address])
            await x
            await wait_for(lambda: copies(s, "precious-1") == 2, "precious-1 at 2 copies")
            text = await browser.wait_for_text(lambda t: "the one governed key meets" in t)
        text = await browser.wait_for_text(lambda t: "workers left" in t and "worker-left" in t)
        lines = text.splitlines()
        left = lines[lines.index("workers left") + 1]
        assert re.fullmatch(
            re.escape(spot.address)
            + r" left (just now|[\d.]+ s ago): 1 key below target \(28 B\)",
            left,
        ), left
        detail = lines[lines.index("worker-left") + 1]
        assert detail == f"{spot.address} left: 1 key below target (28 B)"
        # The whole event under the table, every field on a line of its own.
        assert "click an event to see all of it" in text
        await browser.click_text("worker-left")
        text = await browser.wait_for_text(lambda t: "below_keys: ['precious-1']" in t)
        assert f"worker: {spot.address}" in text.splitlines()
        assert "retired: False" in text.splitlines() and "lost: 0" in text.splitlines()
        no_script_errors(browser)
    page = RulesPage(s)
    Document().add_root(page.root)
    page.update()
    labels = page.memory.labels.values()
    assert all(x.background_fill_color == "white" and x.level == "overlay" for x in labels)
    assert page.memory.root.x_range.group_padding < 1


@needs_chromium
@gen_cluster(client=True, scheduler_kwargs=PAGE, config=amm_config(start=False), timeout=120)
async def test_without_a_policy_the_page_says_so_until_one_attaches(c, s, a, b):
    async with Browser() as browser:
        await browser.goto(url(s, "/amm-rules"))
        text = await browser.wait_for_text(lambda t: "No RulesPolicy attached" in t)
        assert "distributed.scheduler.active-memory-manager.policies" in text
        late = rules({"name": "late", "match": 'task.prefix == "late"', "replicate": 2})
        s.extensions["amm"].add_policy(RulesPolicy(rules=late))
        text = await browser.wait_for_text(
            lambda t: state(t, "late") == "not-running" and "No RulesPolicy attached" not in t
        )
        # This AMM runs no cycle (start: false): said first, and no rule claims more.
        said = "not running\nthe Active Memory Manager runs no cycle since"
        assert said in text and text.index(said) < text.index("conformance")
        no_script_errors(browser)


@gen_cluster(
    client=True,
    nthreads=[("", 1)] * 2,
    scheduler_kwargs=PAGE,
    config=amm_config(rules({"name": "precious", "match": "true", "replicate": 2})),
)
async def test_status_json_is_what_amm_rules_status_prints(c, s, a, b):
    futures = c.map(inc, range(3), key=[f"precious-{i}" for i in range(3)])
    await c.gather(futures)
    policy = policy_of(s)
    await wait_for(lambda: status_report(policy)["conformance"]["met"] == 3, "3 keys met")
    s.extensions["amm"].stop()  # nothing changes between the two answers

    response = await AsyncHTTPClient().fetch(url(s, "/amm-rules/status.json"))
    assert response.headers["Content-Type"] == "application/json"
    served = json.loads(response.body)
    printed = await asyncio.to_thread(
        CliRunner().invoke,
        main,
        ["status", "--scheduler", s.address, "--format", "json"],
        catch_exceptions=False,
    )
    assert printed.exit_code == 0, printed.output
    from_cli = json.loads(printed.output)
    assert served.pop("time") <= from_cli.pop("time")
    assert served == from_cli
    assert served["states"]["precious"] == "not-running"  # (the AMM is stopped)
    (precious,) = [r for r in served["conformance"]["rules"] if r["name"] == "precious"]
    assert (precious["copies_held"], precious["copies_wanted"]) == (6, 6)


@gen_cluster(scheduler_kwargs={**PAGE, "http_prefix": "/dask"}, config=amm_config(start=False))
async def test_status_json_without_a_policy_and_under_a_prefix(s, a, b):
    response = await AsyncHTTPClient().fetch(
        url(s, "/dask/amm-rules/status.json"), raise_error=False
    )
    assert response.code == 404
    assert json.loads(response.body) == {"error": NO_POLICY}


def _routes_with_status_json() -> list[str]:
    import dask

    return [*dask.config.get("distributed.scheduler.http.routes"), "amm_rules.observe.routes"]


@gen_cluster(
    client=True,
    scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
    config={
        **amm_config(rules({"name": "any", "match": "true", "replicate": 1})),
        "distributed.scheduler.http.routes": _routes_with_status_json(),
    },
)
async def test_status_json_from_the_routes_config(c, s, a, b):
    """Without the preload, the route alone, from dask's list of HTTP route modules."""
    response = await AsyncHTTPClient().fetch(url(s, "/amm-rules/status.json"))
    assert json.loads(response.body)["rules"] == ["any"]


@gen_cluster(
    client=True,
    nthreads=[("", 1, GPU), ("", 1), ("", 1)],
    worker_kwargs={"memory_limit": 10 * 2**20},
    config={
        **amm_config(
            rules(
                {"name": "pinned", "match": 'task.prefix == "pinned"', "pool": "gpu"},
                pools={"gpu": "worker.resources.GPU >= 1"},
                rebalance={"measure": "managed", "sender-min": "10%", "gap": "10%"},
            )
        ),
        **{
            f"distributed.worker.memory.{n}": False
            for n in ("target", "spill", "pause", "terminate")
        },
    },
)
async def test_the_memory_chart_groups_workers_by_pool_with_the_thresholds(c, s, gpu, b, w):
    data = await c.scatter(
        {f"x-{i}": np.full(100_000 // 8, float(i)) for i in range(40)}, workers=[gpu.address]
    )
    policy = policy_of(s)
    # A cycle may run between two workers' arrivals: wait for one that saw all three.
    await wait_for(
        lambda: (
            policy.rebalancer.last_plan is not None
            and policy.rebalancer.last_plan.mean > 0  # not NaN: made with the data in memory
            and set(policy.placements.pools) == set(s.workers)
        ),
        "a rebalance plan made with the data and every worker's pools",
    )
    page = RulesPage(s)
    Document().add_root(page.root)
    s.tasks = CountingDict(s.tasks)
    CountingDict.walks = 0
    page.update()
    assert CountingDict.walks == 0  # the page reads the engine's counters, not the keys

    chart = page.memory
    name = {ws.address: str(ws.name) for ws in s.workers.values()}
    factors = list(chart.root.x_range.factors)
    assert factors[0] == ("gpu", name[gpu.address])
    assert sorted(factors[1:]) == sorted(("(no pool)", name[x.address]) for x in (b, w))
    report = status_report(policy)
    settings, plan = report["rebalance"], report["rebalance"]["last_plan"]
    assert chart.sender_min.visible and chart.sender_min.location == settings["sender_min"]
    assert chart.recipient_max.visible and chart.recipient_max.location == 0.6
    mean = chart.mean.location
    assert chart.mean.visible and mean == pytest.approx(plan["mean"], abs=0.05)
    assert (chart.band.bottom, chart.band.top) == pytest.approx((mean - 0.05, mean + 0.05))
    bars = chart.source.data
    assert bars["pools"] == ["gpu", "(no pool)", "(no pool)"]
    assert bars["address"][0] == gpu.address and bars["limit"] == [10 * 2**20] * 3
    at = report["workers"]["address"].index(gpu.address)
    assert bars["memory"][0] == report["workers"]["memory"][at] > 0
    assert bars["fraction"][0] == report["workers"]["fraction"][at] > 0.1
    assert "orange sends" in chart.root.title.text
    assert len(data) == 40


@gen_cluster(client=True, scheduler_kwargs=PAGE, config=amm_config())
async def test_without_rebalancing_no_threshold_is_drawn(c, s, a, b):
    page = RulesPage(s)
    Document().add_root(page.root)
    page.update()
    chart = page.memory
    models = (chart.sender_min, chart.recipient_max, chart.mean, chart.band)
    assert not any(m.visible for m in models)
    assert sorted(chart.source.data["address"]) == sorted(s.workers)
    assert set(chart.source.data["pools"]) == {"(no pool)"}


# ---------------------------------------------------------------------------------
# ``dask scheduler`` processes
# ---------------------------------------------------------------------------------


@contextmanager
def dask_scheduler(tmp_path: Path, *args: str, **env: str) -> Iterator[SchedulerProcess]:
    """``dask scheduler ARGS`` in its own process, its log read as it comes."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    paths = [*env.pop("PYTHONPATH", "").split(os.pathsep), str(PACKAGE_ROOT)]
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, environ.get("PYTHONPATH")]))
    environ.update(env)
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distributed.cli.dask_scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--dashboard-address",
            "127.0.0.1:0",
            *args,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=environ,
    )
    scheduler = SchedulerProcess(process)
    try:
        yield scheduler
    finally:
        scheduler.stop()


class SchedulerProcess:
    def __init__(self, process: subprocess.Popen[str]):
        self.process = process
        self.lines: list[str] = []
        #: Whether the whole log was read (the process closed its stderr).
        self.ended = False
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        """The first log line matching ``pattern`` (fails after ``timeout`` seconds)."""
        for line in self.lines:
            if m := re.search(pattern, line):
                return m
        while True:
            try:
                line = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"no {pattern!r} in the log:\n{''.join(self.lines)}"
                ) from None
            if line is None:
                self.ended = True
                raise AssertionError(f"the scheduler exited:\n{''.join(self.lines)}")
            self.lines.append(line)
            if m := re.search(pattern, line):
                return m

    def stop(self) -> str:
        """Stop the scheduler (it closes cleanly on SIGTERM); its whole log."""
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: the scheduler closes as on Ctrl-C
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        while not self.ended:
            try:
                line = self._queue.get(timeout=30)
            except queue.Empty:  # something else holds the pipe open: the log so far
                break
            if line is None:
                self.ended = True
            else:
                self.lines.append(line)
        return "".join(self.lines)

    def port(self) -> int:
        return int(self.wait_for(r"dashboard at:\s+http://[^:/]+:(\d+)/").group(1))


def get(port: int, path: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


INLINE_POLICY = '[{"class": "amm_rules.RulesPolicy", "rules": {"version": 1, "rules": [{"name": "kept", "match": "true", "replicate": 1}]}}]'


def test_dask_scheduler_with_the_preload_option(tmp_path):
    """``--preload amm_rules.dashboard``: the name of earlier releases, which existing
    configurations use, is the same preload as ``amm_rules.preload``."""
    with dask_scheduler(
        tmp_path,
        "--preload",
        "amm_rules.dashboard",
        DASK_DISTRIBUTED__SCHEDULER__ACTIVE_MEMORY_MANAGER__POLICIES=INLINE_POLICY,
        DASK_LOGGING__AMM_RULES="info",  # as docs/deploy.md shows
    ) as scheduler:
        port = scheduler.port()
        scheduler.wait_for(
            r"amm-rules: dashboard page at /amm-rules; status at /amm-rules/status.json"
        )
        status, body = get(port, "/amm-rules")
        assert status == 200 and b"bokeh" in body
        assert get(port, "/individual-amm-rules")[0] == 200
        status, body = get(port, "/amm-rules/status.json")
        assert status == 200 and json.loads(body)["states"]["kept"] == "satisfied"
        log = scheduler.stop()
    assert "Traceback" not in log


def test_dask_scheduler_without_bokeh_logs_one_line_and_serves_the_json(tmp_path):
    """Bokeh made unimportable for the whole process, as if it were not installed; the
    page turned on by dask's configuration (``distributed.scheduler.preload``)."""
    blocker = tmp_path / "no-bokeh"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n\nsys.modules['bokeh'] = None  # import bokeh raises ImportError\n"
    )
    with dask_scheduler(
        tmp_path,
        PYTHONPATH=str(blocker),
        DASK_DISTRIBUTED__SCHEDULER__PRELOAD='["amm_rules.preload"]',
        DASK_DISTRIBUTED__SCHEDULER__ACTIVE_MEMORY_MANAGER__POLICIES=INLINE_POLICY,
    ) as scheduler:
        port = scheduler.port()
        line = scheduler.wait_for(r"amm-rules: no dashboard page: Bokeh cannot be imported.*")
        assert "/amm-rules/status.json is served" in line.group(0)
        status, body = get(port, "/amm-rules/status.json")
        assert status == 200 and json.loads(body)["rules"] == ["kept"]
        assert get(port, "/amm-rules")[0] == 404
        status, body = get(port, "/status")  # dask's own page says what is missing
        assert b"Dask needs bokeh" in body
        log = scheduler.stop()
    assert "Traceback" not in log
    assert log.count("amm-rules: no dashboard page") == 1


def test_the_docs_show_the_page():
    """docs/dashboard.md shows a screenshot of the page (taken by
    ``python -m tests.support.screenshot docs/dashboard.png``)."""
    docs = PACKAGE_ROOT / "docs"
    images = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", (docs / "dashboard.md").read_text())
    assert images == ["dashboard.png"]
    png = (docs / "dashboard.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 1200 and height >= 800


def _stage_work(i: int) -> bytes:
    import time as _time

    _time.sleep(0.2)  # work: a task that computes for a while
    return bytes(1000 + i)


@gen_cluster(
    client=True,
    scheduler_kwargs=PAGE,
    # A budget too small for any key: each stays on one worker.
    config=amm_config({"version": 1, "protect": {"budget": "500 B", "min-recompute": "0.1s"}}),
    timeout=90,
)
async def test_the_work_at_risk_bars_follow_the_sole_copies(c, s, a, b):
    futures = c.map(_stage_work, range(3), key=[f"w-{i}" for i in range(3)], workers=[a.address])
    await c.gather(futures)
    policy = policy_of(s)
    costs = policy.ctx.costs
    await wait_for(lambda: costs.at_risk.get(a.address, 0) > 0.3, "a holding work at risk")
    page = RulesPage(s)
    Document().add_root(page.root)
    page.update()
    chart = page.at_risk
    bars = dict(zip(chart.source.data["address"], chart.source.data["seconds"], strict=True))
    assert bars[a.address] == pytest.approx(costs.at_risk[a.address], abs=1e-3)
    assert bars[b.address] == 0.0
    assert "protect keeps 0 keys" in chart.root.title.text
    assert policy.ctx.claims.of("protect") == {}
    # A second copy of every key: nothing is at risk any more.
    await c.replicate(futures, n=2)
    await wait_for(lambda: costs.at_risk.get(a.address, 0) < 1e-6, "nothing held alone")

    def drawn_zero() -> bool:
        page.update()  # the report is shared for half a second: drawn once it is new
        return set(chart.source.data["seconds"]) == {0.0}

    await wait_for(drawn_zero, "the bars at zero")
