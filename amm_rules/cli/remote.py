"""``amm-rules status``, ``explain`` and ``drain`` against a running scheduler.

The command line talks to the scheduler over its own comm (``distributed.core.rpc``,
with dask's security settings), as a client would, without starting a ``Client``:

1. connect and ask ``identity`` (a short timeout: an unreachable address fails fast,
   and an address that is not a scheduler is named as such);
2. ask whether the amm-rules handlers are registered, as the client API does
   (:func:`amm_rules.client.engine_found`); where the scheduler cannot tell, the handler
   is called and its silence reported after the timeout;
3. call ``amm_rules_status``, ``amm_rules_memory_flow``, ``amm_rules_explain`` or the
   drain's handlers and render the answer.

A command does steps 1 and 2 once, on one connection (:class:`Remote`).

Every failure is a :class:`RemoteError` with one line for the user; the command line
prints it and exits 1. Neighbours: :mod:`amm_rules.cli` defines the commands;
:mod:`amm_rules.observe.text` renders the answers.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Hashable, Sequence
from typing import Any

#: Seconds to wait for the scheduler at each step (connect, probe, answer): a reachable
#: scheduler answers in milliseconds, so a longer wait mostly delays the error (the
#: command line's ``--timeout`` has the same default).
DEFAULT_TIMEOUT = 2.0
CONNECT = "connect to"
#: Said with every error of waiting too long.
TIMEOUT_HINT = "--timeout SECONDS waits longer"


class RemoteError(Exception):
    """A problem reaching the engine, told in one line."""


def scheduler_address(given: str | None) -> str | None:
    """``--scheduler``, else dask's ``scheduler-address`` (also set by the environment
    variable ``DASK_SCHEDULER_ADDRESS``), else None."""
    if given:
        return given
    import dask

    value = dask.config.get("scheduler-address", None)
    return str(value) if value else None


class Remote:
    """One command's connection to the scheduler at ``address``: opened and identified
    once (step 1), each handler's presence checked once (step 2), asked as often as the
    command needs (``amm-rules drain`` asks once a second), closed when the command ends.
    distributed's ``rpc`` keeps its comm between calls, so the command makes one
    connection. Use as ``async with Remote(address, timeout) as remote:``."""

    def __init__(self, address: str, timeout: float = DEFAULT_TIMEOUT):
        self.address = address
        self.timeout = timeout
        self._rpc: Any = None
        #: The handlers known to be there; all of them once the metadata said so.
        self._checked: set[str] = set()
        self._engine_said = False

    async def __aenter__(self) -> Remote:
        from distributed.core import rpc
        from distributed.security import Security

        try:
            self._rpc = rpc(
                self.address,
                timeout=self.timeout,
                connection_args=Security().get_connection_args("client"),
            )
        except (ValueError, TypeError) as exc:  # a malformed address
            raise RemoteError(f"{self.address}: not a scheduler address ({exc})") from None
        try:
            identity = await self._step(self._rpc.identity(), CONNECT)
            kind = identity.get("type") if isinstance(identity, dict) else None
            if kind != "Scheduler":
                raise RemoteError(f"{self.address} is a {kind or 'server'}, not a Dask scheduler")
        except BaseException:
            await self._rpc.close_rpc()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._rpc.close_rpc()

    async def ask(self, op: str, **kwargs: Any) -> Any:
        """Call the handler ``op`` of the amm-rules engine; a refusal (a bad rule
        name...) is a :class:`RemoteError` with the engine's words."""
        if not self._engine_said and op not in self._checked:
            from amm_rules.client import engine_found

            found = await engine_found(self._rpc, op, self.timeout)
            if found == "absent":
                raise RemoteError(
                    f"the scheduler at {self.address} runs no amm-rules engine: add "
                    "{'class': 'amm_rules.RulesPolicy', 'rules': ...} to its dask config "
                    "distributed.scheduler.active-memory-manager.policies"
                )
            if found == "without-op":
                raise RemoteError(
                    f"the amm-rules engine of the scheduler at {self.address} has no {op!r} "
                    "handler: upgrade amm-rules on the scheduler"
                )
            self._engine_said = found == "said"
            self._checked.add(op)
        call = _answer(getattr(self._rpc, op)(**kwargs))
        return await self._step(call, "get an answer from the amm-rules engine of")

    async def _step(self, call: Any, what: str) -> Any:
        address, timeout = self.address, self.timeout
        try:
            return await asyncio.wait_for(call, timeout)
        except RemoteError:
            raise
        except Exception as exc:
            # distributed's connect retries until the timeout ("Timed out..."): nothing
            # answered there.
            if isinstance(exc, asyncio.TimeoutError) or (
                isinstance(exc, OSError) and str(exc).startswith("Timed out")
            ):
                raise RemoteError(
                    f"could not {what} the scheduler at {address} within {timeout:g} s "
                    f"({TIMEOUT_HINT})"
                ) from None
            if isinstance(exc, OSError) or what == CONNECT:
                # Refused, unreachable, a malformed address, TLS: the comm's own words.
                raise RemoteError(
                    f"could not {what} the scheduler at {address}: {_first_line(exc)}"
                ) from None
            # Raised by the handler on the scheduler, or a refusal (a bad rule name...).
            raise RemoteError(f"the scheduler at {address} answered: {_first_line(exc)}") from None


