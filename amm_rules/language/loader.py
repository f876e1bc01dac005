"""Reading rules: from a file, YAML text or an inline mapping to a checked Ruleset,
through the steps that :mod:`amm_rules.language` lists, each in its own module.

Every step reports through one :class:`~amm_rules.language.locator.Locator`, so every problem
of a file is collected, not just the first. :func:`load_ruleset` is the strict entry
point used by the scheduler half; the ``check_*`` functions return all diagnostics
(warnings included) for ``amm-rules validate`` and other tools.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import field, replace
from typing import TYPE_CHECKING, Any

from amm_rules.language.diagnostics import Diagnostic, RulesError, sort_key
from amm_rules.language.records import record
from amm_rules.language.ruleset import Ruleset

if TYPE_CHECKING:
    from amm_rules.language.yaml_source import YamlSource

logger = logging.getLogger(__name__)

#: Name used for rules that do not come from a file.
INLINE = "<rules>"


@record
class CheckResult:
    """Everything known about one checked rules source."""

    file: str
    ruleset: Ruleset | None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    #: The decoded text, when there was one (reporters show source lines from it).
    text: str | None = None
    #: SHA-256 (hex) of the bytes read, or of an inline mapping's canonical JSON.
    sha256: str | None = None
    #: The rules of the inline entries of a dask config file (``validate --dask-config``).
    inline: list[Ruleset] = field(default_factory=list)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]


def load_ruleset(source: Any, *, filename: str | None = None) -> Ruleset:
    """A :class:`Ruleset` from a path or an inline mapping (dask config ``rules:``).

    Raises :class:`RulesError` listing every error. Warnings are logged.
    """
    if isinstance(source, Ruleset):
        return source
    if isinstance(source, Mapping):
        result = check_mapping_result(source, filename or INLINE)
    elif isinstance(source, (str, os.PathLike)):
        result = check_path(source, display=filename)
    else:
        raise TypeError(f"rules must be a path or a mapping, got {type(source).__name__}")
    if result.ruleset is None:
        raise RulesError(result.diagnostics, result.text)
    for diag in result.diagnostics:
        logger.warning("%s", diag)
    return replace(result.ruleset, text=result.text, sha256=result.sha256)


def check_file(path: str | os.PathLike[str]) -> tuple[Ruleset | None, list[Diagnostic]]:
    result = check_path(path)
    return result.ruleset, result.diagnostics


def check_text(
    text: str | bytes, filename: str = INLINE
) -> tuple[Ruleset | None, list[Diagnostic]]:
    result = check_source(text, filename)
    return result.ruleset, result.diagnostics


def check_mapping(mapping: Any, filename: str = INLINE) -> tuple[Ruleset | None, list[Diagnostic]]:
    result = check_mapping_result(mapping, filename)
    return result.ruleset, result.diagnostics


# -- the three sources --------------------------------------------------------------


def check_path(
    path: str | os.PathLike[str], display: str | None = None, *, streams: bool = False
) -> CheckResult:
    """Read and check a file; problems reading it are diagnostics about the file.

    Only regular files are read unless ``streams`` is true: the scheduler reads its
    rules on its event loop, where waiting for the writer of a named pipe would stall
    it. ``amm-rules validate`` passes ``streams=True``: at a command line, reading
    ``/dev/stdin`` or a named pipe until its writer is done is what is asked for
    (every command reads its rules through :func:`check_argument`).
    """
    raw = read_rules_bytes(path, streams=streams)
    name = display or os.fspath(path)
    if isinstance(raw, str):
        return file_problem(name, raw, "unreadable")
    return check_source(raw, name)


def check_argument(argument: str) -> CheckResult:
    """Read and check a rules file named on a command line, as every command reads it:
    ``-`` is standard input; a named pipe, ``/dev/stdin`` or a shell's process
    substitution (``<(git show HEAD~1:rules.yaml)``) is read to its end, like a
    regular file. (The scheduler reads only regular files: :func:`check_path`.)"""
    if argument == "-":
        # The bytes under standard input (click's own helper for it is deprecated).
        return check_stream(getattr(sys.stdin, "buffer", sys.stdin))
    return check_path(argument, streams=True)


def read_rules_bytes(path: str | os.PathLike[str], *, streams: bool = False) -> bytes | str:
    """The bytes of a rules file (at most one more than the size limit, enough to know
    it is too large), or why they cannot be read."""
    from amm_rules.language.yaml_source import MAX_BYTES

    try:
        if os.path.isdir(path):
            return "is a directory, not a rules file"
        # Non-blocking unless streams are wanted: opening a named pipe for reading
        # would otherwise wait for a writer, forever, on the scheduler's event loop.
        flags = os.O_RDONLY | getattr(os, "O_BINARY", 0)
        fd = os.open(path, flags if streams else flags | getattr(os, "O_NONBLOCK", 0))
        try:
            mode = os.fstat(fd).st_mode
            if not (stat.S_ISREG(mode) or (streams and _is_stream(mode))):
                return (
                    "is not a regular file (a pipe, socket or device); "
                    "rules files are regular files"
                )
            with open(fd, "rb", closefd=False) as f:
                return read_bounded(f, MAX_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return "no such file"
    except PermissionError:
        return "cannot read the file: permission denied"
    except OSError as exc:
        return f"cannot read the file: {exc.strerror or exc}"


def _is_stream(mode: int) -> bool:
    """A named pipe, a terminal or another character device (``/dev/stdin``)."""
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode) or stat.S_ISSOCK(mode)


def read_bounded(stream: Any, limit: int) -> bytes:
    """Up to ``limit`` bytes of a binary stream, until its end (a pipe returns what its
    writer has written so far at each read)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = stream.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def check_stream(stream: Any, name: str = "<stdin>") -> CheckResult:
    """Read a binary stream (standard input) to its end and check what it held."""
    from amm_rules.language.yaml_source import MAX_BYTES

    try:
        raw = read_bounded(stream, MAX_BYTES + 1)
    except OSError as exc:
        return file_problem(name, f"cannot read: {exc.strerror or exc}", "unreadable")
    return check_source(raw, name)


