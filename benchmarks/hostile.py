"""The worst event-loop lag of each hostile input that once stalled the scheduler
(docs/reliability.md, promise 14), measured on a real in-process scheduler with the
loop-lag probe (:mod:`benchmarks.support.looplag`).

Scenarios (each on a fresh scheduler, with the ``amm_rules.dashboard`` preload):

- ``explain``: one ``amm_rules_explain`` call naming 20,000 unknown keys, with a full
  10,000-entry decision journal (finding 1, the journal part);
- ``status-json``: 20 concurrent requests to ``/amm-rules/status.json`` with a rules
  file of 5,000 rules (finding 3);
- ``status-json-event``: a client logs a 5 MB event to the topic, then 5 requests to
  ``/amm-rules/status.json`` (finding 8);
- ``metrics``: one scrape of ``/metrics`` with a rules file of 5,000 rules (finding 3);
- ``annotation``: 20 keys annotated with a mapping of 2**18 shared leaves (finding 4);
- ``reload-sexagesimal``: the hot reload of a 500 kB rules file whose ``replicate`` is
  YAML 1.1 sexagesimal ``1:1:1:...`` (finding 6);
- ``explain-unmet``: ``explain --unmet --limit 1000000`` (one ``amm_rules_explain`` call)
  with 20,000 keys whose target is unmet (finding 1, the cap and the chunks);
- ``reload-many-rules``: the hot reload of a valid rules file of 10,000 rules
  (finding 2);
- ``reload-broken``: three reload attempts of a 1 MiB rules file with an error in its
  last rule, each a new state of the file (finding 2).

Run it from the tree to measure (``after``); for ``before``, run the same module from a
checkout of the commit before the fixes, with this file and ``benchmarks/support/``
copied in, and ``--label before``. Each run adds its label's figures to the results file.

Usage: ``python -m benchmarks.hostile [--label after] [--repeats 3] [--only NAME,...]``;
writes ``benchmarks/results/hostile.json``. Imports nothing from ``tests``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import dask
from distributed import Client, Scheduler, Worker
from tornado.httpclient import AsyncHTTPClient

from benchmarks.support.looplag import LoopLag

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "hostile.json"
AMM = "distributed.scheduler.active-memory-manager"
#: The budget of the promise: no single request, reload or scrape blocks the loop longer.
BUDGET_S = 0.1
MANY_RULES = 5_000


def many_rules(n: int) -> str:
    return "version: 1\nrules:\n" + "".join(
        f'  - name: rule-{i}\n    match: task.prefix == "p{i}"\n    replicate: 2\n'
        for i in range(n)
    )


def config(rules: Any, interval: float = 0.05) -> dict[str, Any]:
    return {
        f"{AMM}.start": True,
        f"{AMM}.interval": interval,
        f"{AMM}.policies": [{"class": "amm_rules.RulesPolicy", "rules": rules}],
    }


class Shared(Mapping):  # type: ignore[type-arg]
    """Two entries holding the same child, ``depth`` levels deep: 2**depth leaves,
    pickled (a mapping that is not a dict: distributed pickles it, shared references
    kept) in a few kilobytes. Also the hostile annotation of
    ``tests/hostile/test_scheduler_loop.py``."""

    def __init__(self, depth: int):
        self.child: Any = Shared(depth - 1) if depth > 1 else "leaf"

    def __getitem__(self, name: str) -> Any:
        if name in ("a", "b"):
            return self.child
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(("a", "b"))

    def __len__(self) -> int:
        return 2


#: What a scenario measured: the probe, and the size of the largest answer (or None).
Measured = tuple[LoopLag, int | None]


def _policy(s: Scheduler) -> Any:
    return next(iter(s.extensions["amm"].policies))


def _url(s: Scheduler, path: str) -> str:
    return f"http://127.0.0.1:{s.http_server.port}{path}"


async def explain(s: Scheduler, c: Client) -> Measured:
    policy = _policy(s)
    for i in range(10_000):
        policy.journal.decision(f"k-{i}", "replicate", "tcp://w:1", "accepted", "r", "r")
    keys = [f"unknown-{i}" for i in range(20_000)]
    async with LoopLag() as lag:
        await c.scheduler.amm_rules_explain(keys=keys)
    return lag, None


async def status_json(s: Scheduler, c: Client) -> Measured:
    http = AsyncHTTPClient()
    async with LoopLag() as lag:
        got = await asyncio.gather(
            *[http.fetch(_url(s, "/amm-rules/status.json")) for _ in range(20)]
        )
    return lag, max(len(r.body) for r in got)


async def status_json_event(s: Scheduler, c: Client) -> Measured:
    await c.log_event("amm-rules", {"action": "reload-error", "error": "x" * 5_000_000})
    while not s.get_events("amm-rules"):
        await asyncio.sleep(0.01)
    http = AsyncHTTPClient()
    async with LoopLag() as lag:
        got = [await http.fetch(_url(s, "/amm-rules/status.json")) for _ in range(5)]
    return lag, max(len(r.body) for r in got)


async def metrics(s: Scheduler, c: Client) -> Measured:
    http = AsyncHTTPClient()
    async with LoopLag() as lag:
        got = await http.fetch(_url(s, "/metrics"))
    return lag, len(got.body)


async def annotation(s: Scheduler, c: Client) -> Measured:
    huge = {"replicate": 2, "pool": Shared(18)}
    async with LoopLag() as lag:
        with dask.annotate(amm=huge):
            futures = c.map(lambda x: x + 1, range(20), key=[f"p0-{i}" for i in range(20)])
        await c.gather(futures)
        while not any(
            m.get("action") == "invalid-annotation" for _, m in s.get_events("amm-rules")
        ):
            await asyncio.sleep(0.01)
    del futures
    return lag, None


async def reload_sexagesimal(s: Scheduler, c: Client, path: Path) -> Measured:
    reloads = _policy(s).journal.reloads
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        'version: 1\nrules:\n  - name: r\n    match: "true"\n    replicate: '
        + "1:" * 250_000
        + "1\n"
    )
    async with LoopLag() as lag:
        tmp.replace(path)
        while not reloads["error"]:
            await asyncio.sleep(0.01)
    return lag, None


#: Rules under which no key can meet its target: its pool has no worker.
UNMET_RULES = """\
version: 1
pools:
  gpu: worker.resources.GPU >= 1
