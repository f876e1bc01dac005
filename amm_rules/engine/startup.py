"""The rules at the scheduler's start: the line logged when they load, and what happens
when they cannot be used.

A scheduler given rules that do not validate either refuses to start (the default,
``on_invalid_rules: refuse``) or starts without them (``on_invalid_rules:
start-without``): see docs/deploy.md for the choice. Either way the diagnostics are
logged as ``amm-rules validate`` prints them (``path:line:column``, the source line and
a caret), followed by one line saying which of the two happens, and no traceback: a
refused start leaves the interpreter through a ``sys.excepthook`` that stays silent for
the one :class:`~amm_rules.language.diagnostics.RulesError` already reported (any other
exception is shown as before). Starting without the rules means running an empty rules
file (distributed's stock behaviour: extra copies of every key dropped) while the file
is still watched: once it is fixed, it is loaded at the next cycle.

Neighbours: :class:`~amm_rules.engine.policy.RulesPolicy` calls :func:`invalid_at_start`
from its constructor and :func:`loaded_line` when it attaches;
:mod:`amm_rules.engine.rules_file` loads the rules and keeps the errors status shows.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from types import TracebackType
from typing import Any

from amm_rules.engine.rules_file import RulesFile
from amm_rules.engine.words import counted
from amm_rules.language.diagnostics import RulesError
from amm_rules.language.ruleset import Ruleset

logger = logging.getLogger(__name__)

#: The values of the policy's ``on_invalid_rules`` parameter, the default first.
ON_INVALID_RULES = ("refuse", "start-without")

#: The source of the empty rules a policy runs when it started without its own.
NO_RULES = "<no rules: the configured rules are invalid>"


def check_choice(value: str) -> str:
    if value not in ON_INVALID_RULES:
        raise ValueError(
            f"RulesPolicy: on_invalid_rules must be one of {', '.join(map(repr, ON_INVALID_RULES))}"
            f", got {value!r}"
        )
    return value


def diagnostics_text(exc: RulesError) -> str:
    """The errors as ``amm-rules validate`` prints them: each with its source line and
    a caret under the problem where the text is known."""
    from amm_rules.language.loader import CheckResult
    from amm_rules.language.reporters import escape_controls, format_text

    files = dict.fromkeys(d.file for d in exc.diagnostics)
    results = [
        CheckResult(
            file=f,
            ruleset=None,
            diagnostics=[d for d in exc.diagnostics if d.file == f],
            text=exc.text,
        )
        for f in files
    ]
    return escape_controls(format_text(results, with_summary=False)).rstrip("\n")


def invalid_at_start(exc: RulesError, rules_file: RulesFile, choice: str, source: str) -> Ruleset:
    """The rules of a policy whose configured rules (``source``: a path, or where
    inline rules were) cannot be used. ``refuse``: log, and raise ``exc``, marked so
    that it ends the process without a traceback. ``start-without``: log, keep the error
    for status, and return an empty ruleset (the file stays watched)."""
    errors = len(exc.errors) or len(exc.diagnostics)
    what = f"{counted(errors, 'error')} in the rules ({source})"
    if choice == "refuse":
        logger.error(
            "%s\namm-rules: the scheduler does not start: %s; check them with "
            "'amm-rules validate' (on_invalid_rules: start-without would start it "
            "without them)",
            diagnostics_text(exc),
            what,
        )
        exc.reported_at_start = True
        _install_quiet_hook()
        raise exc
    logger.error(
        "%s\namm-rules: the scheduler starts WITHOUT these rules (on_invalid_rules: "
        "start-without): %s; no key is governed until they are fixed%s",
        diagnostics_text(exc),
        what,
        " (the file is watched: fixed, it loads at the next cycle)"
        if rules_file.path is not None and rules_file.reload
        else "",
    )
    rules_file.note_error(str(exc), at_start=True)
    from amm_rules.language.loader import load_ruleset

    return load_ruleset({"version": 1}, filename=NO_RULES)


def loaded_line(ruleset: Ruleset, source: str, *, reloaded: bool = False) -> str:
    """One line for the log when the rules come into force: where from (``source``),
    which version of the text (the start of its SHA-256, as ``sha256sum`` prints it),
    how many rules and which pools. A reload says ``reloaded rules from ...``, the same
    line otherwise: an operator tells from the digest that a change landed."""
    if ruleset.source == NO_RULES:
        return (
            f"amm-rules: no rules in force: those of {source} are invalid "
            "(on_invalid_rules: start-without)"
        )
    digest = ruleset.sha256
    if digest is None and ruleset.text is not None:
        digest = hashlib.sha256(ruleset.text.encode()).hexdigest()
    pools = ", ".join(ruleset.pools) or "none"
    return (
        f"amm-rules: {'reloaded ' if reloaded else ''}rules from {source}"
        + (f" (sha256 {digest[:12]})" if digest else "")
        + f": {counted(len(ruleset.rules), 'rule')}, pools: {pools}"
    )


_previous_hook: Any = None


def _quiet_excepthook(
    kind: type[BaseException], exc: BaseException, tb: TracebackType | None
) -> None:
    if isinstance(exc, RulesError) and exc.reported_at_start:
        return  # its diagnostics and what it means were logged where it was raised
    _previous_hook(kind, exc, tb)


def _install_quiet_hook() -> None:
    global _previous_hook
    if sys.excepthook is not _quiet_excepthook:
        _previous_hook = sys.excepthook
        sys.excepthook = _quiet_excepthook
