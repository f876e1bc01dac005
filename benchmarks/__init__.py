"""Benchmarks of amm-rules, each a module run from the repository root:
``python -m benchmarks.scale --quick``. Each prints a table and writes its results under
``benchmarks/results/``; shared helpers come from :mod:`tests.support` and, for the
newer ones, from :mod:`benchmarks.support` (which imports nothing from ``tests/``).

- :mod:`.scale`: the scheduler's cost at up to a million keys and a thousand workers;
- :mod:`.startup`: start-up time of ``amm-rules validate``;
- :mod:`.rebalance_planner`: the pure rebalance planner on simulated clusters (no Dask);
- :mod:`.rebalance_cluster`: rebalancing on a real local cluster, against Dask's own tools;
- :mod:`.soak`: minutes of chaos under replication targets;
- :mod:`.hosts`: whole hosts (network namespaces) killed, cut off and healed, against the
  stock AMM;
- :mod:`.fuzz_rules`: a long fuzz run of the rules-file checker;
- :mod:`.simulate`: ``amm-rules simulate`` on a 100,000-key cluster dump;
- :mod:`.demand`: copies kept while in demand: a shared table read by waves of tasks,
  against the stock policy.
"""
