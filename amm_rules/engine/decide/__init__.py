"""The engine's pure decisions: no ``distributed`` import, so that tests, hypothesis and
the benchmarks run them without a cluster, and :mod:`amm_rules.offline` feeds them views
built from a cluster dump.

- :mod:`.view`: the small view of the cluster and of one key that the planners read;
- :mod:`.plan`: one key's replication plan (copies to add, copies to drop, and why);
- :mod:`.classify`: the rules cascade per key, by task group where it can;
- :mod:`.classify_budget`: where a cycle's classification stops;
- :mod:`.evacuate`: where the keys of a worker that leaves go.

The rebalance planner is pure too (:mod:`amm_rules.engine.rebalance.plan`).
"""
