"""Tests of the offline half (:mod:`amm_rules.offline`): cluster dumps read from real
clusters, the simulator against the live engine, ``diff``, rule tests, ``validate --dump``."""
