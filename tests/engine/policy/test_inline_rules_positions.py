"""Inline rules written in a dask config file: a scheduler that cannot start with them
reports their errors at the config file's lines and columns, as ``amm-rules validate
--dask-config`` does; inline rules set in code keep no positions."""

from __future__ import annotations

from pathlib import Path

import dask
import pytest
from distributed import Scheduler

from amm_rules import RulesError

CONFIG = """\
distributed:
  scheduler:
    active-memory-manager:
      policies:
        - class: amm_rules.RulesPolicy
          rules:
            version: 1
            rules:
              - name: bad
                match: task.prefx == "a"
                replicate: 0
"""
KEY = "distributed.scheduler.active-memory-manager.policies"


def test_scheduler_start_reports_inline_errors_at_config_positions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "amm.yaml"
    path.write_text(CONFIG)
    # The scheduler's dask config, read from that file as dask reads its config files.
    monkeypatch.setattr(dask.config, "paths", [*dask.config.paths, str(tmp_path)])
    policies = dask.config.collect(paths=[str(tmp_path)], env={})["distributed"]["scheduler"][
        "active-memory-manager"
    ]["policies"]
    with dask.config.set({KEY: policies}), pytest.raises(RulesError) as info:
        Scheduler(dashboard_address=":0", validate=True)
    assert [(d.file, d.line, d.column, d.code) for d in info.value.errors] == [
        (str(path), 10, 29, "unknown-attribute"),
        (str(path), 11, 28, "bad-value"),
    ]
    assert str(info.value).startswith(f"{path}:10:29: error: match: task has no attribute")


def test_inline_rules_set_in_code_have_no_positions() -> None:
    policies = [
        {
            "class": "amm_rules.RulesPolicy",
            "rules": {
                "version": 1,
                "rules": [{"name": "x", "match": "task.prefx", "move": "never"}],
            },
        }
    ]
    with dask.config.set({KEY: policies}), pytest.raises(RulesError) as info:
        Scheduler(dashboard_address=":0", validate=True)
    assert [(d.file, d.line, d.code) for d in info.value.errors] == [
        ("<rules>", 0, "unknown-attribute")
    ]
