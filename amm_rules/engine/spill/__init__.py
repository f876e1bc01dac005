"""The worker half of the ``spill:`` section: what runs on the workers.

- :mod:`.order`: the order a worker's memory gives keys up in, by value per byte (pure);
- :mod:`.plugin`: the worker plugin the engine registers from the scheduler, which puts
  that order in place, reports the keys on disk and reads keys back ahead.

Neighbours: :mod:`amm_rules.engine.sections.spill` is the scheduler half.
"""
