"""The engine half: :class:`~amm_rules.engine.policy.RulesPolicy` and what it needs each
AMM cycle, inside the scheduler.

Pure parts (no ``distributed`` import, run by tests, hypothesis and the benchmarks
without a cluster): :mod:`.planner` (one key's plan), :mod:`.view` (the small view of
the cluster the planners read), :mod:`.classify` (rules cascade per key),
:mod:`.evacuate` (where a leaving worker's keys go) and :mod:`.rebalance.planner`.
Scheduler glue: :mod:`.policy` (the AMM contract and the cycle), :mod:`.adapters`
(scheduler objects as views), :mod:`.index` (governed keys and the scheduler hooks),
:mod:`.placement`, :mod:`.rules_file`, :mod:`.audit`, :mod:`.events`, :mod:`.handlers`,
:mod:`.retire` (retirement by the rules), :mod:`.paused` (the ``paused-workers`` section),
:mod:`.demand` (a key's reads and waiters), :mod:`.legacy` (distributed's ``replicate``
and ``scatter(broadcast=...)`` as runtime targets) and :mod:`.rebalance.rebalancer`.
"""

import logging

#: The per-key logger of the whole engine, verbose at DEBUG level, one line shape:
#: ``(op, key, worker) outcome: reason``. Named once here: ``amm_rules.engine.keys``.
key_logger = logging.getLogger(f"{__name__}.keys")
