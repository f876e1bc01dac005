"""The amm-rules page of the scheduler's dashboard (``/amm-rules``, and
``/individual-amm-rules`` among the individual plots), drawn with the dashboard's own
stack: Bokeh, its page template and its theme.

Once a second the page draws :func:`~amm_rules.observe.status.status_report` of the
scheduler's :class:`~amm_rules.engine.policy.RulesPolicy`: the same figures as
``amm-rules status`` and ``/amm-rules/status.json``, computed once and shared by every
open page (and every request to status.json) for
:data:`~amm_rules.observe.status.SHARED_FOR` seconds. Its parts are those
:class:`RulesPage` lists, each saying what it shows (as docs/dashboard.md does).

Importing this module imports Bokeh; :func:`register` adds the pages to
``distributed.dashboard.scheduler.applications``, which the scheduler reads when it
builds its dashboard (so before that: the ``amm_rules.preload`` preload does it when
imported). Neighbours: :mod:`amm_rules.observe.status` makes the report;
:mod:`amm_rules.observe.extension` finds the policy of a scheduler.
"""

from __future__ import annotations

import html
import logging
import math
import time
from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any

from bokeh.core.properties import without_property_validation
from bokeh.layouts import column, row
from bokeh.models import (
    BoxAnnotation,
    ColumnDataSource,
    CustomJS,
    DataTable,
    Div,
    FactorRange,
    HoverTool,
    HTMLTemplateFormatter,
    Label,
    NumberFormatter,
    NumeralTickFormatter,
    Range1d,
    Span,
    TableColumn,
)
from bokeh.plotting import figure
from distributed.dashboard.components import DashboardComponent, add_periodic_callback
from distributed.dashboard.components.scheduler import BOKEH_THEME, env

from amm_rules.engine.drain_request import DrainReport
from amm_rules.engine.words import counted, duration, local_time, signed_size, size
from amm_rules.observe import status
from amm_rules.observe.conformance import (
    IDLE,
    IN_PROGRESS,
    NOT_RUNNING,
    SATISFIED,
    SHADOWED,
    UNSATISFIABLE,
)
from amm_rules.observe.extension import engine_of
from amm_rules.observe.status import NO_POOL
from amm_rules.observe.text import (
    conformance_line,
    cycle_timing,
    latest_departures,
    not_running_line,
    pressure_state,
)

logger = logging.getLogger(__name__)

#: The page, and its entry among the dashboard's individual plots.
URL = "/amm-rules"
INDIVIDUAL_URL = "/individual-amm-rules"
TITLE = "Dask: AMM rules"
#: Milliseconds between two updates of an open page.
INTERVAL_MS = 1000
#: Events shown, newest first; points of the in-flight chart (ten minutes).
EVENTS_SHOWN = 10
HISTORY = 600
#: Above this many workers, the chart names pools but not workers.
NAMED_WORKERS = 40

#: A cell whose text may be longer than its column: all of it shows on hover.
LONG_TEXT = '<span title="<%- value %>"><%- value %></span>'
#: A cell whose text wraps onto as many lines as its row has (see :func:`wrapped_rows`).
WRAPPED_TEXT = (
    '<div style="white-space: normal; line-height: {line}px; padding-top: 4px" '
    'title="<%- value %>"><%- value %></div>'
)
#: A line of wrapped text, in pixels, and the characters a line of the rules table's
#: ``why`` column holds at the least (560 px of text at up to 8 px a character).
LINE_PX = 16
#: A row of a table with one line of text (BokehJS's own row height; and a border).
DEFAULT_ROW = 25
WHY_WIDTH, WHY_CHARS = 560, 66
#: Rows of the rules table grow to this many lines of ``why`` at most (about 1,300
#: characters; all of a longer sentence shows on hover).
WHY_LINES = 20
STATE_COLORS = {
    SATISFIED: "#2e7d32",
    IN_PROGRESS: "#e65100",
    UNSATISFIABLE: "#c62828",
    IDLE: "#6a1b9a",
    SHADOWED: "#5d4037",
    NOT_RUNNING: "#616161",
}
ROLE_COLORS = {"sender": "#e65100", "recipient": "#2e7d32"}
BAR_COLOR, PAUSED_COLOR = "#1f77b4", "#9e9e9e"
NO_POLICY = (
    "No RulesPolicy attached to this scheduler's Active Memory Manager: list "
    "<code>amm_rules.RulesPolicy</code> in "
    "<code>distributed.scheduler.active-memory-manager.policies</code> (see amm-rules' "
    "docs/deploy.md). This page shows its rules as soon as one attaches."
)


