"""The engine half: :class:`~amm_rules.engine.policy.RulesPolicy` and what it needs each
AMM cycle, inside the scheduler.

- :mod:`.policy`: the AMM contract, the rules file and the cycle, which runs the sections;
- :mod:`.context`: :class:`~amm_rules.engine.context.EngineContext`, everything a section
  may use;
- :mod:`.sections`: one module per feature (replication, rebalance, paused workers,
  retirement, memory pressure, ...), each a :class:`~amm_rules.engine.sections.base.Section`;
- :mod:`.decide`: the pure decisions (views, one key's plan, classification, evacuation),
  and :mod:`.rebalance` (the pure rebalance planner and its scheduler glue);
- :mod:`.state`: the key index and the tables the hooks keep (placements, demand, memory
  flow, journal);
- scheduler glue: :mod:`.adapters` (scheduler objects as views), :mod:`.handlers` (what
  clients ask), :mod:`.events`, :mod:`.early` (early cycles), :mod:`.dryrun`,
  :mod:`.rules_file`, :mod:`.wrapping`, :mod:`.worker_watch`.
"""

import logging

#: The per-key logger of the whole engine, verbose at DEBUG level, one line shape:
#: ``(op, key, worker) outcome: reason``. Named once here: ``amm_rules.engine.keys``.
key_logger = logging.getLogger(f"{__name__}.keys")
