"""Tests of the engine half (:mod:`amm_rules.engine`): the pure planners and view on small
hand-built views, RulesPolicy and rebalancing on real clusters, chaos."""
