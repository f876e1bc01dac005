"""Types that hold for users: mypy, with the project's settings, accepts the typed use of
the public surface in ``public_api.py`` and refuses its misuse (records are seen with
their fields: ``@record`` is a ``dataclass_transform``; frozen records refuse
assignment; the helpers' arguments are checked)."""

from __future__ import annotations

import re
from pathlib import Path

from mypy import api

HERE = Path(__file__).resolve().parent
CONFIG = HERE.parent.parent / "pyproject.toml"

MISUSE = """\
from amm_rules import Target, RulesPolicy, load_ruleset
from amm_rules.language.ruleset import Position

Position(1, 2, 3)
Position(line="1", column=2)
Target(3, 3).min = 4
Position(1, 2).line = 3
load_ruleset("rules.yaml", filename=3)
RulesPolicy("rules.yaml", reload="yes")
"""


def mypy(*paths: Path) -> tuple[int, list[str]]:
    out, err, status = api.run(
        ["--config-file", str(CONFIG), "--no-error-summary", *map(str, paths)]
    )
    return status, [line for line in (out + err).splitlines() if ": error: " in line]


def test_mypy_accepts_the_typed_use_and_refuses_its_misuse(tmp_path):
    misuse = tmp_path / "misuse.py"
    misuse.write_text(MISUSE)
    status, errors = mypy(HERE / "public_api.py", misuse)
    assert status == 1
    assert not [e for e in errors if "public_api.py" in e], errors
    lines = {int(m[1]) for e in errors if (m := re.match(r".*misuse\.py:(\d+): ", e))}
    assert lines == {4, 5, 6, 7, 8, 9}, errors
    said = "\n".join(errors)
    assert 'Too many arguments for "Position"' in said
    assert 'Argument "line" to "Position" has incompatible type "str"' in said
    assert 'Property "min" defined in "Target" is read-only' in said
    assert 'Property "line" defined in "Position" is read-only' in said
    assert 'Argument "reload" to "RulesPolicy" has incompatible type "str"' in said
