"""Rebalancing inside the engine: :mod:`.plan` decides moves from worker loads (pure),
:mod:`.rebalancer` feeds it the engine's views and turns its moves into suggestions.

It sits inside the engine because the rebalancer reads the engine's views and the policy
drives the rebalancer: as a sibling package the two would import each other.
"""
