"""Tests of the command line (:mod:`amm_rules.cli`) and the demo (:mod:`amm_rules.demo`)."""