# ---------------------------------------------------------------------------------
# The parts
# ---------------------------------------------------------------------------------


class Header(DashboardComponent):
    """The rules in force and the engine's work, in a few lines of text."""

    def __init__(self) -> None:
        self.root = Div(text="", sizing_mode="stretch_width")

    def update(self, report: Mapping[str, Any] | None, error: str | None = None) -> None:
        if error is not None:
            color = STATE_COLORS[UNSATISFIABLE]
            text = f'{TITLE_HTML}<p style="color: {color}">{html.escape(error)}</p>'
        else:
            text = header_html(report)
        _set(self.root, text=text)


TITLE_HTML = "<h2>Active Memory Manager rules</h2>"


def header_html(report: Mapping[str, Any] | None) -> str:
    """The header's HTML (every figure from the report; text from it is escaped)."""
    if report is None:
        return f"{TITLE_HTML}<p><b>{NO_POLICY}</b></p>"
    e = html.escape
    c = report["conformance"]
    digest = report.get("sha256") or "unknown"
    last = report.get("last_reload_error")
    if not last:
        reload_error = "none"
    elif last.get("since_reloaded"):  # past: the rules were reloaded since
        reload_error = (
            f"at {_clock(last['time'])}, since reloaded: "
            f'<span title="{e(str(last["error"]))}">{e(_first_line(last["error"]))}</span>'
        )
    else:
        reload_error = _red(f"at {_clock(last['time'])}: {e(_first_line(last['error']))}")
    r = report["rebalance"]
    rebalance = (
        f"on ({e(str(r['measure']))}): {counted(r['in_flight'], 'move')} in flight "
        f"({size(r['in_flight_bytes'])})"
        if r.get("enabled")
        else "off"
    )
    stopped = not_running_line(report)
    lines = [_red(f"<b>not running</b> {e(stopped)}")] if stopped else []
    lines += [
        f"<b>rules</b> <code>{e(str(report['source']))}</code> &middot; sha256 "
        f"<code>{e(digest[:12])}</code> &middot; loaded {local_time(report['loaded_at'])}"
        f" &middot; last reload error: {reload_error}",
        f"<b>conformance</b> {e(conformance_line(c))}",
        f"<b>in flight</b> {counted(report['in_flight'], 'copy')} of "
        f"{counted(report['in_flight_keys'], 'key')} &middot; <b>rebalance</b> {rebalance}",
        f"<b>cycles</b> {report['cycles']:,}; {cycle_timing(report['cycle_ms'])} &middot; "
        f"<b>backlog</b> {counted(report['classification_backlog'], 'key')} waiting for "
        "classification",
    ]
    # Features off for want of an internal of this dask or distributed.
    lines += [_red(f"<b>unsupported</b> {e(said)}") for said in report.get("unsupported") or ()]
    departures = latest_departures(report)
    if departures:  # in red those whose keys lost their last copy
        left = [_red(e(said)) if d.get("lost") else e(said) for d, said in departures]
        lines.append("<b>workers left</b> " + " &middot; ".join(left))
    return TITLE_HTML + "".join(f"<div>{line}</div>" for line in lines)


def _red(text: str) -> str:
    """HTML in the colour of what needs a look (an unsatisfiable rule's)."""
    return f'<span style="color: {STATE_COLORS[UNSATISFIABLE]}">{text}</span>'


class RulesTable(DashboardComponent):
    """One row per rule, then ``(annotation)`` and ``(runtime)``."""

    COLUMNS = ("rule", "state", "color", "keys", "bytes", "copies", "met", "unmet", "why")

    def __init__(self) -> None:
        self.source = ColumnDataSource({name: [] for name in self.COLUMNS})
        state = HTMLTemplateFormatter(template='<b style="color: <%= color %>"><%- value %></b>')
        count = NumberFormatter(format="0,0")
        columns = [
            TableColumn(field="rule", title="rule", width=150),
            TableColumn(field="state", title="state", formatter=state, width=100),
            TableColumn(field="keys", title="keys", formatter=count, width=70),
            TableColumn(field="bytes", title="bytes", width=90),
            TableColumn(field="copies", title="copies in all: held / wanted", width=170),
            TableColumn(field="met", title="met", formatter=count, width=70),
            TableColumn(field="unmet", title="unmet (reason)", width=170),
            TableColumn(
                field="why",
                title="why",
                formatter=HTMLTemplateFormatter(template=WRAPPED_TEXT.format(line=LINE_PX)),
                width=WHY_WIDTH,
            ),
        ]
        self.root = _table(self.source, columns, 3)

    def update(self, report: Mapping[str, Any] | None) -> None:
        rows = report["conformance"]["rules"] if report is not None else []
        data: dict[str, list[Any]] = {name: [] for name in self.COLUMNS}
        for r in rows:
            data["rule"].append(r["name"] + ("" if r["in_file"] else " (removed)"))
            data["state"].append(r["state"])
            data["color"].append(STATE_COLORS.get(r["state"], "inherit"))
            data["keys"].append(r["keys"])
            data["bytes"].append(size(r["bytes"]))
            data["copies"].append(f"{r['copies_held']:,} / {r['copies_wanted']:,}")
            data["met"].append(r["met"])
            data["unmet"].append(_unmet(r))
            data["why"].append(r["sentence"])
        _refill(self.root, data)
        row_height = wrapped_rows(data["why"])
        _set(self.root, row_height=row_height, height=_table_height(len(rows), row_height))


