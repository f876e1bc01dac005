"""The ``amm-rules`` command line (also ``python -m amm_rules``).

Commands: ``validate`` (check rules files, report every problem), ``schema`` (print the
JSON Schema for editors) and ``demo`` (run :mod:`amm_rules.demo`, or validate the
shipped examples when that module is not there).

This module and everything ``validate`` needs belong to the language half: nothing
here imports ``distributed``, and heavy imports are made inside the commands, so the
command starts about as fast as its parsing dependencies import.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from amm_rules import __version__

FORMATS = ("text", "json", "github")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(version=__version__, prog_name="amm-rules")
def main() -> None:
    """Declarative rules for Dask's Active Memory Manager."""


@main.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="text",
    show_default=True,
    help="Output format.",
)
@click.option("--strict", is_flag=True, help="Fail (exit 1) on warnings too.")
def validate(files: tuple[str, ...], fmt: str, strict: bool) -> None:
    """Check rules files and report every problem.

    Exit status: 0 when no file has errors (warnings allowed unless --strict),
    1 when any file has errors (with --strict: errors or warnings), 2 for usage
    errors.
    """
    sys.exit(_validate(list(files), fmt, strict))


def _validate(files: list[str], fmt: str, strict: bool) -> int:
    from amm_rules.language.loader import check_path
    from amm_rules.language.reporters import REPORTERS

    results = [check_path(f) for f in files]
    click.echo(REPORTERS[fmt](results), nl=False)
    failed = any(d.is_error or strict for r in results for d in r.diagnostics)
    return 1 if failed else 0


@main.command()
def schema() -> None:
    """Print the JSON Schema of rules files (for editor completion)."""
    click.echo(schema_text(), nl=False)


def schema_text() -> str:
    import json

    from amm_rules.language.schema import SCHEMA

    return json.dumps(SCHEMA, indent=2) + "\n"


def examples_dir() -> Path:
    """``examples/rules`` of a source checkout (next to the package directory)."""
    return Path(__file__).resolve().parent.parent / "examples" / "rules"


@main.command()
@click.option(
    "--rules",
    "rules",
    type=click.Path(dir_okay=False),
    default=None,
    help="Rules file to use instead of the demo's own.",
)
def demo(rules: str | None) -> None:
    """Run the demo (a local cluster driven by a rules file)."""
    import importlib

    try:
        demo_module = importlib.import_module("amm_rules.demo")
    except ModuleNotFoundError as exc:
        if exc.name != "amm_rules.demo":
            raise
    else:
        result = demo_module.main(rules=rules)
        sys.exit(result if isinstance(result, int) else 0)
    # The demo is not part of this build: show what the rules files say instead.
    if rules is not None:
        files = [rules]
    else:
        files = sorted(str(p) for p in examples_dir().glob("*.yaml"))
        if not files:
            raise click.ClickException(
                "no demo here, and no examples/rules/ directory (run from a source checkout)"
            )
    click.echo("amm_rules.demo is not available; validating the example rules instead.", err=True)
    sys.exit(_validate(files, "text", strict=False))
