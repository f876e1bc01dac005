"""Seeing what the rules engine does, from outside the cycle: the figures and words that
``amm-rules status`` / ``explain``, the Prometheus collector, cluster dumps and the
dashboard show.

- :mod:`~amm_rules.observe.conformance`: per rule, ``satisfied`` / ``in-progress`` /
  ``unsatisfiable`` with one sentence, and the fraction of governed keys that meet
  their target, from the engine's index and journal;
- :mod:`~amm_rules.observe.status`: :func:`~amm_rules.observe.status.status_report`,
  the engine's whole state as JSON-able data (what ``amm-rules status --format json``
  prints, and what a dashboard renders);
- :mod:`~amm_rules.observe.explain`: why one key is where it is, in the form of
  allocation explain (summary, facts, cascade, per-worker decisions, history);
- :mod:`~amm_rules.observe.text`: the text of ``amm-rules status`` and ``explain``;
- :mod:`~amm_rules.observe.metrics`: the Prometheus collector (``dask_amm_rules_*``);
- :mod:`~amm_rules.observe.extension`: what a policy installs on its scheduler when it
  attaches (the entry in ``scheduler.extensions`` that cluster dumps read, and the
  collector), and removes when it detaches or the scheduler closes;
- :mod:`~amm_rules.cli.keys` and :mod:`~amm_rules.cli.remote`: the command
  line's side (keys as dask prints them, asking a scheduler over its comm).

Nothing here runs in the AMM cycle, and nothing here scans ``scheduler.tasks``: each
function reads the engine's counters and per-class index (see
:mod:`amm_rules.engine.state.index` and :mod:`amm_rules.engine.state.journal`), so its cost follows
the number of rules, classes of keys and workers, not keys.
"""