def wrapped_rows(texts: list[str]) -> int:
    """The rules table's row height in pixels: one line of text, or as many as the
    longest ``why`` takes wrapped (the hints of an idle rule are a sentence each), so
    that it is read whole at any width of the page (rows of a table are all as tall)."""
    longest = max((len(t) for t in texts), default=0)
    lines = min(WHY_LINES, max(1, -(-longest // WHY_CHARS)))
    return DEFAULT_ROW if lines == 1 else 8 + LINE_PX * lines


def _unmet(r: Mapping[str, Any]) -> str:
    if not r["unmet"]:
        return "0"
    reasons = ", ".join(f"{n:,} {reason}" for reason, n in r["unmet_by_reason"].items() if n)
    return f"{r['unmet']:,} ({reasons})"


class WorkerMemory(DashboardComponent):
    """Each worker's memory as a fraction of its limit, grouped by pool (a worker in
    two pools shows in both), coloured by its role in the last rebalancing plan, with
    ``sender-min``, ``recipient-max``, the cluster mean and the ``gap`` band around it
    when rebalancing is on."""

    COLUMNS = (
        "x",
        "fraction",
        "color",
        "worker",
        "address",
        "pools",
        "memory",
        "limit",
        "role",
        "status",
    )

    def __init__(self) -> None:
        self.source = ColumnDataSource({name: [] for name in self.COLUMNS})
        self.root = figure(
            title="Memory per worker, by pool",
            # A narrow gap between pools (the default is wider than a bar and a half).
            x_range=FactorRange(group_padding=0.4, range_padding=0.02),
            y_range=Range1d(0, 1),
            height=320,
            sizing_mode="stretch_width",
            tools="",
            toolbar_location=None,
        )
        self.root.vbar(x="x", top="fraction", width=0.8, color="color", source=self.source)
        self.root.yaxis.formatter = NumeralTickFormatter(format="0%")
        self.root.yaxis.axis_label = "memory / limit"
        self.root.xaxis.major_label_orientation = math.pi / 2
        self.root.xgrid.visible = False
        self.root.add_tools(
            HoverTool(
                tooltips=[
                    ("worker", "@worker (@address)"),
                    ("pools", "@pools"),
                    ("memory", "@memory{0.00 b} of @limit{0.00 b} (@fraction{0.0%})"),
                    ("role", "@role"),
                    ("status", "@status"),
                ]
            )
        )
        self.band = BoxAnnotation(
            bottom=0, top=0, fill_alpha=0.08, fill_color="#555555", visible=False
        )
        self.mean = Span(location=0, dimension="width", line_color="#555555", visible=False)
        self.sender_min, self.recipient_max = (
            Span(
                location=0, dimension="width", line_dash="dashed", visible=False, line_color=color
            )
            for color in (ROLE_COLORS["sender"], ROLE_COLORS["recipient"])
        )
        # Above the bars, on a background of their own, so that a bar never hides one
        # and no bar shows through one; the mean's stands apart, as the mean is often
        # close to a threshold.
        self.labels = {
            name: Label(
                x=x,
                x_units="screen",
                y=0,
                y_offset=2,
                text="",
                visible=False,
                text_font_size="11px",
                text_color=color,
                background_fill_color="white",
                background_fill_alpha=0.9,
                border_line_color=color,
                border_line_alpha=0.6,
                padding=2,
                level="overlay",
            )
            for name, color, x in (
                ("sender_min", ROLE_COLORS["sender"], 4),
                ("mean", "#555555", 120),
                ("recipient_max", ROLE_COLORS["recipient"], 4),
            )
        }
        #: The report's worker columns the bars show.
        self._drawn: Mapping[str, Any] | None = None
        for model in (
            self.band,
            self.mean,
            self.sender_min,
            self.recipient_max,
            *self.labels.values(),
        ):
            self.root.add_layout(model)

    def update(self, report: Mapping[str, Any] | None) -> None:
        workers = report["workers"] if report is not None else None
        # The report reads the AMM's measure of its last cycle: between two cycles the
        # columns do not change, and comparing them costs less than rebuilding the bars.
        if workers is None or workers != self._drawn:
            self._bars(report)
            self._drawn = workers
        measure = report.get("memory_measure") if report else None
        title = f"Memory per worker, by pool ({measure or 'no measure'})"
        if report and report["rebalance"].get("enabled"):
            title += ": orange sends, green receives (last rebalancing plan)"
        _set(self.root.title, text=title)
        self._thresholds(report["rebalance"] if report else None)

    def _bars(self, report: Mapping[str, Any] | None) -> None:
        data, factors = worker_bars(report)
        _show_factors(self.root, factors)
        _replace(self.source, data)
        _set(self.root.y_range, end=max([1.0, *data["fraction"]]) * 1.05)

    def _thresholds(self, r: Mapping[str, Any] | None) -> None:
        on = r if r and r.get("enabled") else None  # the settings while rebalancing is on
        plan = (on or {}).get("last_plan") or {}
        mean = plan.get("mean")
        for name, span, value in (
            ("sender_min", self.sender_min, on["sender_min"] if on else None),
            ("recipient_max", self.recipient_max, on["recipient_max"] if on else None),
            ("mean", self.mean, mean),
        ):
            visible = isinstance(value, (int, float))
            _set(span, visible=visible, location=value if visible else 0)
            _set(
                self.labels[name],
                visible=visible,
                y=value if visible else 0,
                text=f"{name.replace('_', '-')} {value:.0%}" if visible else "",
            )
        half = on["gap"] / 2 if on else 0
        # Hidden models keep numbers: BokehJS refuses a null coordinate.
        _set(
            self.band,
            visible=isinstance(mean, (int, float)),
            bottom=(mean - half) if isinstance(mean, (int, float)) else 0,
            top=(mean + half) if isinstance(mean, (int, float)) else 0,
        )


def worker_bars(report: Mapping[str, Any] | None) -> tuple[dict[str, list[Any]], list[Any]]:
    """The chart's columns and its ``(pool, worker)`` factors, pools in name order
    (workers in no pool last). Column by column: at a thousand workers, per-bar Python
    code is most of what an update costs; sizes are formatted by the browser."""
    if report is None:
        return {name: [] for name in WorkerMemory.COLUMNS}, []
    w = report["workers"]
    by_pool: dict[str, list[int]] = {}
    for i, pools in enumerate(w["pools"]):
        for pool in pools or (NO_POOL,):
            by_pool.setdefault(pool, []).append(i)
    order = sorted(by_pool, key=lambda p: (p == NO_POOL, p))
    bars = [i for pool in order for i in by_pool[pool]]
    groups = [pool for pool in order for _ in by_pool[pool]]
    # A worker's name for the axis: without the protocol when it is its address.
    names = [str(name).split("://", 1)[-1] for name in w["name"]]
    colors = [
        PAUSED_COLOR if status != "running" else ROLE_COLORS.get(role, BAR_COLOR)
        for status, role in zip(w["status"], w["role"], strict=True)
    ]
    # Workers of one membership share its list of pools (the report names each once).
    joined: dict[int, str] = {}
    pools_text = [
        joined.get(id(p)) or joined.setdefault(id(p), ", ".join(p) or NO_POOL) for p in w["pools"]
    ]
    columns = {
        "fraction": [f or 0.0 for f in w["fraction"]],
        "color": colors,
        "worker": names,
        "address": w["address"],
        "pools": pools_text,
        "memory": w["memory"],
        "limit": w["memory_limit"],
        "role": [role or "-" for role in w["role"]],
        "status": w["status"],
    }
    pick = itemgetter(*bars) if len(bars) > 1 else lambda column: tuple(column[i] for i in bars)
    factors = list(zip(groups, pick(names), strict=True))
    data = {"x": factors, **{k: list(pick(column)) for k, column in columns.items()}}
    return data, list(factors)


class WorkAtRisk(DashboardComponent):
    """Seconds of recompute each worker's death would cost now, a bar per worker grouped
    by pool (the order of :func:`worker_bars`); the title says what ``protect`` keeps."""

    def __init__(self) -> None:
        self.source = ColumnDataSource({"x": [], "seconds": [], "worker": [], "address": []})
        self.root = figure(
            title="Work at risk per worker, by pool",
            x_range=FactorRange(),
            height=260,
            sizing_mode="stretch_width",
            tools="",
            toolbar_location=None,
        )
        self.root.vbar(x="x", top="seconds", width=0.8, color=BAR_COLOR, source=self.source)
        self.root.yaxis.axis_label = "seconds of recompute"
        self.root.y_range.start = 0
        self.root.xaxis.major_label_orientation = math.pi / 2
        self.root.xgrid.visible = False
        self.root.add_tools(
            HoverTool(
                tooltips=[("worker", "@worker (@address)"), ("at risk", "@seconds{0,0.0} s")]
            )
        )
        self._drawn: Any = None

    def update(self, report: Mapping[str, Any] | None) -> None:
        workers = report["workers"] if report is not None else None
        if workers != self._drawn:
            self._drawn = workers
            data, factors = worker_bars(report)
            at_risk = (
                dict(zip(workers["address"], workers["at_risk"], strict=True)) if workers else {}
            )
            columns = {
                "x": data["x"],
                "seconds": [at_risk.get(a, 0.0) for a in data["address"]],
                "worker": data["worker"],
                "address": data["address"],
            }
            _show_factors(self.root, factors)
            _replace(self.source, columns)
        recompute = (report or {}).get("recompute") or {}
        protect = (report or {}).get("protect")
        title = (
            f"Work at risk per worker, by pool: {duration(recompute.get('total_seconds'))} "
            "of recompute held by a single worker"
        )
        if protect:
            title += (
                f"; protect keeps {counted(protect['keys'], 'key')} "
                f"({duration(protect['seconds_protected'])}) in "
                f"{size(protect['held_bytes'])} of {size(protect['budget_bytes'])}"
            )
        _set(self.root.title, text=title)


class InFlight(DashboardComponent):
    """Copies and rebalancing moves in flight, over the last :data:`HISTORY` updates."""

    def __init__(self) -> None:
        self.source = ColumnDataSource({"time": [], "copies": [], "moves": []})
        self.root = figure(
            title="In flight",
            x_axis_type="datetime",
            height=240,
            sizing_mode="stretch_width",
            tools="",
            toolbar_location=None,
        )
        for y, color, legend in (
            ("copies", BAR_COLOR, "copies"),
            ("moves", ROLE_COLORS["sender"], "rebalancing moves"),
        ):
            self.root.line(
                x="time", y=y, source=self.source, line_width=2, color=color, legend_label=legend
            )
        self.root.legend.location = "top_left"
        self.root.y_range.start = 0

    def update(self, report: Mapping[str, Any] | None) -> None:
        if report is None:
            return
        point = {
            "time": [report["time"] * 1000],
            "copies": [report["in_flight"]],
            "moves": [report["rebalance"].get("in_flight", 0)],
        }
        self.source.stream(point, rollover=HISTORY)


class MemoryFlowTable(DashboardComponent):
    """The task prefixes adding the most memory per task and freeing the most by
    finishing (the report's ``memory_flow``), under a line on ``memory-pressure``."""

    COLUMNS = ("role", "prefix", "tasks", "produced", "freed_by", "net", "live")

    def __init__(self) -> None:
        self.source = ColumnDataSource({name: [] for name in self.COLUMNS})
        count = NumberFormatter(format="0,0")
        columns = [
            TableColumn(field="role", title="memory flow", width=90),
            TableColumn(field="prefix", title="task prefix", width=200),
            TableColumn(field="tasks", title="tasks", formatter=count, width=70),
            TableColumn(field="produced", title="produced", width=90),
            TableColumn(field="freed_by", title="freed by finishing", width=120),
            TableColumn(field="net", title="net per task", width=100),
            TableColumn(field="live", title="in memory", width=90),
        ]
        self.pressure = Div(text="", sizing_mode="stretch_width")
        self.table = _table(self.source, columns, 2)
        self.root = column(self.pressure, self.table, sizing_mode="stretch_width")

    def update(self, report: Mapping[str, Any] | None) -> None:
        flow = (report or {}).get("memory_flow") or {}
        data: dict[str, list[Any]] = {name: [] for name in self.COLUMNS}
        for role, rows in (("producer", "top_producers"), ("freer", "top_freers")):
            for r in flow.get(rows) or ():
                data["role"].append(role)
                data["prefix"].append(r["prefix"])
                data["tasks"].append(r["tasks"])
                data["produced"].append(size(r["produced"]))
                data["freed_by"].append(size(r["freed_by"]))
                data["net"].append(signed_size(r["net_per_task"]))
                data["live"].append(size(r["live"]))
        _refill(self.table, data)
        _set(self.table, height=_table_height(len(data["role"])))
        pressure = "" if report is None else pressure_html(report.get("memory_pressure"))
        _set(self.pressure, text=pressure)


#: A table's columns as (field, title, width), and what makes its rows from a report.
Fields = tuple[tuple[str, str, int], ...]
Rows = Callable[[Mapping[str, Any] | None], dict[str, list[Any]]]


class _RowsTable(DashboardComponent):
    """A table hidden while it has no rows, made by ``rows`` from a status report."""

    def __init__(self, fields: Fields, rows: Rows) -> None:
        self.rows = rows
        self.source = ColumnDataSource({name: [] for name, _, _ in fields})
        columns = [TableColumn(field=f, title=t, width=w) for f, t, w in fields]
        self.table = _table(self.source, columns, 0, visible=False)
        self.root = self.table

    def update(self, report: Mapping[str, Any] | None) -> None:
        data = self.rows(report)
        _refill(self.table, data)
        rows = len(next(iter(data.values())))
        _set(self.table, visible=bool(rows), height=_table_height(rows))


DRAIN_FIELDS: Fields = (
    ("worker", "draining worker", 200),
    ("state", "state", 80),
    ("moved", "moved", 130),
    ("left", "left", 130),
    ("loss", "predicted loss (or outcome)", 420),
    ("time_left", "time left", 80),
)


def drain_rows(report: Mapping[str, Any] | None) -> dict[str, list[Any]]:
    """The rows of the drains table (plain data, tested without Bokeh): drains in
    progress (and those that ended recently), per worker what moved, what is left, the
    predicted loss and the time left (the report's ``drain``)."""
    data: dict[str, list[Any]] = {name: [] for name, _, _ in DRAIN_FIELDS}
    drains = ((report or {}).get("drain") or {}).get("drains", ())
    for d in map(DrainReport.from_dict, drains):
        data["worker"].append(f"{d.worker} ({d.name})")
        data["state"].append(d.state)
        data["moved"].append(f"{counted(d.moved_keys, 'key')}, {size(d.moved_bytes)}")
        data["left"].append(f"{counted(d.keys_left, 'key')}, {size(d.bytes_left)}")
        data["loss"].append(d.detail())
        left = d.seconds_left
        data["time_left"].append(duration(left) if d.outcome is None and left > 0 else "-")
    return data


SPILL_FIELDS: Fields = (
    ("worker", "worker (spill)", 200),
    ("on_disk", "on disk", 150),
    ("written", "written", 100),
    ("read", "read back", 100),
    ("saved", "saved (est.)", 150),
    ("drops", "copies dropped, not written", 170),
    ("prefetches", "read back ahead", 110),
    ("near", "way to disk", 90),
)


def spill_rows(report: Mapping[str, Any] | None) -> dict[str, list[Any]]:
    """The rows of the spill table (plain data, tested without Bokeh), shown while the
    rules have a ``spill:`` section: what each worker holds on disk and what its order
    by value did (the report's ``spill``); a worker left alone says why in its ``on
    disk`` cell."""
    data: dict[str, list[Any]] = {name: [] for name, _, _ in SPILL_FIELDS}
    spill = (report or {}).get("spill") or {}
    for address, w in (spill.get("workers") or {}).items():
        data["worker"].append(address)
        data["on_disk"].append(f"{counted(w['keys_on_disk'], 'key')}, {size(w['bytes_on_disk'])}")
        data["written"].append(size(w["written_bytes"]))
        data["read"].append(size(w["read_bytes"]))
        data["saved"].append(
            f"{size(w['saved_read_bytes'])} (LRU ~{size(w['lru_read_bytes'])})"
            if "lru_read_bytes" in w
            else "-"
        )
        data["drops"].append(f"{w['drops']:,} ({size(w['drop_bytes'])})")
        data["prefetches"].append(f"{w['prefetches']:,}")
        data["near"].append(f"{w['near_spill']:.0%}")
    for address, why in (spill.get("left_alone") or {}).items():
        data["worker"].append(address)
        data["on_disk"].append(f"left alone: {why}")
        for name, _, _ in SPILL_FIELDS[2:]:
            data[name].append("-")
    return data


def pressure_html(pressure: Mapping[str, Any] | None) -> str:
    """One line on the ``memory-pressure`` section: its state and its latest reasons."""
    if not pressure:
        return "<div><b>memory pressure</b> no memory-pressure section</div>"
    e = html.escape
    totals = pressure.get("totals") or {}
    state = pressure_state(pressure)
    reasons = "; ".join(str(r) for r in pressure.get("reasons") or ())
    return (
        f"<div><b>memory pressure</b> {e(state)} &middot; {totals.get('holds', 0):,.0f} holds, "
        f"{totals.get('held_seconds', 0):,.0f}s held &middot; {e(reasons)}</div>"
    )


class EventsTable(DashboardComponent):
    """The latest events of the topic ``amm-rules``, newest first. A detail longer than
    its column shows whole on hover, and under the table when its row is clicked."""

    COLUMNS = ("time", "action", "detail", "full")
    #: Under the table until a row is clicked.
    HINT = "<i>click an event to see all of it</i>"

    def __init__(self) -> None:
        self.source = ColumnDataSource({name: [] for name in self.COLUMNS})
        columns = [
            TableColumn(field="time", title="time", width=70),
            TableColumn(field="action", title="event", width=130),
            TableColumn(
                field="detail",
                title="detail",
                formatter=HTMLTemplateFormatter(template=LONG_TEXT),
                width=440,
            ),
        ]
        self.table = _table(self.source, columns, EVENTS_SHOWN)
        self.full = Div(text=self.HINT, sizing_mode="stretch_width")
        # In the browser: the clicked row's whole event, escaped (HTML of the server's).
        self.source.selected.js_on_change(
            "indices",
            CustomJS(
                args={"source": self.source, "full": self.full, "hint": self.HINT},
                code="""
                const i = source.selected.indices[0];
                const rows = source.data.full;
                full.text = (i === undefined || i >= rows.length) ? hint : rows[i];
                """,
            ),
        )
        self.root = column(self.table, self.full, sizing_mode="stretch_width")

    def update(self, report: Mapping[str, Any] | None) -> None:
        events = list(reversed(report["events"]))[:EVENTS_SHOWN] if report else []
        data: dict[str, list[Any]] = {name: [] for name in self.COLUMNS}
        for event in events:
            data["time"].append(_clock(event["time"]))
            data["action"].append(str(event.get("action")))
            data["detail"].append(event_detail(event))
            data["full"].append(event_full_html(event))
        _refill(self.table, data)


def event_full_html(event: Mapping[str, Any]) -> str:
    """An event whole, for the line under the table: every field, on lines of their
    own (an error's diagnostics keep their lines), escaped."""
    e = html.escape
    parts = [f"<b>{e(_clock(event.get('time')))} {e(str(event.get('action')))}</b>"]
    parts += [e(f"{k}: {v}") for k, v in event.items() if k not in ("time", "action")]
    return f'<div style="white-space: pre-wrap">{"<br>".join(parts)}</div>'


#: Longest detail of an event in the table (the whole of it shows on hover).
DETAIL_SHOWN = 300


def event_detail(event: Mapping[str, Any]) -> str:
    """One line saying what an event is about, whatever its fields hold."""
    if "error" in event:
        where = f"rule {event['rule']}: " if event.get("rule") else ""
        key = f" (e.g. key {event['example_key']})" if event.get("example_key") else ""
        text = f"{where}{_first_line(event['error'])}{key}"
    elif event.get("action") == "worker-left":
        from amm_rules.engine.sections.departures import departure_sentence

        text = departure_sentence(event)
    elif event.get("action") == "reload":
        # The engine's reload event counts rules and pools: ``rules=12, pools=2``.
        rules, pools = event.get("rules"), event.get("pools")
        counts = [_count(rules, "rule")] + ([_count(pools, "pool")] if pools else [])
        text = f"{event.get('source', '')}: {', '.join(counts)}"
    else:
        fields = {k: v for k, v in event.items() if k not in ("time", "action")}
        text = ", ".join(f"{k}={v}" for k, v in fields.items())
    return text if len(text) <= DETAIL_SHOWN else text[: DETAIL_SHOWN - 3] + "..."


def _count(value: Any, noun: str) -> str:
    """A count as an event gives it (a number, or a list of names), with its noun."""
    if isinstance(value, (list, tuple)):
        return counted(len(value), noun)
    if isinstance(value, int) and not isinstance(value, bool):
        return counted(value, noun)
    return f"{value} {noun}s"


# ---------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------


class RulesPage(DashboardComponent):
    """The whole page: one report per update, drawn by each part."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        self.header = Header()
        self.rules = RulesTable()
        self.memory = WorkerMemory()
        self.at_risk = WorkAtRisk()
        self.in_flight = InFlight()
        self.events = EventsTable()
        self.flow = MemoryFlowTable()
        self.drains = _RowsTable(DRAIN_FIELDS, drain_rows)
        self.spill = _RowsTable(SPILL_FIELDS, spill_rows)
        #: In the order they are updated.
        self.parts = (
            self.header,
            self.drains,
            self.rules,
            self.memory,
            self.spill,
            self.at_risk,
            self.in_flight,
            self.events,
            self.flow,
        )
        self.root = column(
            self.header.root,
            self.drains.root,
            self.rules.root,
            self.memory.root,
            self.spill.root,
            self.at_risk.root,
            row(self.in_flight.root, self.events.root, sizing_mode="stretch_width"),
            self.flow.root,
            sizing_mode="stretch_width",
        )
        self._logged: str | None = None

    @without_property_validation
    def update(self) -> None:
        try:
            policy = engine_of(self.scheduler)
            report = None if policy is None else status.shared_report(policy)
            for part in self.parts:
                part.update(report)
        except Exception as exc:  # a bug: say it on the page, log it once, keep serving
            error = f"this page failed to update: {type(exc).__name__}: {exc}"
            if error != self._logged:
                logger.exception("amm-rules: dashboard page")
                self._logged = error
            self.header.update(None, error)


def _page(scheduler: Any, doc: Any) -> None:
    page = RulesPage(scheduler)
    page.update()
    add_periodic_callback(doc, page, INTERVAL_MS)
    doc.add_root(page.root)
    doc.title = TITLE
    doc.theme = BOKEH_THEME


def page_doc(scheduler: Any, extra: Mapping[str, Any], doc: Any) -> None:
    """``/amm-rules``: the page inside the dashboard's navigation bar."""
    _page(scheduler, doc)
    doc.template = env.get_template("simple.html")
    doc.template_variables.update(extra)


def individual_doc(scheduler: Any, extra: Mapping[str, Any], doc: Any) -> None:
    """``/individual-amm-rules``: the page alone, as the dashboard's individual plots."""
    _page(scheduler, doc)


def register() -> None:
    """Add the pages to the scheduler dashboard's applications (for schedulers that
    build their dashboard from now on). Idempotent."""
    from distributed.dashboard import scheduler as dashboard

    dashboard.applications.setdefault(URL, page_doc)
    dashboard.applications.setdefault(INDIVIDUAL_URL, individual_doc)


# ---------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------


def _replace(source: ColumnDataSource, data: dict[str, list[Any]]) -> bool:
    """Send new columns only when they changed (most seconds, nothing did); whether
    they did."""
    if dict(source.data) == data:
        return False
    source.data.update(data)
    return True


def _refill(table: DataTable, data: dict[str, list[Any]]) -> None:
    """New rows for a table. BokehJS redraws a table's rows when its view of the data
    changes, which a change of the number of rows does, but new values alone do not:
    then a change of the view's ``tags`` (which mean nothing to it) makes it redraw
    them, without rebuilding the table."""
    source = table.source
    rows = len(next(iter(source.data.values()), ()))
    if _replace(source, data) and rows == len(next(iter(data.values()), ())):
        view = table.view
        view.tags = [int(view.tags[0]) + 1 if view.tags else 1]


def _show_factors(chart: Any, factors: list[Any]) -> None:
    """A bar chart's ``(pool, worker)`` factors, the workers named up to
    :data:`NAMED_WORKERS` of them."""
    if list(chart.x_range.factors) != factors:
        chart.x_range.factors = factors
    font = "0px" if len(factors) > NAMED_WORKERS else "11px"
    _set(chart.xaxis[0], major_label_text_font_size=font)


def _set(model: Any, **values: Any) -> None:
    changed = {k: v for k, v in values.items() if getattr(model, k) != v}
    if changed:
        model.update(**changed)


def _table_height(rows: int, row_height: int = DEFAULT_ROW) -> int:
    return 30 + (row_height + 1) * max(rows, 1)


def _table(source: Any, columns: list[Any], rows: int, visible: bool = True) -> Any:
    """A table of the page: no index column, not sortable, as tall as ``rows``, the
    widths its columns give (BokehJS's own fitting varies from run to run)."""
    return DataTable(
        source=source,
        columns=columns,
        index_position=None,
        sortable=False,
        height=_table_height(rows),
        sizing_mode="stretch_width",
        autosize_mode="none",
        visible=visible,
    )


def _first_line(text: Any) -> str:
    lines = str(text).strip().splitlines()
    more = f" (+{counted(len(lines) - 1, 'more line')})" if len(lines) > 1 else ""
    return (lines[0] if lines else "") + more


def _clock(stamp: Any) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(stamp))
    except (TypeError, ValueError, OverflowError, OSError):
        return str(stamp)
