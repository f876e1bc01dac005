"""The language half: a rules file in, a :class:`~amm_rules.language.ruleset.Ruleset` or
positioned diagnostics out.

Nothing here imports ``dask``, ``distributed`` or any part of ``amm_rules`` outside this
package (a test reads the imports to keep it so): ``amm-rules validate`` starts about as
fast as its parsing dependencies import and runs where no cluster exists.

The pipeline, in order: :mod:`.yaml_source` (safe YAML with a position for every node)
-> :mod:`.schema_check` (the JSON Schema of :mod:`.schema`) -> :mod:`.build` (fields,
with :mod:`.fields` and the expressions of :mod:`.expr`) -> :mod:`.lint` (warnings) ->
:mod:`.ruleset` (the immutable result). :mod:`.locator` attaches positions to every
diagnostic, :mod:`.diagnostics` defines them and :mod:`.reporters` prints them;
:mod:`.loader` runs the whole pipeline.
"""
