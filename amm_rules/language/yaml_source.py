"""Positioned YAML: from bytes to plain data plus where every key and value was written.

This module owns the safety of reading a rules file. In order:

1. bytes: a size limit (:data:`MAX_BYTES`), binary content (NUL bytes), UTF-8 decoding;
2. text: control characters, tabs in indentation;
3. a pre-scan of PyYAML's event stream (:func:`yaml.parse`) that refuses deep nesting
   and alias bombs *before* anything is built, and a second document;
4. composition with PyYAML's safe composer (libyaml's when available), then a walk
   of the node graph that builds plain ``dict``/``list``/scalar data. Tags that are not plain data (``!!python/...``)
   and duplicate keys are problems; nothing is ever constructed from a tag. An integer
   scalar longer than :data:`MAX_INT_CHARS` is refused before PyYAML constructs it
   (YAML 1.1 sexagesimal ``1:1:1:...`` and long hex cost it quadratic time).

Every problem is a :class:`SourceProblem` with a 1-based position. The result,
:class:`YamlSource`, maps each path (a tuple of keys and list indices) to the YAML node
of its value and, for mapping entries, of its key. :mod:`amm_rules.language.scalar_positions`
uses those nodes to place errors found inside an expression; :mod:`amm_rules.language.locator`
turns path-based problems into diagnostics.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from amm_rules.language.records import record

#: Largest rules file read, in bytes. Real rules files are a few kilobytes.
MAX_BYTES = 2**20
#: Deepest nesting of mappings and lists (a rules file needs 4).
MAX_DEPTH = 50
#: Most aliases (``*name``) in one file.
MAX_ALIASES = 100
#: Most values that aliases may add when expanded (the file's own values are bounded
#: by its size).
MAX_EXPANDED = 100_000
#: Longest integer scalar read (a rules file's largest numbers are byte sizes: 20
#: digits). PyYAML builds YAML 1.1 sexagesimal integers (``1:1:1``) and hex ones
#: digit by digit, in time quadratic in their length.
MAX_INT_CHARS = 100

Path = tuple[Any, ...]

#: PyYAML's safe loader, in C (libyaml) when PyYAML was built with it: the same
#: events, nodes and marks, ten times faster. Only its parser and composer are used;
#: nothing is constructed from the node graph except plain scalars.
_LOADER: Any = getattr(yaml, "CSafeLoader", None) if yaml.__with_libyaml__ else None
_LOADER = _LOADER or yaml.SafeLoader

_TAG_PREFIX = "tag:yaml.org,2002:"
_INT_TAG = _TAG_PREFIX + "int"
#: Tags of plain data. A timestamp is kept as the text it was written as.
_PLAIN_TAGS = frozenset(
    _TAG_PREFIX + t for t in ("str", "int", "float", "bool", "null", "timestamp", "map", "seq")
)
#: YAML line breaks, as PyYAML counts lines.
LINE_BREAK = re.compile(r"\r\n|[\r\n\x85\u2028\u2029]")
#: Characters YAML does not allow in a stream. PyYAML compiled this pattern when it was
#: imported; reusing it saves compiling a large Unicode class at start-up.
_NON_PRINTABLE: re.Pattern[str] = yaml.reader.Reader.NON_PRINTABLE


@record(frozen=True)
class SourceProblem:
    """A problem found while reading the YAML, before its meaning is checked."""

    line: int
    column: int
    message: str
    code: str


@record
class YamlSource:
    """A read rules file: its text, its data, and the node behind each path."""

    text: str
    data: Any
    #: Path → node of the value at that path (the root is ``()``).
    values: dict[Path, Node] = field(default_factory=dict)
    #: Path → node of the key of a mapping entry.
    keys: dict[Path, Node] = field(default_factory=dict)
    #: Paths whose value was refused (a disallowed tag): their data is ``None``.
    refused: set[Path] = field(default_factory=set)
    #: Paths of mappings from which entries were dropped (merge keys, bad keys).
    incomplete: set[Path] = field(default_factory=set)
    _line_starts: list[int] | None = None

    def value_position(self, path: Path) -> tuple[int, int] | None:
        node = self.values.get(path)
        return None if node is None else mark_position(node.start_mark)

    def key_position(self, path: Path) -> tuple[int, int] | None:
        node = self.keys.get(path)
        return None if node is None else mark_position(node.start_mark)

    def position_of_index(self, index: int) -> tuple[int, int]:
        """1-based (line, column) of a character index in :attr:`text`."""
        if self._line_starts is None:
            self._line_starts = line_starts(self.text)
        row = bisect.bisect_right(self._line_starts, index) - 1
        return row + 1, index - self._line_starts[row] + 1


def line_starts(text: str) -> list[int]:
    return [0, *(m.end() for m in LINE_BREAK.finditer(text))]


def split_lines(text: str) -> list[str]:
    """The lines of ``text`` as YAML counts them (for showing a source line)."""
    return LINE_BREAK.split(text)


def long_integer_message(value: str) -> str:
    """Why an integer scalar of ``value`` is refused (see :data:`MAX_INT_CHARS`)."""
    shown = value if len(value) <= 20 else f"{value[:20]}..."
    return (
        f"integer {shown!r} is {len(value):,} characters long; integers are at most "
        f"{MAX_INT_CHARS} characters (quote it to make it text)"
    )


def mark_position(mark: Any) -> tuple[int, int]:
    return mark.line + 1, mark.column + 1


def short_tag(tag: str) -> str:
    return "!!" + tag[len(_TAG_PREFIX) :] if tag.startswith(_TAG_PREFIX) else tag


# -- 1. bytes -----------------------------------------------------------------------


def decode(raw: bytes) -> tuple[str | None, list[SourceProblem]]:
    """Check size, binary content and encoding; return the text without a BOM."""
    if len(raw) > MAX_BYTES:
        return None, [
            _whole_file(
                f"file is larger than the limit of {MAX_BYTES // 2**20} MiB "
                f"for rules files ({len(raw)} bytes)",
                "too-large",
            )
        ]
    if b"\x00" in raw:
        return None, [
            _whole_file(
                "binary file (contains NUL bytes); rules files are UTF-8 YAML text", "binary"
            )
        ]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = raw[: exc.start]
        line = before.count(b"\n") + 1
        column = len(before[before.rfind(b"\n") + 1 :].decode("utf-8", "replace")) + 1
        message = f"invalid UTF-8 (byte 0x{raw[exc.start]:02x}); rules files are UTF-8 text"
        return None, [SourceProblem(line, column, message, "encoding")]
    return text.removeprefix("\ufeff"), []


def _whole_file(message: str, code: str) -> SourceProblem:
    return SourceProblem(0, 0, message, code)


# -- 2. text ------------------------------------------------------------------------


def text_problems(text: str) -> list[SourceProblem]:
    """Problems visible in the raw text: size, control characters, tab indentation."""
    if len(text) > MAX_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        return [
            _whole_file(
                f"text is larger than the limit of {MAX_BYTES // 2**20} MiB for rules files",
                "too-large",
            )
        ]
    if "\x00" in text:
        return [
            _whole_file("binary content (NUL characters); rules files are YAML text", "binary")
        ]
    problems: list[SourceProblem] = []
    starts = line_starts(text)
    for m in _NON_PRINTABLE.finditer(text):
        row = bisect.bisect_right(starts, m.start()) - 1
        message = f"control character U+{ord(m.group()):04X} is not allowed in a rules file"
        problems.append(SourceProblem(row + 1, m.start() - starts[row] + 1, message, "encoding"))
        if len(problems) >= 10:  # one binary blob would otherwise yield thousands
            break
    if problems:
        return problems
    for row, line in enumerate(split_lines(text)):
        indent = len(line) - len(line.lstrip(" \t"))
        if "\t" in line[:indent] and line[indent:].strip():
            message = "tab character in indentation; YAML indents with spaces only"
            problems.append(SourceProblem(row + 1, line.index("\t") + 1, message, "tab"))
    return problems


# -- 3. pre-scan --------------------------------------------------------------------


_TOO_DEEP = f"nesting deeper than {MAX_DEPTH} levels is not allowed in a rules file"


def _yaml_problem(exc: Exception) -> SourceProblem:
    """A PyYAML exception as a positioned problem."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        line, column = mark_position(exc.problem_mark)
        if "nesting depth" in str(exc.problem):
            # Newer libyaml stops at its own depth limit while reading ahead, before
            # the pre-scan sees our (lower) limit: the same refusal, said our way.
            return SourceProblem(line, column, _TOO_DEEP, "too-deep")
        message = f"YAML syntax error: {exc.problem}"
        if exc.context and exc.context_mark is not None:
            message += f" ({exc.context} on line {exc.context_mark.line + 1})"
        return SourceProblem(line, column, message, "yaml")
    if isinstance(exc, yaml.reader.ReaderError):
        return SourceProblem(0, 0, f"unreadable YAML: {exc.reason}", "encoding")
    return SourceProblem(0, 0, f"YAML error: {exc}", "yaml")