def check_source(content: str | bytes, filename: str = INLINE) -> CheckResult:
    """Check YAML text (or its bytes)."""
    try:
        result = _guarded_source(content, filename)
    except Exception as exc:  # a bug must still come out as a diagnostic, not a traceback
        result = _internal(filename, exc)
    # Of the bytes as read, so that it matches `sha256sum` of the file.
    raw = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
    result.sha256 = hashlib.sha256(raw).hexdigest()
    return result


def check_mapping_result(mapping: Any, filename: str = INLINE) -> CheckResult:
    """Check an inline mapping (no positions: line and column are 0). Its text is its
    canonical JSON (sorted keys), which status and cluster dumps show."""
    from amm_rules.language.locator import Locator

    try:
        where = Locator(filename, None)
        data = _plain(mapping, (), where)
        where.data = data
        result = _check_data(data, where, filename, text=None)
        if result.ruleset is not None:
            result.text = json.dumps(data, sort_keys=True, ensure_ascii=False)
            result.sha256 = hashlib.sha256(result.text.encode()).hexdigest()
        return result
    except Exception as exc:
        return _internal(filename, exc)


# -- internals ----------------------------------------------------------------------


def _guarded_source(content: str | bytes, filename: str) -> CheckResult:
    text, source, diagnostics = read_source(content, filename)
    if source is None:
        return CheckResult(filename, None, diagnostics, text)
    return check_yaml_source(source, filename, diagnostics)


def read_source(
    content: str | bytes, filename: str
) -> tuple[str | None, YamlSource | None, list[Diagnostic]]:
    """The text of ``content`` (bytes are decoded), its YAML read with positions, and the
    problems met doing so as diagnostics (None for what could not be read)."""
    from amm_rules.language.yaml_source import decode, read_yaml

    if isinstance(content, bytes):
        text, problems = decode(content)
        if text is None:
            return None, None, [_diag(filename, p) for p in problems]
    else:
        text = content.removeprefix("\ufeff")
    source, problems = read_yaml(text)
    return text, source, [_diag(filename, p) for p in problems]


def check_yaml_source(
    source: Any, filename: str, diagnostics: list[Diagnostic] | None = None
) -> CheckResult:
    """Check rules read as a positioned :class:`~amm_rules.language.yaml_source.YamlSource`
    (a whole file, or the ``rules`` of a dask config entry with the config file's
    positions), after the ``diagnostics`` found while reading it."""
    from amm_rules.language.locator import Locator

    where = Locator(filename, source.data, source)
    where.diagnostics.extend(diagnostics or ())
    result = _check_data(source.data, where, filename, source.text)
    if "amm-rules:" in source.text:
        from amm_rules.language import directives

        kept = directives.apply(result.diagnostics, source, filename)
        result.diagnostics = sorted(kept, key=sort_key)
    return result


def _check_data(data: Any, where: Any, filename: str, text: str | None) -> CheckResult:
    from amm_rules.language.build import build
    from amm_rules.language.lint import lint
    from amm_rules.language.schema_check import describe, schema_problems

    ruleset = None
    if data is None and not where.diagnostics:
        where.add((), "the rules file is empty; it needs at least 'version: 1'", "empty")
    elif not isinstance(data, dict):
        if not where.has_errors:
            where.add(
                (),
                "a rules file is a mapping with 'version', 'pools', 'rules', "
                f"'rebalance', 'paused-workers', 'memory-pressure' and 'reduce-replicas'; "
                f"got {describe(data)}",
                "wrong-type",
            )
    else:
        where.add_schema(schema_problems(data))
        ruleset, draft = build(data, where, filename)
        lint(draft, where)
    if where.has_errors:
        ruleset = None
    return CheckResult(filename, ruleset, sorted(where.diagnostics, key=sort_key), text)


def _plain(value: Any, path: tuple[Any, ...], where: Any, depth: int = 0) -> Any:
    """Copy an inline mapping into YAML-like plain data, reporting what is not."""
    from amm_rules.language.yaml_source import MAX_DEPTH

    if depth > MAX_DEPTH:
        where.add(path, f"nesting deeper than {MAX_DEPTH} levels", "too-deep")
        return None
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                where.add(path, f"keys must be strings, got {key!r}", "wrong-type")
                continue
            out[key] = _plain(item, (*path, key), where, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, (*path, i), where, depth + 1) for i, item in enumerate(value)]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    where.add(
        path,
        f"{type(value).__name__} is not plain data (use strings, numbers, "
        "booleans, lists and mappings)",
        "wrong-type",
    )
    return None


def _diag(filename: str, problem: Any) -> Diagnostic:
    return Diagnostic(
        filename, problem.line, problem.column, "error", problem.message, None, problem.code
    )


def file_problem(name: str, message: str, code: str, text: str | None = None) -> CheckResult:
    """The result of a file with one problem, about the whole file."""
    return CheckResult(name, None, [Diagnostic(name, 0, 0, "error", message, None, code)], text)


def _internal(name: str, exc: Exception) -> CheckResult:
    logger.debug("internal error while checking %s", name, exc_info=True)
    message = (
        f"internal error while checking this file ({type(exc).__name__}: {exc}); please report it"
    )
    return file_problem(name, message, "internal")
