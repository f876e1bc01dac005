"""The package's layout, kept by reading its imports with :mod:`ast` (nothing is imported).

The checker and the precise rules are in :mod:`tests.support.layout`; in short, a test
fails, naming ``file:line`` and the rule, when

1. anything under ``amm_rules/language/`` imports ``dask``, ``distributed`` or any part of
   ``amm_rules`` outside ``amm_rules.language`` (``TYPE_CHECKING`` imports too);
2. the language half, or one of the engine's pure parts (``engine/decide/``,
   ``engine/rebalance/plan.py``), imports
   ``dask`` or ``distributed``, itself or through what it imports at run time;
3. a part of the package (the root module, ``language``, ``engine`` with ``engine.rebalance``
   inside it, ``client``, ``cli``, ``demo``, ...) imports another that imports it back,
   directly or through others, by any import (``TYPE_CHECKING`` and in functions too): the
   parts form a ladder, computed from the imports;
4. modules import each other, directly or through others, at run time (module-level
   imports; those in functions and under ``TYPE_CHECKING`` are exempt);
5. anything in ``tests/`` or ``benchmarks/`` edits ``sys.path`` or loads a module by its
   file path;
6. two modules of the engine, or of the language half, import each other, directly or
   through others, by any import (``TYPE_CHECKING`` and in functions too);
7. a module reads a private name (``_x``) that another module of the package defines,
   as an attribute of something other than ``self``/``cls`` or by importing it;
8. a class is longer than 500 lines, or a function than 100;
9. anything in ``benchmarks/`` imports ``tests`` (shared helpers live in
   ``benchmarks/support/``, which tests may import);
10. a module of ``engine/sections/`` imports another section module (they share state on
    the engine's context: the ledger, the claims, the workers leaving);
11. a section is looked up by its class (``x.find(Cls)``, ``x.section(Cls)``) outside the
    policy, or anyone asks the engine's context for a section (``ctx.find(...)``);
12. a section's context may be ``None``: an ``EngineContext | None`` annotation, or a
    comparison of the context with ``None``, under ``engine/sections/``.
13. mypy's errors are ignored somewhere in the package: ``ignore_errors = true`` in a
    ``[tool.mypy]`` table of ``pyproject.toml`` (an override too), or a module's
    ``# mypy: ignore-errors``.

The checker first runs on small trees written to a temporary directory, one planted
violation of each rule and a clean tree that must pass, so that a clean result means a
clean package and not a blind checker; and the scan of the real package must find the
modules the rules name.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.support.layout import (
    Tree,
    Violation,
    check_benchmarks_apart,
    check_context_given,
    check_engine_cycles,
    check_language,
    check_module_cycles,
    check_no_dask,
    check_package,
    check_package_cycles,
    check_paths,
    check_private_reads,
    check_section_lookups,
    check_sections_apart,
    check_sizes,
    check_types_enforced,
    read_tree,
    within,
)

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "amm_rules"
LANGUAGE = "amm_rules.language"
ENGINE = "amm_rules.engine"
#: The engine's pure parts: run by tests, hypothesis and the benchmarks without a cluster.
PURE = (
    "amm_rules.engine.decide",
    "amm_rules.engine.decide.plan",
    "amm_rules.engine.decide.view",
    "amm_rules.engine.decide.deciders",
    "amm_rules.engine.decide.classify",
    "amm_rules.engine.decide.classify_budget",
    "amm_rules.engine.decide.evacuate",
    "amm_rules.engine.decide.protect",
    "amm_rules.engine.decide.drain",
    "amm_rules.engine.rebalance.plan",
)
#: Where shared code is imported as modules (rule 5).
SCRIPT_DIRS = ("tests", "benchmarks")
#: The engine's sections, and the one module that may look a section up by its class.
SECTIONS = "amm_rules.engine.sections"
POLICY = "amm_rules/engine/policy.py"


# -- the package ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def package() -> Tree:
    return read_tree(REPO, PACKAGE)


def test_the_scan_finds_the_modules_the_rules_name(package: Tree) -> None:
    assert set(PURE) <= set(package.modules), "a pure module moved: update PURE"
    assert len([m for m in package.modules if within(m, LANGUAGE)]) >= 10
    assert {"amm_rules", "amm_rules.engine.policy", "amm_rules.cli"} <= set(package.modules)
    # Imports of every kind are seen, so a rule that skips some kinds is not vacuous.
    kinds = {i.where for i in package.imports if within(i.target, PACKAGE)}
    assert kinds == {"module", "function", "type-checking"}


def test_the_language_half_imports_only_itself(package: Tree) -> None:
    found = check_language(package, LANGUAGE, PACKAGE)
    assert not found, "\n".join(map(str, found))


def test_the_language_and_the_pure_parts_never_import_distributed(package: Tree) -> None:
    language = [m for m in package.modules if within(m, LANGUAGE)]
    found = check_no_dask(package, language, PACKAGE, direct=False)
    found += check_no_dask(package, PURE, PACKAGE)
    assert not found, "\n".join(map(str, found))


def test_the_parts_of_the_package_form_a_ladder(package: Tree) -> None:
    found = check_package_cycles(package, PACKAGE)
    assert not found, "\n".join(map(str, found))


def test_no_modules_import_each_other_at_run_time(package: Tree) -> None:
    found = check_module_cycles(package, PACKAGE)
    assert not found, "\n".join(map(str, found))


def test_no_modules_of_the_engine_import_each_other_by_any_import(package: Tree) -> None:
    found = check_engine_cycles(package, ENGINE)
    assert not found, "\n".join(map(str, found))


def test_no_modules_of_the_language_import_each_other_by_any_import(package: Tree) -> None:
    found = check_engine_cycles(package, LANGUAGE, "modules of the language")
    assert not found, "\n".join(map(str, found))


def test_no_module_reads_a_private_name_of_another() -> None:
    found = check_private_reads(REPO, PACKAGE)
    assert not found, "\n".join(map(str, found))


def test_no_class_or_function_is_too_long() -> None:
    found = check_sizes(REPO, PACKAGE)
    assert not found, "\n".join(map(str, found))


def test_benchmarks_import_nothing_from_the_tests() -> None:
    found = check_benchmarks_apart(REPO, "benchmarks", "tests")
    assert not found, "\n".join(map(str, found))


def test_no_section_imports_another(package: Tree) -> None:
    assert len([m for m in package.modules if within(m, SECTIONS)]) >= 15
    found = check_sections_apart(package, SECTIONS)
    assert not found, "\n".join(map(str, found))


def test_no_section_is_looked_up_by_class_outside_the_policy() -> None:
    found = check_section_lookups(REPO, PACKAGE, [POLICY])
    assert not found, "\n".join(map(str, found))


def test_a_sections_context_is_never_optional() -> None:
    found = check_context_given(REPO, Path(PACKAGE, "engine", "sections"))
    assert not found, "\n".join(map(str, found))


def test_no_part_of_the_package_is_left_unchecked_by_mypy() -> None:
    found = check_types_enforced(REPO, "pyproject.toml", PACKAGE)
    assert not found, "\n".join(map(str, found))


def test_tests_and_benchmarks_import_shared_code_as_modules() -> None:
    found = check_paths(REPO, SCRIPT_DIRS)
    assert not found, "\n".join(map(str, found))


# -- the checker, on planted violations -----------------------------------------------------


def write_tree(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for directory in {(root / rel).parent for rel in files}:
        while directory != root and not (directory / "__init__.py").exists():
            (directory / "__init__.py").write_text("")
            directory = directory.parent


CLEAN = {
    "pkg/__init__.py": (
        "from typing import TYPE_CHECKING\nfrom pkg.language.rules import Rules\n"
        "if TYPE_CHECKING:\n    from pkg.engine.policy import Policy\n"
    ),
    "pkg/language/rules.py": "import yaml\nfrom .expr import compile\nclass Rules: ...\n",
    "pkg/language/expr/__init__.py": "from pkg.language.expr.parser import compile\n",
    "pkg/language/expr/parser.py": "def compile():\n    from pkg.language import rules\n",
    "pkg/engine/planner.py": (
        "from pkg.engine.view import View\nfrom pkg.language.rules import Rules\n"
    ),
    "pkg/engine/view.py": "from typing import TYPE_CHECKING\nclass View: ...\n",
    "pkg/engine/policy.py": (
        "import distributed\nfrom pkg.engine.rebalance.rebalancer import Rebalancer\n"
        "def attach():\n    from pkg.engine.handlers import register\n"
    ),
    "pkg/engine/handlers.py": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from pkg.engine.policy import Policy\n"
    ),
    "pkg/engine/rebalance/rebalancer.py": (
        "from pkg.engine.view import View\nclass Rebalancer: ...\n"
    ),
    "pkg/client.py": (
        "import dask\nfrom pkg.language.rules import Rules\n"
        "def explain():\n    from pkg.engine.view import View\n"
    ),
    "pkg/cli.py": (
        "import importlib\nfrom pkg import Rules\n"
        "def demo():\n    importlib.import_module('pkg.demo')\n"
    ),
    "pkg/demo.py": "from pkg.client import annotate\n",
}
CLEAN_PURE = ("pkg.engine.planner", "pkg.engine.view")


def violations(tmp_path: Path, files: Mapping[str, str]) -> list[Violation]:
    write_tree(tmp_path, files)
    return check_package(read_tree(tmp_path, "pkg"), "pkg", "pkg.language", CLEAN_PURE)


def test_a_clean_tree_passes(tmp_path: Path) -> None:
    """Two-way imports through functions or TYPE_CHECKING, a subpackage importing its
    parent, relative imports: none of them is a violation."""
    assert violations(tmp_path, CLEAN) == []


@pytest.mark.parametrize(
    ("planted", "expected"),
    [
        pytest.param(
            {"pkg/language/rules.py": "import yaml\n\n\ndef f():\n    import distributed\n"},
            [
                "pkg/language/rules.py:5: [language] imports distributed (function)",
                # The language modules that import it, reported once, at the line to change.
                "pkg/language/rules.py:5: [no-distributed] pkg.language.expr.parser imports"
                " distributed at run time through pkg.language.expr.parser ->"
                " pkg.language.rules -> distributed (pkg/language/rules.py:5)"
                " (and 2 more guarded modules)",
                # The pure modules, at the import by which they leave the pure ones.
                "pkg/engine/planner.py:2: [no-distributed] pkg.engine.planner imports"
                " distributed at run time through pkg.engine.planner -> pkg.language.rules",
                "pkg/__init__.py:2: [no-distributed] pkg.engine.view imports distributed at run"
                " time through pkg.engine.view -> pkg (its package) -> pkg.language.rules",
            ],
            id="language-function-import",
        ),
        pytest.param(
            {"pkg/language/expr/parser.py": "if TYPE_CHECKING:\n    from dask import delayed\n"},
            ["pkg/language/expr/parser.py:2: [language] imports dask (type-checking)"],
            id="language-type-checking",
        ),
        pytest.param(
            {"pkg/language/rules.py": "from pkg import __version__\n"},
            [
                "pkg/language/rules.py:1: [language] imports pkg, outside pkg.language (module)",
                "pkg/__init__.py:2: [package-cycle] parts of the package import each other:"
                " pkg -> pkg.language -> pkg; pkg -> pkg.language (pkg/__init__.py:2 module);"
                " pkg.language -> pkg (pkg/language/rules.py:1 module)",
                "pkg/__init__.py:2: [module-cycle] modules import each other:"
                " pkg -> pkg.language.rules -> pkg;",
            ],
            id="language-imports-the-root",
        ),
        pytest.param(
            {"pkg/language/rules.py": "from ..engine import view\n"},
            [
                "pkg/language/rules.py:1: [language] imports pkg.engine.view, outside",
                "pkg/engine/planner.py:2: [package-cycle] parts of the package import each"
                " other: pkg.engine -> pkg.language -> pkg.engine;",
            ],
            id="language-relative-import",
        ),
        pytest.param(
            {"pkg/language/rules.py": "if TYPE_CHECKING:\n    from pkg.cli import main\n"},
            [
                "pkg/language/rules.py:2: [language] imports pkg.cli, outside pkg.language",
                "pkg/__init__.py:2: [package-cycle] parts of the package import each other:"
                " pkg -> pkg.language -> pkg.cli -> pkg; pkg -> pkg.language"
                " (pkg/__init__.py:2 module); pkg.language -> pkg.cli (pkg/language/rules.py:2"
                " type-checking); pkg.cli -> pkg (pkg/cli.py:2 module)",
            ],
            id="package-cycle-type-checking",
        ),
        pytest.param(
            {"pkg/engine/view.py": "if TYPE_CHECKING:\n    from distributed import Scheduler\n"},
            ["pkg/engine/view.py:2: [no-distributed] pkg.engine.view imports distributed"],
            id="pure-type-checking",
        ),
        pytest.param(
            {
                "pkg/engine/view.py": "def f():\n    from pkg.engine import index\n",
                "pkg/engine/index.py": "from distributed.diagnostics import plugin\n",
            },
            [
                "pkg/engine/view.py:2: [no-distributed] pkg.engine.view imports"
                " distributed.diagnostics at run time through pkg.engine.view ->"
                " pkg.engine.index -> distributed.diagnostics (pkg/engine/index.py:1)"
                " (and 1 more guarded module)",
            ],
            id="pure-through-another-module",
        ),
        pytest.param(
            {"pkg/engine/__init__.py": "from pkg.engine.policy import Policy\n"},
            [
                "pkg/engine/__init__.py:1: [no-distributed] pkg.engine.planner imports"
                " distributed at run time through pkg.engine.planner -> pkg.engine (its"
                " package) -> pkg.engine.policy -> distributed (pkg/engine/policy.py:1)"
                " (and 1 more guarded module)",
            ],
            id="pure-through-its-package",
        ),
        pytest.param(
            {"pkg/engine/view.py": "def f():\n    from pkg.client import annotate\n"},
            [
                "pkg/client.py:4: [package-cycle] parts of the package import each other:"
                " pkg.client -> pkg.engine -> pkg.client;"
                " pkg.client -> pkg.engine (pkg/client.py:4 function);"
                " pkg.engine -> pkg.client (pkg/engine/view.py:2 function)",
                "pkg/engine/view.py:2: [no-distributed] pkg.engine.view imports dask at run time"
                " through pkg.engine.view -> pkg.client -> dask (pkg/client.py:1)"
                " (and 1 more guarded module)",
            ],
            id="package-cycle-function",
        ),
        pytest.param(
            {
                "pkg/engine/a.py": "import pkg.engine.b\n",
                "pkg/engine/b.py": "try:\n    from pkg.engine import c\nexcept ImportError: ...\n",
                "pkg/engine/c.py": "class C:\n    from pkg.engine.a import x\n",
            },
            [
                "pkg/engine/a.py:1: [module-cycle] modules import each other:"
                " pkg.engine.a -> pkg.engine.b -> pkg.engine.c -> pkg.engine.a;"
                " pkg.engine.a -> pkg.engine.b (pkg/engine/a.py:1 module);"
                " pkg.engine.b -> pkg.engine.c (pkg/engine/b.py:2 module);"
                " pkg.engine.c -> pkg.engine.a (pkg/engine/c.py:2 module)"
            ],
            id="module-cycle",
        ),
    ],
)
def test_each_rule_catches_a_planted_violation(
    tmp_path: Path, planted: Mapping[str, str], expected: list[str]
) -> None:
    found = sorted(map(str, violations(tmp_path, {**CLEAN, **planted})))
    assert len(found) == len(expected), "\n".join(found)
    for start in expected:
        assert any(line.startswith(start) for line in found), f"{start!r} not in {found}"


def test_path_edits_and_loading_by_file_path_are_caught(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "tests/test_x.py": "import sys\nsys.path.insert(0, 'tests')\nsys.path += ['x']\n",
            "benchmarks/b.py": (
                "import importlib.util as u\nspec = u.spec_from_file_location('s', 'b.py')\n"
            ),
            "benchmarks/ok.py": "from tests.support import cluster\n",
        },
    )
    found = sorted(str(v) for v in check_paths(tmp_path, SCRIPT_DIRS))
    assert found == [
        "benchmarks/b.py:2: [path] calls u.spec_from_file_location",
        "tests/test_x.py:2: [path] calls sys.path.insert",
        "tests/test_x.py:3: [path] assigns sys.path",
    ]


def test_an_engine_cycle_through_type_checking_imports_is_caught(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/engine/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from pkg.engine.b import B\n",
            "pkg/engine/b.py": "def f():\n    from pkg.engine.a import A\n",
            "pkg/engine/c.py": "from pkg.engine import a\n",  # one way only: fine
        },
    )
    found = [str(v) for v in check_engine_cycles(read_tree(tmp_path, "pkg"), "pkg.engine")]
    assert len(found) == 1 and found[0].startswith(
        "pkg/engine/a.py:3: [engine-cycle] modules of the engine import each other:"
        " pkg.engine.a -> pkg.engine.b -> pkg.engine.a"
    ), found


def test_reading_or_importing_another_modules_private_name_is_caught(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/a.py": "class A:\n    def __init__(self):\n        self._secret = 1\n"
            "    def _helper(self):\n        return self._secret\n"
            "def _util():\n    return A()._secret\n",  # the same module: fine
            "pkg/b.py": "from pkg.a import A, _util\n\ndef f(a: A):\n"
            "    return a._secret, a.__dict__, a._unknown_to_the_package\n",
        },
    )
    found = sorted(str(v) for v in check_private_reads(tmp_path, "pkg"))
    assert found == [
        "pkg/b.py:1: [private] imports pkg.a._util",
        "pkg/b.py:4: [private] reads a._secret",
    ]


def test_long_classes_and_functions_are_caught(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(101))  # a function of 102 lines
    methods = "".join(f"    def m{i}(self):\n        return {i}\n" for i in range(250))
    short = "".join(f"    def m{i}(self):\n        return {i}\n" for i in range(249))
    write_tree(
        tmp_path,
        {
            "pkg/long.py": f"def f():\n{body}\n\nclass C:\n{methods}",  # C: 501 lines
            "pkg/fits.py": f"class D:\n{short}",  # 499 lines
        },
    )
    found = [str(v) for v in sorted(check_sizes(tmp_path, "pkg"), key=lambda v: v.line)]
    assert found == [
        "pkg/long.py:1: [size] function f has 102 lines (at most 100)",
        "pkg/long.py:105: [size] class C has 501 lines (at most 500)",
    ]


def test_a_benchmark_importing_the_tests_is_caught(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "benchmarks/b.py": "import tests.support.cluster\nfrom tests import x\n",
            "benchmarks/ok.py": "from benchmarks.support import cluster\nfrom .b import y\n",
        },
    )
    found = sorted(str(v) for v in check_benchmarks_apart(tmp_path, "benchmarks", "tests"))
    assert found == [
        "benchmarks/b.py:1: [benchmarks] imports tests.support.cluster",
        "benchmarks/b.py:2: [benchmarks] imports tests",
    ]


def test_a_section_importing_another_is_caught(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/engine/sections/__init__.py": "from pkg.engine.sections.a import A\n",
            "pkg/engine/sections/base.py": "class Section: ...\n",
            "pkg/engine/sections/a.py": (
                "from pkg.engine.sections.base import Section\n"
                "from pkg.engine import context\n"
                "class A(Section): ...\n"
            ),
            "pkg/engine/sections/b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from pkg.engine.sections.a import A\n"
                "def f():\n    from pkg.engine.sections import a\n"
            ),
            "pkg/engine/context.py": "class EngineContext: ...\n",
        },
    )
    found = sorted(
        str(v) for v in check_sections_apart(read_tree(tmp_path, "pkg"), "pkg.engine.sections")
    )
    assert found == [
        "pkg/engine/sections/b.py:3: [sections] pkg.engine.sections.b imports"
        " pkg.engine.sections.a: sections share state on the context, never each other",
        "pkg/engine/sections/b.py:5: [sections] pkg.engine.sections.b imports"
        " pkg.engine.sections.a: sections share state on the context, never each other",
    ]


def test_a_section_looked_up_by_class_is_caught(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/engine/policy.py": "def f(self):\n    return self.section(Replication)\n",
            "pkg/engine/sections/r.py": (
                "def f(self):\n    return self.ctx.find(Drain)\n"
                "def g(ctx):\n    return ctx.section('drain')\n"
                "def h(text):\n    return text.find('x'), text.find(sep)\n"
            ),
            "pkg/observe/status.py": "def f(policy):\n    return policy.section(Drain)\n",
        },
    )
    found = sorted(
        str(v) for v in check_section_lookups(tmp_path, "pkg", ["pkg/engine/policy.py"])
    )
    assert found == [
        "pkg/engine/sections/r.py:2: [lookup] looks a section up: self.ctx.find(...)",
        "pkg/engine/sections/r.py:4: [lookup] looks a section up: ctx.section(...)",
        "pkg/observe/status.py:2: [lookup] looks a section up: policy.section(...)",
    ]


def test_an_optional_context_is_caught(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pkg/engine/sections/s.py": (
                "class S:\n"
                "    ctx: EngineContext | None = None\n"
                "    def attach(self, ctx: 'Optional[EngineContext]') -> None:\n"
                "        if self.ctx is not None and ctx is None:\n"
                "            return\n"
                "    def fine(self, ctx: EngineContext, other: int | None) -> None:\n"
                "        if other is None or self.ctx.manager is None:\n"
                "            return\n"
            ),
        },
    )
    found = sorted(str(v) for v in check_context_given(tmp_path, Path("pkg/engine/sections")))
    assert found == [
        "pkg/engine/sections/s.py:2: [context] annotated EngineContext|None",
        "pkg/engine/sections/s.py:3: [context] annotated Optional[EngineContext]",
        "pkg/engine/sections/s.py:4: [context] compares ctx is None",
        "pkg/engine/sections/s.py:4: [context] compares self.ctx is not None",
    ]


def test_ignored_type_errors_are_caught(tmp_path: Path) -> None:
    write_tree(
        tmp_path,
        {
            "pyproject.toml": (
                "[tool.ruff]\nignore_errors = true\n"
                "[tool.mypy]\nfiles = ['pkg']\n"
                "[[tool.mypy.overrides]]\nmodule = ['pkg.engine.*']\n"
                "ignore_errors = true  # for now\n"
                "[[tool.mypy.overrides]]\nmodule = ['pkg.x']\nignore_errors = false\n"
                "# ignore_errors = true\n"
            ),
            "pkg/a.py": "# mypy: ignore-errors\nx: int = 'a'\n",
            "pkg/b.py": "x: int = 'a'  # type: ignore[assignment]  # a reason\n",
        },
    )
    found = sorted(str(v) for v in check_types_enforced(tmp_path, "pyproject.toml", "pkg"))
    assert found == [
        "pkg/a.py:1: [types] the module's errors are ignored",
        "pyproject.toml:7: [types] ignore_errors in [tool.mypy.overrides]",
    ]
