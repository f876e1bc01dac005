"""Helpers shared by the tests and the benchmarks, imported as modules
(``from tests.support.cluster import amm_config``):

- :mod:`.cluster`: real-cluster helpers for RulesPolicy (``amm_config``, ``policy_of``,
  ``holders``/``copies``/``counts``/``who_has``, ``long_interval``, the ``Requests`` and
  ``TransitionCounter`` recorders);
- :mod:`.retire`: the retirement tests' helpers (``ReplicaLog``, ``amm_measure``);
- :mod:`.waiting`: waiting on conditions with deadlines that fail (``wait_for``,
  ``cycles``, ``cycle_until``, ``wait_cycles``) and each test's poll budget;
- :mod:`.rulesets`: the rules the tests share; :mod:`.rules_files`: rules files on
  disk for the reload tests (written atomically, made unreadable also for root);
- :mod:`.engine_errors`: engine events that fail any test (``tests/conftest.py``);
- :mod:`.hang`: the hang detector of the hostile-input tests;
- :mod:`.chaos`: rounds of killing, pausing and retiring workers (the chaos tests and
  ``benchmarks/soak.py``);
- :mod:`.fuzzer`: the seeded generator of hostile rules files (the hostile-input tests and
  ``benchmarks/fuzz_rules.py``);
- :mod:`.scheduler_state`: a real scheduler holding a large cluster state, built in one
  process without a network (``benchmarks/scale.py`` and its smoke test).
- :mod:`.layout`: the package's imports read with :mod:`ast`, and the layout rules
  (``tests/test_layout.py``);
- :mod:`.env`: ``in_ci()``, whether this is a CI run (tests that need an optional part
  skip elsewhere, fail there);
- :mod:`.dumps`: real cluster dumps of a small cluster with governed keys, and the live
  engine settled on the same cluster (the offline tests).
"""
