"""Helpers of the benchmarks, imported as modules (``from benchmarks.support.hosts import
Hosts``). They import nothing from ``tests/``, so that a benchmark never depends on the
test suite; tests may import them.

- :mod:`.looplag`: the worst lateness of the event loop while something runs;
- :mod:`.hosts`: hosts as Linux network namespaces on a bridge, their worker processes,
  and the faults of a failure domain (kill a host, cut it off, cut two hosts apart);
- :mod:`.host_scenarios`: the host scenarios on a real cluster (a scheduler in this
  process, workers inside the namespaces) and their figures: ``tests/engine/policy/test_hosts.py``
  runs short versions, ``benchmarks/hosts.py`` the long ones.
"""
