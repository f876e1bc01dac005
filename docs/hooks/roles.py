"""A Griffe extension for the API reference (``mkdocs.yml``). The docstrings are written
for readers of the source:

- with Sphinx roles (``:class:`~amm_rules.Ruleset```): the site shows each role's target
  as code (``Ruleset``), the last dotted part when the target starts with ``~``, as
  Sphinx would;
- with parameters that share a description (``classify_seconds, classify_keys:``):
  Griffe would show the first one's type and default for both, so each gets its own
  entry, with the shared description.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

SHARED = re.compile(
    r"^(?P<indent> *)(?P<names>\w+(?:, \w+)+):\n(?P<body>(?:(?P=indent) {4}.*\n|\n(?=(?P=indent) {4}))+)",
    re.MULTILINE,
)
ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`]+)`")


def _apart(m: re.Match[str]) -> str:
    return "".join(f"{m['indent']}{name}:\n{m['body']}" for name in m["names"].split(", "))


def _code(m: re.Match[str]) -> str:
    short, target = m[1], m[2]
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


class SphinxRoles(griffe.Extension):
    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = ROLE.sub(_code, obj.docstring.value)
            obj.docstring.value = SHARED.sub(_apart, text if text.endswith("\n") else text + "\n")