rules:
  - name: nowhere
    match: "true"
    pool: gpu
    replicate: 2
"""
UNMET_KEYS = 20_000


async def explain_unmet(s: Scheduler, c: Client) -> Measured:
    policy = _policy(s)
    data = await c.scatter(list(range(UNMET_KEYS)))
    while len(policy.index) < UNMET_KEYS:
        await asyncio.sleep(0.05)
    async with LoopLag() as lag:
        got = await c.scheduler.amm_rules_explain(unmet=True, limit=1_000_000)
    del data
    return lag, len(json.dumps(got, default=str))


async def _reload(s: Scheduler, path: Path, text: str, outcome: str, times: int = 1) -> LoopLag:
    """Rename ``text`` over the rules file (``times`` states of it) and wait until the
    policy counted the reload's ``outcome`` (``ok``, ``error``) as often."""
    reloads = _policy(s).journal.reloads
    before = reloads[outcome]
    async with LoopLag() as lag:
        for n in range(times):
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text + f"# state {n}\n")
            tmp.replace(path)
            while reloads[outcome] < before + n + 1:
                await asyncio.sleep(0.01)
    return lag


async def reload_many_rules(s: Scheduler, c: Client, path: Path) -> Measured:
    return await _reload(s, path, many_rules(10_000), "ok"), None


def broken_rules(size: int = 1 << 20) -> str:
    """About ``size`` bytes of rules, the last of them with an unknown field."""
    rule = '  - name: rule-{0}\n    match: task.prefix == "p{0}"\n    replicate: 2\n'
    n = size // len(rule.format(10_000))
    return many_rules(n) + "  - name: last\n    match: 'true'\n    replicat: 2\n"


async def reload_broken(s: Scheduler, c: Client, path: Path) -> Measured:
    return await _reload(s, path, broken_rules(), "error", times=3), None


Scenario = Callable[..., Awaitable["Measured"]]
#: name -> (what, function, rules: "few" | "many" | "unmet" | "file")
SCENARIOS: dict[str, tuple[str, Scenario, str]] = {
    "explain": ("explain of 20,000 unknown keys, full journal", explain, "few"),
    "status-json": ("20 concurrent status.json, 5,000 rules", status_json, "many"),
    "status-json-event": ("status.json after a 5 MB client event", status_json_event, "few"),
    "metrics": ("/metrics scrape, 5,000 rules", metrics, "many"),
    "annotation": ("annotation of 2**18 shared leaves", annotation, "few"),
    "reload-sexagesimal": ("hot reload of 500 kB of 1:1:...", reload_sexagesimal, "file"),
    "explain-unmet": (
        "explain --unmet --limit 1000000, 20,000 unmet keys",
        explain_unmet,
        "unmet",
    ),
    "reload-many-rules": ("hot reload of 10,000 valid rules", reload_many_rules, "file"),
    "reload-broken": ("3 reload attempts of a 1 MiB broken file", reload_broken, "file"),
}


