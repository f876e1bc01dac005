"""Tests of the language half (:mod:`amm_rules.language`): loading, schema, expressions,
diagnostics; no cluster."""
