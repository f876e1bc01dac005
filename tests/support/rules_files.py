"""Rules files on disk for the hot-reload tests: written as editors write them, replaced
by hostile things, made unreadable in a way that holds for root too (CI runs as root,
and root reads a file whatever its mode)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.env import in_ci

#: Regular files the Linux kernel lets nobody read, root included: write-only sysctl
#: knobs (mode 0200; reading one is refused with EACCES before anything is read).
WRITE_ONLY_FILES = ("/proc/sys/vm/drop_caches", "/proc/sys/vm/compact_memory")


def write_atomically(path: Path, text: str) -> None:
    """Replace ``path`` as editors and config tools do: a new file renamed over the old
    one (a new inode, so the change shows even within one mtime tick)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def reload_now(policy: Any, timeout: float = 30.0) -> None:
    """Reload ``policy``'s changed rules file outside an event loop, as its cycles would:
    poll until the file, read in its load thread, was installed or refused."""
    reloads = policy.ctx.journal.reloads
    before = sum(reloads.values())
    deadline = time.monotonic() + timeout
    while sum(reloads.values()) == before:
        assert time.monotonic() < deadline, f"the rules file not reloaded within {timeout} s"
        policy._maybe_reload()


def clear(path: Path) -> None:
    """Remove whatever is at ``path`` (file, symlink, pipe, empty directory)."""
    if path.is_symlink() or path.exists() and not path.is_dir():
        path.unlink()
    elif path.is_dir():
        path.rmdir()


def write_only_file() -> str | None:
    """A regular file that root cannot read either, or None on this system."""
    for candidate in WRITE_ONLY_FILES:
        try:
            mode = os.stat(candidate).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode) and not mode & 0o444:
            return candidate
    return None


def make_unreadable(path: Path, text: str) -> None:
    """Make ``path`` a rules file (``text``) whose read is refused with "permission
    denied": mode 0 for an ordinary user; for root, which reads any file whatever its
    mode, a symlink to a file the kernel lets nobody read. Skipped, with the reason,
    where neither is possible (never in CI)."""
    clear(path)
    if os.name == "posix" and os.geteuid() != 0:
        path.write_text(text)
        path.chmod(0)
        return
    target = write_only_file()
    if target is None:
        if in_ci():
            pytest.fail("no way to make a file unreadable for root on this CI system")
        pytest.skip("running as root, and no write-only system file to point to")
    path.symlink_to(target)


def make_readable(path: Path) -> None:
    """Undo :func:`make_unreadable` (so that the temporary directory can be removed)."""
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        path.chmod(0o644)