async def run_one(name: str, directory: Path) -> dict[str, float]:
    what, scenario, kind = SCENARIOS[name]
    path = directory / "rules.yaml"
    path.write_text(
        UNMET_RULES if kind == "unmet" else many_rules(MANY_RULES if kind == "many" else 1)
    )
    page = {"dashboard": True, "dashboard_address": "127.0.0.1:0", "port": 0}
    with dask.config.set(config(str(path))):
        async with (
            Scheduler(**page, preload=["amm_rules.dashboard"]) as s,
            Worker(s.address, nthreads=1),
            Worker(s.address, nthreads=1),
            Client(s.address, asynchronous=True) as c,
        ):
            start = time.perf_counter()
            lag, size = await scenario(*((s, c, path) if kind == "file" else (s, c)))
            elapsed = time.perf_counter() - start
    out = {
        "worst_lag_s": lag.worst,
        "elapsed_s": elapsed,
        "ticks": len(lag.samples),
        # The interpreter's longest garbage collection in the window (see LoopLag).
        "worst_gc_s": lag.worst_collection,
    }
    if size is not None:
        out["response_bytes"] = size
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after", help="before or after (default after)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    logging.getLogger("distributed").setLevel(logging.ERROR)
    names = [n for n in args.only.split(",") if n]
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    for _ in range(args.repeats):
        for name in names:
            with tempfile.TemporaryDirectory() as tmp:
                runs[name].append(asyncio.run(run_one(name, Path(tmp))))
            print(
                f"  {name}: worst lag {runs[name][-1]['worst_lag_s'] * 1000:,.0f} ms", flush=True
            )
    commit = _commit()
    figures = {
        n: {
            "what": SCENARIOS[n][0],
            "worst_lag_s": max(r["worst_lag_s"] for r in rs),
            "runs": rs,
            "commit": commit,
            "date": time.strftime("%Y-%m-%d"),
        }
        for n, rs in runs.items()
    }
    results = json.loads(args.json.read_text()) if args.json.exists() else {}
    label = results.setdefault("labels", {}).setdefault(args.label, {})
    # A run of some scenarios replaces their figures and keeps the others'.
    label["figures"] = {**label.get("figures", {}), **figures}
    label.update(
        repeats=args.repeats,
        machine=platform.platform(),
        python=platform.python_version(),
        date=time.strftime("%Y-%m-%d"),
    )
    results["budget_s"] = BUDGET_S
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))


def _commit() -> str | None:
    """The commit of the tree measured (None outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def table(results: dict[str, Any]) -> str:
    labels = results["labels"]
    names = list(dict.fromkeys(n for label in labels.values() for n in label["figures"]))
    order = [x for x in ("before", "after") if x in labels] + [
        x for x in labels if x not in ("before", "after")
    ]
    head = f"| scenario | {' | '.join(f'worst lag (largest answer), {x}' for x in order)} |"
    lines = [head, "| --- |" + " ---: |" * len(order)]
    for n in names:
        what = next(
            label["figures"][n]["what"] for label in labels.values() if n in label["figures"]
        )
        cells = [_cell(labels[x]["figures"].get(n)) for x in order]
        lines.append(f"| {what} | {' | '.join(cells)} |")
    return "\n".join(lines)


def _cell(figure: dict[str, Any] | None) -> str:
    if figure is None:
        return ""
    sizes = [r["response_bytes"] for r in figure["runs"] if "response_bytes" in r]
    notes = [f"{max(sizes) / 1000:,.0f} kB"] if sizes else []
    # The garbage collection in the worst run, when it was a large part of its lag.
    worst = max(figure["runs"], key=lambda r: r["worst_lag_s"])
    if worst.get("worst_gc_s", 0.0) >= 0.2 * worst["worst_lag_s"] > 0.01:
        notes.append(f"a collection of {worst['worst_gc_s'] * 1000:,.0f} ms")
    return f"{figure['worst_lag_s'] * 1000:,.0f} ms" + (f" ({'; '.join(notes)})" if notes else "")


if __name__ == "__main__":
    main()
