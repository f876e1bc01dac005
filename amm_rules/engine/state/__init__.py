"""What the engine knows between cycles, and the scheduler hooks that keep it current.

- :mod:`.index`: the governed keys by plan class, per-key engine state (copies in
  flight, back-offs, shortfall, ...) and the work queues of the next cycle, fed by a
  scheduler plugin and wrappers of the scheduler's replica methods;
- :mod:`.placement`: pool membership of the workers, and where each class of keys may
  live on them;
- :mod:`.demand`: reads and waiters of keys;
- :mod:`.flow`: what each task prefix produces and frees;
- :mod:`.journal`: recent decisions, cycle durations, reloads.

The sections (:mod:`amm_rules.engine.sections`) reach them through the
:class:`~amm_rules.engine.context.EngineContext`.
"""
