"""Tests of what operators see (:mod:`amm_rules.observe`): per-rule conformance, the
status report and ``explain``, Prometheus metrics scraped over HTTP, cluster dumps, and
``amm-rules status`` / ``explain`` run against real schedulers."""
