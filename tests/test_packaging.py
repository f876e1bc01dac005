"""The wheel carries what the installed package loads (the grammar, its prebuilt parse
table, the demo's rules), and the README's first command works from it: the wheel
installed (not editable) in a fresh environment made by the test, ``amm-rules demo``
runs there with the demo rules the wheel ships. The sdist holds every file git tracks
(but the benchmarks' results), so that the tests run from it. Both carry the license;
the metadata says what the package needs and offers (the floor of dask and distributed
that CI pins, the extras, the version defined once in ``amm_rules/__init__.py``)."""

from __future__ import annotations

import email
import email.message
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import hatchling.build  # noqa: F401 - the wheel is built by it, without build isolation
import pytest
from trove_classifiers import classifiers as TROVE

import amm_rules
from tests.support.env import in_ci

REPO = Path(__file__).resolve().parent.parent
#: Tracked files the sdist leaves out, on purpose (pyproject.toml says why).
NOT_IN_SDIST = re.compile(r"^benchmarks/results/")


def build(target: str, out: Path) -> Path:
    """The ``wheel`` or ``sdist`` of the checkout, built by hatchling (no isolation)."""
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", target, "-d", str(out)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("amm_rules-*.whl" if target == "wheel" else "amm_rules-*.tar.gz")
    return built


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build("wheel", tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def wheel_names(wheel) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


@pytest.mark.parametrize(
    "name",
    [
        "amm_rules/grammar/expr.lark",
        "amm_rules/language/expr/parse_table.json",
        "amm_rules/data/demo.yaml",
        "amm_rules/data/recommended.yaml",
        "amm_rules/py.typed",
        "amm_rules/engine/policy.py",
    ],
)
def test_wheel_contains(wheel_names, name):
    assert name in wheel_names


def test_wheel_declares_the_console_script(wheel, wheel_names):
    (entry_points,) = [n for n in wheel_names if n.endswith("entry_points.txt")]
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(entry_points).decode()
    assert "amm-rules = amm_rules.cli:main" in text


def test_the_installed_wheel_runs_the_demo_with_its_own_rules(wheel, tmp_path):
    """``pip install . && amm-rules demo``, with the wheel: a fresh virtual environment
    (its dependencies visible from this interpreter's site-packages, so that nothing
    is downloaded), the wheel installed in it, the command run outside the source
    tree with no PYTHONPATH."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
        timeout=120,
    )
    scripts = venv / Path(sysconfig.get_path("scripts")).relative_to(sys.prefix)
    python = scripts / Path(sys.executable).name
    subprocess.run(
        [
            sys.executable, "-m", "pip", "--python", str(python), "install",
            "--no-deps", "--no-index", "--quiet", str(wheel),
        ],
        check=True,
        timeout=300,
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("DASK_")}
    where = subprocess.run(
        [str(python), "-c", "import amm_rules; print(amm_rules.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    package = Path(where.stdout.strip()).parent
    assert package.is_relative_to(venv), package  # the wheel's copy, not the source tree
    demo = subprocess.run(
        [str(scripts / "amm-rules"), "demo"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert f"rules from {package / 'data' / 'demo.yaml'}\n" in demo.stdout
    assert "\nEvery target is met.\n" in demo.stdout, demo.stdout
    # The suggestion at the end names the wheel's copy of the recommended rules.
    recommended = package / "data" / "recommended.yaml"
    assert demo.stdout.endswith(f"  amm-rules demo --rules {recommended}\n"), demo.stdout


@pytest.fixture(scope="module")
def metadata(wheel) -> email.message.Message:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        return email.message_from_bytes(zf.read(name))


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    return build("sdist", tmp_path_factory.mktemp("sdist"))


@pytest.fixture(scope="module")
def sdist_names(sdist) -> set[str]:
    with tarfile.open(sdist) as tf:
        top = f"amm_rules-{amm_rules.__version__}/"
        return {m.name.removeprefix(top) for m in tf.getmembers() if m.isfile()}


def tracked_files() -> list[str]:
    if not (REPO / ".git").exists():
        if in_ci():
            pytest.fail(f"{REPO} is not a git checkout: the sdist's contents cannot be checked")
        pytest.skip(f"{REPO} is not a git checkout")
    out = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    )
    return [p for p in out.stdout.splitlines() if (REPO / p).is_file()]


def test_the_sdist_holds_every_tracked_file(sdist_names):
    missing = [p for p in tracked_files() if not NOT_IN_SDIST.match(p) and p not in sdist_names]
    assert missing == []
    assert ".pre-commit-hooks.yaml" in sdist_names and "amm-rules-test.schema.json" in sdist_names
    assert not [p for p in sdist_names if NOT_IN_SDIST.match(p)]


def test_the_license_is_in_both(wheel_names, sdist_names, metadata):
    assert "LICENSE" in sdist_names
    assert f"amm_rules-{amm_rules.__version__}.dist-info/licenses/LICENSE" in wheel_names
    assert metadata["License-Expression"] == "BSD-3-Clause"
    assert metadata["License-File"] == "LICENSE"
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License\n") and "amm-rules developers" in text


def test_the_version_is_defined_once(metadata):
    assert metadata["Version"] == amm_rules.__version__
    assert 'dynamic = ["version"]' in (REPO / "pyproject.toml").read_text()
    assert f"## [{amm_rules.__version__}]" in (REPO / "CHANGELOG.md").read_text()


def test_the_floor_is_the_one_ci_pins(metadata):
    """pyproject's floor of dask and distributed is the release .ci/constraints-floor.txt
    pins, and the README and docs/deploy.md name it."""
    pins = dict(
        line.split("==")
        for line in (REPO / ".ci" / "constraints-floor.txt").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert set(pins) == {"dask", "distributed"}
    (version,) = set(pins.values())  # Dask releases both together
    requires = metadata.get_all("Requires-Dist")
    assert {f"dask>={version}", f"distributed>={version}"} <= set(requires)
    for doc in ("README.md", "docs/deploy.md"):
        text = " ".join((REPO / doc).read_text().replace("**", "").split())
        assert f"`dask` and `distributed` {version} or later" in text, doc


def test_the_extras(metadata):
    requires = metadata.get_all("Requires-Dist")
    assert {"dashboard", "metrics", "all", "test", "docs"} <= set(
        metadata.get_all("Provides-Extra")
    )
    assert "bokeh>=3.1.0; extra == 'dashboard'" in requires
    assert "prometheus-client>=0.17; extra == 'metrics'" in requires
    assert {"bokeh>=3.1.0; extra == 'all'", "prometheus-client>=0.17; extra == 'all'"} <= set(
        requires
    )
    readme = (REPO / "README.md").read_text()
    for extra in ("dashboard", "metrics", "all"):
        assert f'pip install "amm-rules[{extra}]"' in readme


def test_classifiers_and_urls(metadata):
    classifiers = metadata.get_all("Classifier")
    assert not [c for c in classifiers if c not in TROVE]
    assert "Typing :: Typed" in classifiers
    tested = {f"Programming Language :: Python :: 3.{minor}" for minor in range(10, 14)}
    assert tested <= set(classifiers)
    assert metadata["Requires-Python"] == ">=3.10"
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert {"Documentation", "Source", "Changelog"} <= set(urls)
    site = re.search(r"^site_url: (\S+)$", (REPO / "mkdocs.yml").read_text(), re.MULTILINE)
    assert site is not None and site[1].startswith(urls["Documentation"])