async def _answer(call: Any) -> Any:
    """A handler's answer; a refusal raised as the ``ValueError`` it stands for."""
    from amm_rules.engine.handlers import refused

    return refused(await call)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


# ---------------------------------------------------------------------------------
# The commands: status, memory-flow and explain as (output, exit status); drain prints
# as it goes and returns its exit status
# ---------------------------------------------------------------------------------


def status_command(address: str, fmt: str, check: bool, timeout: float) -> tuple[str, int]:
    from amm_rules.language.reporters import escape_controls
    from amm_rules.observe.status import all_satisfied, status_json
    from amm_rules.observe.text import render_status

    report = asyncio.run(_ask_once(address, timeout, "amm_rules_status"))
    text = status_json(report) if fmt == "json" else escape_controls(render_status(report))
    return text, 1 if check and not all_satisfied(report) else 0


def memory_flow_command(address: str, fmt: str, top: int, timeout: float) -> tuple[str, int]:
    """``amm-rules status --memory-flow``: the flow per prefix (JSON: every prefix)."""
    from amm_rules.language.reporters import escape_controls
    from amm_rules.observe.text import render_memory_flow

    table = asyncio.run(_ask_once(address, timeout, "amm_rules_memory_flow"))
    if fmt == "json":
        return json.dumps(table, indent=2, default=str) + "\n", 0
    return escape_controls(render_memory_flow(table, top)), 0


def explain_command(
    address: str,
    keys: Sequence[Sequence[Hashable]],
    texts: Sequence[str],
    *,
    unmet: bool,
    rule: str | None,
    limit: int,
    fmt: str,
    timeout: float,
) -> tuple[str, list[str], int]:
    """Output, lines for stderr (``error: ...``, ``note: ...``), exit status. ``keys``:
    per argument, its candidate keys (see :func:`amm_rules.cli.keys.parse_key`);
    ``texts``: the arguments. With ``unmet``, fewer keys explained than are unmet is
    said: the last line of the text, a note on stderr with JSON."""
    from amm_rules.language.reporters import escape_controls
    from amm_rules.observe.text import render_explain

    async def asked() -> tuple[dict[str, Any], list[str], str | None]:
        async with Remote(address, timeout) as remote:
            if not unmet:
                return (*await _explain_candidates(remote, keys, texts), None)
            if rule is not None:
                await _check_rule(remote, rule)
            got = await remote.ask(
                "amm_rules_explain", unmet=True, rule=rule, limit=limit, counts=True
            )
            return got["keys"], [], shown_note(got, limit)

    answers, errors, note = asyncio.run(asked())
    if unmet and not answers:
        scope = f" of rule {rule!r}" if rule else ""
        return f"every governed key{scope} meets its target and placement\n", [], 0

    lines = [f"error: {e}" for e in errors]
    if fmt == "json":
        out = json.dumps(answers, indent=2, default=str) + "\n"
        if note is not None:  # the JSON stays what it was: the note goes to stderr
            lines.append(f"note: {note}")
    else:
        out = escape_controls(render_explain(answers)) if answers else ""
        if note is not None:
            out += f"\n{note}\n"
    # (Lines for stderr go to a terminal whatever the format.)
    return out, [escape_controls(line) for line in lines], 1 if errors else 0


