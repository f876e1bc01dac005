"""Reading a package's imports with :mod:`ast` (nothing is imported) and checking its
layout: the checker behind ``tests/test_layout.py``.

:func:`read_tree` reads every import statement of every module of a package, with where
it stands: at ``module`` level (it runs when the module is imported; class bodies and
``try``/``if`` blocks included), in a ``function`` (it runs when the function is called),
or under ``if TYPE_CHECKING:`` (``type-checking``: it never runs).
``importlib.import_module`` on a literal string counts as an import where it stands.
``from a import b`` is an import of the module ``a.b`` when there is one, else of ``a``;
importing ``a.b`` also runs ``a/__init__.py``, which only the run-time closure of rule 2
follows (the cycle rules would otherwise see every package import its own modules back).

The rules, each reported as ``file:line: [rule] message``:

1. ``language``: nothing in the language package imports ``dask``, ``distributed`` (or a
   ``dask_*`` package), nor any module of the package outside the language package (the
   root package included). Every import counts, ``type-checking`` ones too: the language
   names no scheduler type.
2. ``no-distributed``: guarded modules never import ``dask`` or ``distributed``: not
   themselves (in any form, ``type-checking`` included), and not through what they import
   at run time (``module`` and ``function`` imports, followed through the package's modules
   and the ``__init__`` modules of their packages). A violation is reported at the first
   import of the chain, the line to change, and names the whole chain.
3. ``package-cycle``: the package's parts form a ladder, never a circle. The parts are the
   root module (``__init__.py``), each top-level module and each top-level subpackage, with
   its own subpackages inside it (``engine.rebalance`` is part of the engine). A part
   depends on another if any of its modules imports one of the other's, in any form:
   ``function`` imports (run as soon as they are called) and ``type-checking`` imports (a
   type named in a signature is a dependency a reader follows) count. No two parts depend
   on each other, directly or through others; the order is computed from the imports.
4. ``module-cycle``: no modules import each other, directly or through others, at run
   time: ``module`` imports only. An import in a function or under ``TYPE_CHECKING`` is how
   a module may reach one that imports it (rule 3 still sees it).
5. ``path`` (:func:`check_paths`, over scripts and tests rather than the package): nothing
   edits ``sys.path`` or loads a module from its file; shared code is imported as modules.

The engine's sections (:func:`check_sections_apart`, :func:`check_section_lookups`,
:func:`check_context_given`) have rules of their own: they share state on the engine's
context, never each other. :func:`check_types_enforced` reads the mypy configuration: no
part of the package is left unchecked.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Literal

Where = Literal["module", "function", "type-checking"]


@dataclass(frozen=True)
class Import:
    """One imported module, as resolved from one import statement."""

    #: The importing module (``amm_rules.engine.policy``) and its file, relative to the root.
    importer: str
    path: str
    line: int
    #: The imported module, absolute: ``a.b`` for ``import a.b`` and for ``from a import b``
    #: when ``a.b`` is a module of the scanned package, else ``a``.
    target: str
    where: Where

    @property
    def runs(self) -> bool:
        return self.where != "type-checking"

    def site(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.message}"


@dataclass
class Tree:
    """The modules of one package and the imports each makes."""

    #: module name -> file, relative to the directory holding the package.
    modules: dict[str, str] = field(default_factory=dict)
    imports: list[Import] = field(default_factory=list)

    def by_importer(self) -> dict[str, list[Import]]:
        out: dict[str, list[Import]] = defaultdict(list)
        for imp in self.imports:
            out[imp.importer].append(imp)
        return out


# -- reading imports ------------------------------------------------------------------------


def _module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


class _ImportReader(ast.NodeVisitor):
    """Collects the imports of one module, each with where it stands."""

    def __init__(self, module: str, path: str, is_package: bool, known: Iterable[str]):
        self.module = module
        self.path = path
        #: The package a relative import starts from.
        self.package = module if is_package else module.rpartition(".")[0]
        self.known = set(known)
        self.where: Where = "module"
        self.found: list[Import] = []

    def _add(self, line: int, target: str) -> None:
        imp = Import(self.module, self.path, line, target, self.where)
        if imp not in self.found[-1:]:  # ``from a import b, c``: one import of ``a``
            self.found.append(imp)

    def _visit_as(self, where: Where, nodes: Iterable[ast.AST]) -> None:
        outer = self.where
        # Nothing under TYPE_CHECKING runs, not even in a function.
        self.where = "type-checking" if outer == "type-checking" else where
        for node in nodes:
            self.visit(node)
        self.where = outer

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        # Decorators and defaults run where the function is defined; its body, when called.
        for expr in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
            if expr is not None:
                self.visit(expr)
        self._visit_as("function", node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_as("function", [node.body])

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._visit_as("type-checking", node.body)
            self._visit_as(self.where, node.orelse)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node.lineno, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        if base == "__future__":
            return
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            self._add(node.lineno, sub if sub in self.known else base)

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func) or ""
        if (
            name.split(".")[-1] == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            self._add(node.lineno, node.args[0].value)
        self.generic_visit(node)


def read_tree(root: Path, package: str) -> Tree:
    """Every module of ``root/package`` and its imports."""
    files = sorted((root / package).rglob("*.py"))
    tree = Tree({_module_name(p.relative_to(root)): p.relative_to(root).as_posix() for p in files})
    for name, rel in tree.modules.items():
        source = (root / rel).read_text(encoding="utf-8")
        reader = _ImportReader(name, rel, rel.endswith("__init__.py"), tree.modules)
        reader.visit(ast.parse(source, rel))
        tree.imports += reader.found
    return tree


# -- the rules ------------------------------------------------------------------------------


def within(module: str, package: str) -> bool:
    """``module`` is ``package`` or inside it."""
    return module == package or module.startswith(package + ".")


def _is_dask(module: str) -> bool:
    top = module.split(".")[0]
    return top in ("dask", "distributed") or top.startswith("dask_")


def _ancestors(module: str, package: str) -> Iterator[str]:
    """The packages whose ``__init__`` importing ``module`` runs, from the root down."""
    parts = module.split(".")
    for n in range(1, len(parts)):
        name = ".".join(parts[:n])
        if within(name, package):
            yield name


def check_language(tree: Tree, language: str, package: str) -> list[Violation]:
    """Rule 1: the language package imports neither dask nor the rest of the package."""
    out = []
    for imp in tree.imports:
        if not within(imp.importer, language):
            continue
        if _is_dask(imp.target):
            what = f"imports {imp.target} ({imp.where})"
        elif within(imp.target, package) and not within(imp.target, language):
            what = f"imports {imp.target}, outside {language} ({imp.where})"
        else:
            continue
        out.append(Violation(imp.path, imp.line, "language", what))
    return out


@dataclass(frozen=True)
class _Reach:
    """How a guarded module reaches another at run time."""

    #: Module names from the guarded module on.
    chain: tuple[str, ...]
    #: The last module of the chain is a guarded one.
    inside: bool = True
    #: The line to change: the import by which the chain last left the guarded modules
    #: (when it left them for the ``__init__`` of a package, that ``__init__``'s import).
    exit: Import | None = None
    #: The chain left through an ``__init__``: its next import is the line to change.
    pending: bool = False

    def then(self, name: str, imp: Import | None, guarded: set[str]) -> _Reach:
        """One step further: to ``name``, by ``imp`` or (``None``) as a package."""
        chain = (*self.chain, name if imp else f"{name} (its package)")
        if name in guarded:
            return _Reach(chain)
        if self.inside:
            return _Reach(chain, False, imp, imp is None)
        if self.pending and imp is not None:
            return _Reach(chain, False, imp)
        return _Reach(chain, False, self.exit, self.pending)


def check_no_dask(
    tree: Tree, guarded: Iterable[str], package: str, *, direct: bool = True
) -> list[Violation]:
    """Neither dask nor distributed, through run-time imports, nor (``direct``) in any
    form in the guarded modules themselves. One violation per line to change (a guarded
    module's import of dask, or where the chain leaves the guarded modules), with the
    shortest chain through it."""
    guarded = list(guarded)
    inside = set(guarded)
    by_importer = tree.by_importer()
    out = []
    #: line to change -> the guarded modules reaching dask through it, and how.
    reached: dict[Import, list[tuple[int, str, str]]] = defaultdict(list)
    for start in guarded:
        for imp in by_importer[start] if direct else ():
            if _is_dask(imp.target):
                what = f"{start} imports {imp.target} ({imp.where})"
                out.append(Violation(imp.path, imp.line, "no-distributed", what))
        # Breadth first through the package and the packages' __init__ modules.
        via = {start: _Reach((start,))}
        for name in _ancestors(start, package):
            via[name] = via[start].then(name, None, inside)
        queue = list(via)
        while queue:
            current = queue.pop(0)
            reach = via[current]
            for imp in by_importer.get(current, ()):
                if not imp.runs:
                    continue
                if current != start and _is_dask(imp.target):
                    chain = " -> ".join([*reach.chain, imp.target])
                    how = (
                        f"{start} imports {imp.target} at run time through {chain} ({imp.site()})"
                    )
                    site = imp if current in inside else reach.exit or imp
                    reached[site].append((len(reach.chain), how, start))
                for name in _ancestors(imp.target, package):
                    if name in tree.modules and name not in via:
                        via[name] = reach.then(name, None, inside)
                        queue.append(name)
                if imp.target in tree.modules and imp.target not in via:
                    via[imp.target] = reach.then(imp.target, imp, inside)
                    queue.append(imp.target)
    for site, hows in reached.items():
        _, how, _ = min(hows)
        n = len({start for _, _, start in hows}) - 1
        more = f" (and {n} more guarded module{'s' if n > 1 else ''})" if n else ""
        out.append(Violation(site.path, site.line, "no-distributed", how + more))
    return out


def _strongly_connected(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the graph's strongly connected components, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def _a_cycle(graph: Mapping[str, Iterable[str]], members: list[str]) -> list[str]:
    """The shortest cycle through ``members[0]`` inside one strongly connected component."""
    start, inside = members[0], set(members)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for succ in sorted(graph.get(node, ())):
            if succ == start:
                return [*paths[node], start]
            if succ in inside and succ not in paths:
                paths[succ] = [*paths[node], succ]
                queue.append(succ)
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover


def _cycles(
    edges: Mapping[tuple[str, str], list[Import]], rule: str, kind: str
) -> list[Violation]:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    out = []
    for members in _strongly_connected(graph):
        if len(members) == 1 and members[0] not in graph[members[0]]:
            continue
        cycle = _a_cycle(graph, members)
        steps = [
            f"{a} -> {b} ({', '.join(i.site() + ' ' + i.where for i in edges[a, b][:3])})"
            for a, b in pairwise(cycle)
        ]
        first = edges[cycle[0], cycle[1]][0]
        what = f"{kind} import each other: {' -> '.join(cycle)}; " + "; ".join(steps)
        out.append(Violation(first.path, first.line, rule, what))
    return out


def part_of(module: str, package: str) -> str:
    """The part of the package a module belongs to: the root, or a top-level module or
    subpackage (with everything inside it)."""
    rest = module[len(package) + 1 :].split(".")[0] if module != package else ""
    return f"{package}.{rest}" if rest else package


def check_package_cycles(tree: Tree, package: str) -> list[Violation]:
    """Rule 3: no cycle between the parts of the package, by any import."""
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in tree.imports:
        if not within(imp.target, package):
            continue
        a, b = part_of(imp.importer, package), part_of(imp.target, package)
        if a != b:
            edges[a, b].append(imp)
    return _cycles(edges, "package-cycle", "parts of the package")


def check_module_cycles(tree: Tree, package: str) -> list[Violation]:
    """Rule 4: no cycle of module-level imports."""
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in tree.imports:
        if imp.where == "module" and imp.target in tree.modules:
            edges[imp.importer, imp.target].append(imp)
    return _cycles(edges, "module-cycle", "modules")


def check_package(tree: Tree, package: str, language: str, pure: Iterable[str]) -> list[Violation]:
    """Rules 1 to 4. Rule 2 guards the language package through its run-time imports
    (rule 1 covers its own imports) and the ``pure`` modules in every way."""
    language_modules = [m for m in tree.modules if within(m, language)]
    return [
        *check_language(tree, language, package),
        *check_no_dask(tree, language_modules, package, direct=False),
        *check_no_dask(tree, pure, package),
        *check_package_cycles(tree, package),
        *check_module_cycles(tree, package),
    ]


#: Calls that put a directory on the import path or load a module from a file.
PATH_CALLS = ("spec_from_file_location", "SourceFileLoader", "run_path", "load_source")


def check_paths(root: Path, dirs: Iterable[str]) -> list[Violation]:
    """Rule 5: no ``sys.path`` edits, no loading a module from its file."""
    out = []
    for top in dirs:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
                if isinstance(node, ast.Call):
                    name = _dotted(node.func) or ""
                    if name.startswith("sys.path.") or name.split(".")[-1] in PATH_CALLS:
                        out.append(Violation(rel, node.lineno, "path", f"calls {name}"))
                targets = (
                    node.targets
                    if isinstance(node, ast.Assign)
                    else [node.target]
                    if isinstance(node, ast.AugAssign)
                    else []
                )
                for target in targets:
                    if isinstance(target, ast.Subscript):
                        target = target.value
                    if _dotted(target) == "sys.path":
                        out.append(Violation(rel, node.lineno, "path", "assigns sys.path"))
    return out


def check_engine_cycles(
    tree: Tree, engine: str, what: str = "modules of the engine"
) -> list[Violation]:
    """Rule 6: no cycle of modules inside ``engine`` (or another part of the package,
    ``what``), by any import (``module``, ``function`` or ``type-checking``): a module
    that names another's type in a signature depends on it as much as one that calls
    it."""
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imp in tree.imports:
        a, b = imp.importer, imp.target
        inside = within(a, engine) and within(b, engine) and b in tree.modules
        # (A module importing its own package's __init__ is not a dependency.)
        if inside and a != b and b != engine and not a.startswith(f"{b}."):
            edges[a, b].append(imp)
    return _cycles(edges, "engine-cycle", what)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _definitions(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, module and class variables,
    and attributes it sets on ``self``/``cls``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        out.add(t.id)
                    elif isinstance(t, ast.Attribute):
                        out.add(t.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)  # __slots__ entries
    return {n for n in out if _private(n)}


def check_private_reads(root: Path, package: str) -> list[Violation]:
    """Rule 7: no module reads a private name (``_x``, not ``__x__``) that another module of
    the package defines: not as an attribute of something other than ``self``/``cls``
    (``policy._manager``), nor by importing it (``from .a import _helper``). What one part
    needs of another is public; a name defined in both modules is passed over."""
    trees: dict[str, tuple[str, ast.AST]] = {}
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root)
        trees[_module_name(rel)] = (rel.as_posix(), ast.parse(path.read_text(encoding="utf-8")))
    defined = {module: _definitions(t) for module, (_, t) in trees.items()}
    anywhere = set().union(*defined.values()) if defined else set()
    out = []
    for module, (rel, t) in trees.items():
        mine = defined[module]
        for node in ast.walk(t):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if node.attr in anywhere and node.attr not in mine:
                    what = _dotted(node) or f"....{node.attr}"
                    out.append(Violation(rel, node.lineno, "private", f"reads {what}"))
            elif isinstance(node, ast.ImportFrom) and node.module and within(node.module, package):
                for alias in node.names:
                    if _private(alias.name) and alias.name not in mine:
                        what = f"{node.module}.{alias.name}"
                        out.append(Violation(rel, node.lineno, "private", f"imports {what}"))
    return out


#: Longest class and function (lines, decorators excluded) the package may hold.
CLASS_LINES, FUNCTION_LINES = 500, 100


def check_sizes(root: Path, package: str) -> list[Violation]:
    """Rule 8: no class longer than :data:`CLASS_LINES`, no function longer than
    :data:`FUNCTION_LINES`: split a function into a numbered dispatcher and a helper per
    case, a class along its seams."""
    out = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                limit = CLASS_LINES if isinstance(node, ast.ClassDef) else FUNCTION_LINES
                if lines > limit:
                    kind = "class" if isinstance(node, ast.ClassDef) else "function"
                    what = f"{kind} {node.name} has {lines} lines (at most {limit})"
                    out.append(Violation(rel, node.lineno, "size", what))
    return out


def check_benchmarks_apart(root: Path, benchmarks: str, tests: str) -> list[Violation]:
    """Rule 9: nothing under ``benchmarks`` imports ``tests``: a benchmark never depends on
    the test suite (shared helpers live in ``benchmarks/support``, which tests may use)."""
    out = []
    for path in sorted((root / benchmarks).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                if name == tests or name.startswith(f"{tests}."):
                    out.append(Violation(rel, node.lineno, "benchmarks", f"imports {name}"))
    return out


def check_sections_apart(tree: Tree, sections: str) -> list[Violation]:
    """Rule 10: no module of the ``sections`` package imports another section module, by
    any import (``type-checking`` and ``function`` ones too). The contract
    (``sections.base``) is every section's to import; the package itself (its
    ``__init__``: the order of the cycle) imports them all."""
    base = f"{sections}.base"
    out = []
    for imp in tree.imports:
        a, b = imp.importer, imp.target
        if a == sections or not within(a, sections) or not within(b, sections):
            continue
        if b in (a, base, sections) or b not in tree.modules:
            continue
        message = f"{a} imports {b}: sections share state on the context, never each other"
        out.append(Violation(imp.path, imp.line, "sections", message))
    return out


#: Methods that look a section up by its class.
LOOKUPS = ("find", "section")


def check_section_lookups(root: Path, package: str, allowed: Iterable[str]) -> list[Violation]:
    """Rule 11: no section is looked up by its class (``x.find(Cls)``, ``x.section(Cls)``,
    the argument a capitalized name) outside the ``allowed`` files (the policy, which
    owns the sections); and nobody asks the engine's context for a section
    (``ctx.find(...)``, ``self.ctx.section(...)``), whatever the argument."""
    skip = set(allowed)
    out = []
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            if node.func.attr not in LOOKUPS:
                continue
            owner = _dotted(node.func.value) or ""
            by_class = bool(
                node.args and isinstance(node.args[0], ast.Name) and node.args[0].id[:1].isupper()
            )
            on_context = owner == "ctx" or owner.endswith(".ctx")
            if on_context or (by_class and rel not in skip):
                what = f"{owner or '...'}.{node.func.attr}(...)"
                out.append(Violation(rel, node.lineno, "lookup", f"looks a section up: {what}"))
    return out


def _is_context(node: ast.expr | None) -> bool:
    """``ctx``, ``self.ctx`` or ``anything.ctx``."""
    name = _dotted(node) if node is not None else None
    return name is not None and (name == "ctx" or name.endswith(".ctx"))


def check_context_given(root: Path, sections: Path) -> list[Violation]:
    """Rule 12: a section's context is never optional: in the modules under ``sections``
    (a directory relative to ``root``) no annotation allows ``None`` for the context
    (``EngineContext | None``, ``Optional[EngineContext]``) and nothing compares the
    context with ``None`` (``ctx is None``, ``self.ctx is not None``)."""
    out = []
    for path in sorted((root / sections).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            annotation = None
            if isinstance(node, (ast.AnnAssign, ast.arg)):
                annotation = node.annotation
            if annotation is not None:
                text = ast.unparse(annotation).replace(" ", "").strip("'\"")
                optional = {"EngineContext|None", "None|EngineContext"}
                if text in optional or text == "Optional[EngineContext]":
                    out.append(Violation(rel, node.lineno, "context", f"annotated {text}"))
            if isinstance(node, ast.Compare) and any(
                isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops
            ):
                sides = [node.left, *node.comparators]
                nones = [isinstance(x, ast.Constant) and x.value is None for x in sides]
                if any(nones) and any(_is_context(x) for x in sides):
                    what = ast.unparse(node)
                    out.append(Violation(rel, node.lineno, "context", f"compares {what}"))
    return out


def check_types_enforced(root: Path, pyproject: str, package: str) -> list[Violation]:
    """Rule 13: mypy's errors count everywhere in the package: no ``ignore_errors = true``
    in a ``[tool.mypy]`` table of ``pyproject`` (the whole configuration, or an override
    for some modules), and no module opts out by a ``# mypy: ignore-errors`` comment. A
    line's own ``# type: ignore[code]``, with its reason, is how a false error is kept."""
    out = []
    table = ""
    for number, line in enumerate((root / pyproject).read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if text.startswith("["):
            table = text.strip("[]").strip()
        elif table.startswith("tool.mypy") and text.replace(" ", "") == "ignore_errors=true":
            out.append(Violation(pyproject, number, "types", f"ignore_errors in [{table}]"))
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip().replace(" ", "").startswith("#mypy:ignore-errors"):
                out.append(Violation(rel, number, "types", "the module's errors are ignored"))
    return out
