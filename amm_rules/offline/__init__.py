"""Rules tried without a running cluster: views of a cluster built from a dump (or a
test file), the simulator that plans cycle after cycle on them with the engine's own
classifier, planners and dry-run filter, the ``diff`` of two rules files, rule tests, and
the warnings ``validate --dump`` adds.

- :mod:`.dump`: reading ``Client.dump_cluster_state`` files into plain records;
- :mod:`.sim_cluster`: records -> scheduler-shaped objects the engine reads;
- :mod:`.simulate`: cycles of the engine's planning on those objects;
- :mod:`.report`: what a simulation found, as text or JSON;
- :mod:`.diff`: what changing the rules would do to a cluster;
- :mod:`.casefile` and :mod:`.ruletests`: ``amm-rules test``;
- :mod:`.checks`: cluster-aware warnings for ``amm-rules validate --dump``.
"""
