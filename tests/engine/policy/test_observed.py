"""One ``RulesPolicy``: importing ``amm_rules`` turns nothing on in a scheduler, and a
policy turns observation on (status and explain answers, the cluster-dump extension,
the Prometheus collector) when it attaches, whatever name its dask config gives."""

from __future__ import annotations

import subprocess
import sys

import pytest
from distributed.utils_test import gen_cluster

from tests.observe.test_cli import environment
from tests.support.cluster import amm_config, policy_of


def test_importing_amm_rules_turns_nothing_on() -> None:
    code = (
        "import sys, amm_rules, amm_rules.engine.policy as engine\n"
        "print(amm_rules.RulesPolicy is engine.RulesPolicy)\n"
        "print(sorted(m for m in sys.modules if m.startswith('amm_rules.observe')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environment(),
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["True", "[]"]


@pytest.mark.parametrize("name", ["amm_rules.engine.policy.RulesPolicy", "amm_rules.RulesPolicy"])
def test_a_policy_is_observed_once_attached(name: str) -> None:
    config = amm_config()
    key = "distributed.scheduler.active-memory-manager.policies"
    config[key] = [{**config[key][0], "class": name}]

    @gen_cluster(client=True, nthreads=[("", 1)], config=config)
    async def check(c, s, a):
        from amm_rules.observe import metrics
        from amm_rules.observe.extension import engine_of

        policy = policy_of(s)
        assert engine_of(s) is policy
        status = await c.scheduler.amm_rules_status()
        assert "conformance" in status  # the observer's report, not the engine's alone
        scraped = metrics.registered()
        assert not metrics.available() or (scraped is not None and policy in scraped.policies)
        policy.detach()
        assert engine_of(s) is None
        assert scraped is None or policy not in scraped.policies

    check()


@gen_cluster(client=True, nthreads=[("", 1)], config=amm_config())
async def test_without_the_observer_explain_of_unmet_keys_is_refused(c, s, a) -> None:
    from amm_rules.engine.handlers import REFUSED, EngineAnswers

    policy = policy_of(s)
    # The engine's own answers, as when the observer cannot be loaded.
    policy.handlers.answers = EngineAnswers(policy.ctx, policy.sections)
    x = c.submit(int, 7, key="x-1")
    await x
    for asked in ({"unmet": True}, {"rule": "two"}):
        answer = await c.scheduler.amm_rules_explain(**asked)
        assert "needs amm_rules.observe" in answer[REFUSED], asked
    answer = await c.scheduler.amm_rules_explain(keys=["x-1"])
    assert set(answer) == {"x-1"}
    assert "conformance" not in await c.scheduler.amm_rules_status()