class _Frame:
    __slots__ = ("size", "depth", "anchor")

    def __init__(self, anchor: str | None):
        self.size = 1
        self.depth = 1
        self.anchor = anchor


def prescan(text: str) -> list[SourceProblem]:
    """Walk the event stream without building anything; refuse what would be costly.

    Counts the nesting depth and, for aliases, the size and depth of what they stand
    for, so that a "billion laughs" file is refused at the alias that exceeds the
    limits instead of being expanded.
    """
    scan = _Prescan()
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            refused = scan.event(event)
            if refused is not None:
                line, column = mark_position(event.start_mark)
                return [SourceProblem(line, column, *refused)]
    except yaml.YAMLError as exc:
        return [_yaml_problem(exc)]
    return []


class _Prescan:
    """What :func:`prescan` knows of the events so far: the collections still open, the
    size and depth of every anchored node, and the counts that the limits bound."""

    __slots__ = ("anchors", "open_anchors", "stack", "expanded", "aliases", "documents")

    def __init__(self) -> None:
        #: name -> (values, depth) of the anchored node
        self.anchors: dict[str, tuple[int, int]] = {}
        #: Anchors of the collections still open: an alias to one of them is recursive.
        self.open_anchors: set[str] = set()
        self.stack: list[_Frame] = []
        #: Values that the aliases so far stand for.
        self.expanded = 0
        self.aliases = 0
        self.documents = 0

    def event(self, event: Any) -> tuple[str, str] | None:
        """Count one event; ``(message, code)`` when it breaks a limit."""
        # 1. A second document: a rules file is one, and saying so here is clearer than
        #    the composer's error.
        if isinstance(event, yaml.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                return "a rules file holds one YAML document; this starts a second one", "yaml"
        # 2. A mapping or list opens: refused past the depth limit before it is built.
        elif isinstance(event, yaml.CollectionStartEvent):
            if len(self.stack) >= MAX_DEPTH:
                return _TOO_DEEP, "too-deep"
            self.stack.append(_Frame(event.anchor))
            if event.anchor is not None:
                self.open_anchors.add(event.anchor)
        # 3. It closes: its size and depth are known now, for its parent and its anchor.
        elif isinstance(event, yaml.CollectionEndEvent):
            frame = self.stack.pop()
            self._done(frame.size, frame.depth, frame.anchor)
        # 4. A scalar: one value.
        elif isinstance(event, yaml.ScalarEvent):
            self._done(1, 0, event.anchor)
        # 5. An alias: as large and as deep as the node it names.
        elif isinstance(event, yaml.AliasEvent):
            refused = self._alias(event.anchor)
            if refused is not None:
                return refused
        # 6. Whatever the event, the aliases so far must not stand for too many values.
        if self.expanded > MAX_EXPANDED:
            return (
                f"aliases expand to more than {MAX_EXPANDED} values (an alias bomb?); "
                "refusing to read the file",
                "alias-limit",
            )
        return None

    def _alias(self, name: str | None) -> tuple[str, str] | None:
        """Case 5: an alias is refused before it is expanded: one too many, one to a node
        that contains it (expanding it would never end), one to no anchor, or one that
        would nest too deep where it stands. Else it counts as a copy of its node."""
        self.aliases += 1
        if self.aliases > MAX_ALIASES:
            return f"more than {MAX_ALIASES} aliases; refusing to expand them", "alias-limit"
        if name in self.open_anchors:
            return (
                f"alias '*{name}' refers to a node that contains it (a recursive structure)",
                "alias-limit",
            )
        if name not in self.anchors:
            return f"alias '*{name}' refers to no anchor '&{name}' defined before it", "yaml"
        size, depth = self.anchors[name]
        self.expanded += size
        if len(self.stack) + depth > MAX_DEPTH:
            return (
                f"alias '*{name}' expands to nesting deeper than {MAX_DEPTH} levels",
                "too-deep",
            )
        self._done(size, depth, None)
        return None

    def _done(self, size: int, depth: int, anchor: str | None) -> None:
        """A node is complete: remember its size and depth under its anchor, and add
        them to the collection that holds it."""
        if anchor is not None:
            self.anchors[anchor] = (size, depth)
            self.open_anchors.discard(anchor)
        if self.stack:
            parent = self.stack[-1]
            parent.size += size
            parent.depth = max(parent.depth, depth + 1)


# -- 4. compose and walk ------------------------------------------------------------


def read_yaml(text: str) -> tuple[YamlSource | None, list[SourceProblem]]:
    """Text → :class:`YamlSource`; ``None`` when the text cannot be read as YAML at all."""
    problems = text_problems(text) or prescan(text)
    if problems:
        return None, [_with_hint(text, p) for p in problems]
    try:
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        return None, [_with_hint(text, _yaml_problem(exc))]
    source = YamlSource(text=text, data=None)
    if root is not None:
        walker = _Walker(source)
        source.data = walker.walk(root, ())
        problems = walker.problems
    return source, problems


def _with_hint(text: str, problem: SourceProblem) -> SourceProblem:
    """A YAML syntax error inside an unquoted expression says to quote it (see
    :mod:`amm_rules.language.quoting`)."""
    if problem.code != "yaml" or problem.line <= 0:
        return problem
    from amm_rules.language.quoting import yaml_error_hint

    lines = split_lines(text)
    if problem.line > len(lines):
        return problem
    hint = yaml_error_hint(lines[problem.line - 1], problem.column, problem.message)
    if hint is None:
        return problem
    return SourceProblem(problem.line, problem.column, f"{problem.message}; {hint}", problem.code)


def _refused_key(node: Node) -> tuple[str, str] | None:
    """Why a mapping's key is not read (message and code), or None."""
    if node.tag == _TAG_PREFIX + "merge":
        return "merge keys ('<<') are not supported in rules files; write the fields out", "yaml"
    if not isinstance(node, ScalarNode):
        return "a key must be a plain name, not a list or mapping", "yaml"
    if node.tag not in _PLAIN_TAGS:
        return f"YAML tag '{short_tag(node.tag)}' is not allowed on a key", "yaml-tag"
    return None


class _Walker:
    """Node graph → plain data, recording nodes by path. Aliases are shared nodes in
    the graph and are walked once per path; :func:`prescan` bounded that expansion."""

    def __init__(self, source: YamlSource):
        self.source = source
        self.problems: list[SourceProblem] = []
        self.constructor = SafeConstructor()

    def problem(self, node: Node, message: str, code: str) -> None:
        line, column = mark_position(node.start_mark)
        self.problems.append(SourceProblem(line, column, message, code))

    def walk(self, node: Node, path: Path) -> Any:
        self.source.values[path] = node
        if node.tag not in _PLAIN_TAGS:
            self.problem(
                node,
                f"YAML tag '{short_tag(node.tag)}' is not allowed: rules files "
                "hold plain data (strings, numbers, booleans, lists, mappings)",
                "yaml-tag",
            )
            self.source.refused.add(path)
            return None
        if isinstance(node, ScalarNode):
            if node.tag == _INT_TAG and len(node.value) > MAX_INT_CHARS:
                self.problem(node, long_integer_message(node.value), "too-long")
                self.source.refused.add(path)
                return None
            return self.scalar(node)
        if isinstance(node, SequenceNode):
            return [self.walk(item, (*path, i)) for i, item in enumerate(node.value)]
        assert isinstance(node, MappingNode)
        out: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            refused = _refused_key(key_node)
            if refused is not None:
                self.problem(key_node, *refused)
                self.source.incomplete.add(path)
                continue
            key = key_node.value
            if key in first_line:
                self.problem(
                    key_node,
                    f"duplicate key '{key}' (first given on line {first_line[key]})",
                    "duplicate-key",
                )
                continue
            first_line[key] = key_node.start_mark.line + 1
            key_path = (*path, key)
            self.source.keys[key_path] = key_node
            out[key] = self.walk(value_node, key_path)
        return out

    def scalar(self, node: ScalarNode) -> Any:
        if node.tag == _TAG_PREFIX + "timestamp":
            return node.value
        try:
            return self.constructor.construct_object(node, deep=True)
        except Exception as exc:  # e.g. "!!int abc": report, never raise
            self.problem(
                node, f"cannot read {node.value!r} as {short_tag(node.tag)}: {exc}", "yaml"
            )
            return None
