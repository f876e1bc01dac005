"""MkDocs hooks of the documentation site (``mkdocs.yml``).

The pages are docs/*.md as they are read on the repository's web page; this module makes
the site from them without copying them:

- the README is the home page (``index.md``), its ``docs/...`` links made site links;
- a link that leaves docs/ (an example rules file, a benchmark's results, CONTRIBUTING)
  points at the file in the source repository; a link to a file that does not exist is a
  warning, which ``mkdocs build --strict`` makes an error;
- the JSON Schemas are served by the site under ``schemas/``.

Links inside fenced code blocks are left alone.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.site")

ROOT = Path(__file__).resolve().parents[2]
SOURCE = "https://github.com/amm-rules/amm-rules"
#: Files outside docs/ that the site serves as they are, by their path in the site.
SERVED = {
    "schemas/amm-rules.schema.json": "amm-rules.schema.json",
    "schemas/amm-rules-test.schema.json": "amm-rules-test.schema.json",
}
LINK = re.compile(
    r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^)\s]+)(?P<title>\s+\"[^\"]*\")?\)"
)
FENCE = re.compile(r"^(```|~~~)", re.MULTILINE)
IMAGES = (".png", ".svg", ".jpg", ".jpeg", ".gif")


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, "index.md", content=(ROOT / "README.md").read_text()))
    for uri, path in SERVED.items():
        files.append(File.generated(config, uri, abs_src_path=str(ROOT / path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    src = page.file.src_uri
    # Where the page's relative links start from, in the repository.
    base = "" if src == "index.md" else posixpath.dirname(f"docs/{src}")
    parts = FENCE.split(markdown)
    # split() with a group: [text, fence, code-and-closing..., ...]; rewrite text only.
    out, in_code = [], False
    for i, part in enumerate(parts):
        if i % 2 == 1:  # a fence marker
            in_code = not in_code
            out.append(part)
        elif in_code:
            out.append(part)
        else:
            out.append(LINK.sub(lambda m: _link(m, base, src, files), part))
    return "".join(out)


def _link(m: re.Match[str], base: str, page: str, files: Files) -> str:
    target = m["target"]
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return m[0]
    path, _, anchor = target.partition("#")
    repo_path = posixpath.normpath(posixpath.join(base, path))
    in_site = files.get_file_from_path(repo_path.removeprefix("docs/")) is not None
    if repo_path.startswith("docs/") and (in_site or (ROOT / repo_path).is_dir()):
        # A page or file of the site: relative to this page's place in docs/.
        here = posixpath.dirname(f"docs/{page}")
        new = posixpath.relpath(repo_path, here) + (f"#{anchor}" if anchor else "")
    elif repo_path.startswith("..") or not (ROOT / repo_path).exists():
        log.warning("%s: link to %r: no such file in the repository", page, target)
        return m[0]
    else:
        kind = "raw" if repo_path.endswith(IMAGES) else ("tree" if path.endswith("/") else "blob")
        new = f"{SOURCE}/{kind}/main/{repo_path}" + (f"#{anchor}" if anchor else "")
    return f"{m['bang']}[{m['text']}]({new}{m['title'] or ''})"
