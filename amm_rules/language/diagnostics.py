"""Diagnostics: what is wrong with a rules file, and where.

A :class:`Diagnostic` is plain data (file, line, column, severity, message, rule,
code). Every part of the language half produces them; the reporters in
:mod:`amm_rules.language.reporters` turn them into text, JSON or GitHub annotations. Positions
are 1-based and are attached where the text enters (the YAML loader, the expression
parser), never rebuilt later.

:class:`RulesError` carries the diagnostics of a rules file that cannot be used; it is
what :func:`amm_rules.load_ruleset` raises and what a scheduler start fails with.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Literal

from amm_rules.language.records import record

Severity = Literal["error", "warning"]


@record(frozen=True)
class Diagnostic:
    """One problem found in one rules file."""

    #: Path of the file as the user named it, or ``"<rules>"`` for inline rules.
    file: str
    #: 1-based line of the offending token (0 when the problem concerns the whole file).
    line: int
    #: 1-based column of the offending token (0 when the problem concerns the whole file).
    column: int
    severity: Severity
    message: str
    #: Name of the rule (or ``pools.NAME``, ``rebalance``, ``paused-workers``,
    #: ``memory-pressure``, ``demand``; in a test file ``cases.NAME`` or
    #: ``workers.NAME``) the problem is in, if any.
    rule: str | None = None
    #: A short stable identifier of the kind of problem, e.g. ``"yaml"``, ``"schema"``,
    #: ``"unknown-attribute"``, ``"shadowed-rule"``.
    code: str = "error"
    #: Column just past the offending token, when it is known and on the same line;
    #: the text reporter underlines from ``column`` up to it.
    end_column: int | None = None

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def location(self) -> str:
        if self.line <= 0:
            return self.file
        return f"{self.file}:{self.line}:{self.column}"

    def __str__(self) -> str:
        """``path:line:column: error: message (in rule 'NAME')``; a warning shows its
        code, which ``--disable`` and ``# amm-rules: disable=`` take:
        ``warning[shadowed-rule]: ...``."""
        severity = (
            f"warning[{self.code}]" if self.severity == "warning" and self.code else self.severity
        )
        return f"{self.location()}: {severity}: {self.described()}"

    def described(self) -> str:
        """The message and the entry it is in: ``message (in rule 'NAME')``."""
        where = f" (in {_context(self.rule)})" if self.rule else ""
        return f"{self.message}{where}"

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


#: Entries named ``SECTION.NAME`` in :attr:`Diagnostic.rule`, and what each is called
#: (rules files have pools; the test files of ``amm-rules test`` cases and workers).
_ENTRIES = {"pools.": "pool", "cases.": "case", "workers.": "worker"}
#: The sections of a rules file whose problems say ``(in section 'NAME')``.
FILE_SECTIONS = (
    "rebalance",
    "paused-workers",
    "memory-pressure",
    "demand",
    "protect",
    "spill",
    "adaptive",
)
#: Top-level entries named as ``section 'NAME'`` in messages.
SECTIONS = (*FILE_SECTIONS, "pools", "rules", "version", "reduce-replicas")


def _context(rule: str) -> str:
    """``rule 'precious'`` for a rule, ``pool 'gpu'`` for a pool, else the section."""
    for prefix, kind in _ENTRIES.items():
        if rule.startswith(prefix):
            return f"{kind} '{_one_line(rule[len(prefix) :])}'"
    if rule in SECTIONS:
        return f"section '{rule}'"
    return f"rule '{_one_line(rule)}'"


def _one_line(name: str) -> str:
    """A name as it is shown in a one-line problem: line breaks and other characters
    that are not printable are written as escapes (``'multi\\nline'``), since a
    rule's name is whatever the file says, including a YAML block scalar."""
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name)


def sort_key(diag: Diagnostic) -> tuple[str, int, int, str]:
    return (diag.file, diag.line, diag.column, diag.message)


class RulesError(ValueError):
    """A rules file (or inline rules mapping) that cannot be used.

    ``str(error)`` lists every error, one ``path:line:column: error: message`` per line,
    exactly as ``amm-rules validate`` prints them.
    """

    #: Said in the scheduler's log already, as it refused to start (the process's
    #: excepthook then says it in one line: :mod:`amm_rules.engine.startup`).
    reported_at_start = False

    def __init__(self, diagnostics: Iterable[Diagnostic], text: str | None = None):
        self.diagnostics: list[Diagnostic] = sorted(diagnostics, key=sort_key)
        #: The text the diagnostics point into, when there is one (a report shows its
        #: lines, with a caret under each problem, as ``validate`` does).
        self.text = text
        super().__init__("\n".join(str(d) for d in self.errors or self.diagnostics))

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]