def shown_note(got: dict[str, Any], limit: int) -> str | None:
    """``showing 10 of 20,000 unmet keys; use --limit`` when fewer were explained than
    are unmet (None when all were)."""
    shown, total, most = got["shown"], got["total"], got["most"]
    if shown >= total:
        return None
    head = f"showing {shown:,} of {total:,} unmet keys"
    if limit > shown and shown >= most:
        return f"{head} (at most {most:,} in one call); use --rule to see others"
    return f"{head}; use --limit to see more (at most {most:,} in one call)"


async def _ask_once(address: str, timeout: float, op: str) -> Any:
    async with Remote(address, timeout) as remote:
        return await remote.ask(op)


async def _check_rule(remote: Remote, rule: str) -> None:
    """An unknown rule name is the user's typo: said here, in one line, rather than
    by an exception raised in the scheduler (which logs it with a traceback)."""
    report = await remote.ask("amm_rules_status")
    names = [r["name"] for r in report["conformance"]["rules"]]
    if rule not in names:
        raise RemoteError(f"--rule: no rule named {rule!r}; the rules are {', '.join(names)}")


async def _explain_candidates(
    remote: Remote, keys: Sequence[Sequence[Hashable]], texts: Sequence[str]
) -> tuple[dict[str, Any], list[str]]:
    """Ask for each argument's most likely key; for the arguments the scheduler does not
    know, ask again with their next candidate (``5`` the string, then ``5`` the number)."""
    from amm_rules.engine.decide.view import key_string

    answers: dict[str, Any] = {}
    todo = [(text, list(candidates)) for text, candidates in zip(texts, keys, strict=True)]
    errors = []
    while todo:
        batch = [(text, candidates[0], candidates) for text, candidates in todo]
        got = await remote.ask("amm_rules_explain", keys=[key for _, key, _ in batch], counts=True)
        if not got["shown"]:
            raise RemoteError(f"the scheduler at {remote.address} explained none of the keys")
        # The scheduler explains the first ones (at most got["most"]): the others are
        # asked again in the next call, with the same candidate.
        todo = [(text, candidates) for text, _, candidates in batch[got["shown"] :]]
        for text, key, candidates in batch[: got["shown"]]:
            candidates.pop(0)
            answer = got["keys"].get(key_string(key)) if isinstance(got["keys"], dict) else None
            if answer is not None and answer.get("state") != "unknown":
                answers[text] = answer
            elif candidates:
                todo.append((text, candidates))
            else:
                # A task group's or prefix's name: the scheduler says what it names.
                said = answer.get("summary") if answer is not None else None
                errors.append(f"unknown key: {text} ({said or 'not known to the scheduler'})")
    return answers, errors


#: Seconds between two looks at a drain while ``amm-rules drain`` follows it.
DRAIN_POLL = 1.0


def drain_command(
    address: str,
    workers: Sequence[str],
    deadline: float,
    *,
    close: bool,
    fmt: str,
    timeout: float,
    echo: Any,
) -> int:
    """``amm-rules drain``: start the drain, say what it predicts, follow it (a line
    when the prediction or a state changes), and end with what happened. ``echo``
    prints a line. Exit status: 0 when every key was safe, 1 when keys were not."""
    from amm_rules.engine.drain_request import GRACE, DrainReport, drain_over, follow
    from amm_rules.language.reporters import escape_controls

    def say(text: str) -> None:
        if fmt == "text":
            echo(escape_controls(text))

    async def run() -> dict[str, Any]:
        async with Remote(address, timeout) as remote:
            started = await remote.ask(
                "amm_rules_drain", workers=list(workers), deadline=deadline, close_workers=close
            )
            for line in map(DrainReport.from_dict, started.values()):
                say(line.notice())
            return await follow(
                remote.ask, started, deadline, DRAIN_POLL, lambda line: say(line.progress())
            )

    report = asyncio.run(run())
    over = all(drain_over(line) for line in report.values())
    if fmt == "json":
        echo(json.dumps(report, indent=2, default=str))
    elif not over:
        echo(f"the drains had not ended {GRACE:g} s after their deadline")
    lost = sum((line.get("outcome") or {}).get("unsafe_keys", 0) for line in report.values())
    return 1 if lost or not over else 0
