"""Tests of the client helpers (:mod:`amm_rules.client`): annotations, runtime targets and
introspection from a client."""
