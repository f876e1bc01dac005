"""``amm`` annotations, checked on the client: :func:`annotate`.

A task's ``amm`` annotation (``dask.annotate(amm={...})``) carries the same action
fields as a rule (``replicate``, ``pool``, ``avoid``, ``spread``, ``move``) and
overrides the rules field by field for that task. The scheduler half
(:mod:`amm_rules.policy`) reads it from ``TaskState.annotations`` and checks it again
with the scheduler's pool names; an invalid annotation there is ignored for that key
and reported as a warning event, never raised.

This module lets a client find the mistakes it can find *before* a graph is built,
through :func:`amm_rules.actions.parse_actions`, the same function the rules file and
the scheduler use, so that a field means the same thing everywhere. It imports
``dask`` but not ``distributed``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import dask

from amm_rules.actions import ActionError, parse_actions
from amm_rules.ruleset import ACTION_FIELDS, Actions, Target

__all__ = ["ActionError", "annotate", "plain_actions", "plain_target", "validate_annotation"]

#: The annotation name the scheduler reads (``ts.annotations["amm"]``).
ANNOTATION = "amm"


def plain_target(target: Target) -> int | dict[str, int]:
    """A :class:`Target` as the value a user would write: ``3`` or ``{"min": 2, "max": 5}``."""
    if target.max == target.min:
        return target.min
    out = {"min": target.min}
    if target.max is not None:
        out["max"] = target.max
    return out


def plain_actions(actions: Actions) -> dict[str, Any]:
    """Checked :class:`Actions` as plain, msgpack-friendly values.

    The result goes over the wire inside the task graph, so it uses only ints, strings,
    lists and dicts; :func:`parse_actions` turns it back into the same ``Actions``.
    """
    out: dict[str, Any] = {}
    for name in ACTION_FIELDS:
        value = getattr(actions, name)
        if value is None:
            continue
        if name == "replicate":
            value = plain_target(value)
        elif isinstance(value, tuple):
            # One pool is written as its name, several as a list, as in a rules file.
            value = value[0] if len(value) == 1 else list(value)
        out[name] = value
    return out


def validate_annotation(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Check an ``amm`` annotation the way the scheduler will, except for pool names.

    Returns the fields as plain values (``2.0`` becomes ``2``, a repeated pool name is
    kept once). Raises :class:`~amm_rules.actions.ActionError` (a ``ValueError``) naming
    the first invalid field.
    """
    try:
        actions = parse_actions(fields)
    except ActionError as err:
        # Re-raise with the context a user needs to find the call that failed.
        raise ActionError(err.field, f"{err.message} (in an amm annotation)") from None
    return plain_actions(actions)


def annotate(**fields: Any) -> AnnotateContext:
    """Annotate the tasks submitted inside the block with amm-rules action fields.

    ::

        with amm_rules.annotate(replicate=4, pool="gpu"):
            x = client.persist(x)

    The fields are checked now, on the client: ``amm_rules.annotate(replicate=0)``
    raises :class:`ValueError` before any graph is built. Pool *names* are only checked
    for their spelling here; whether a pool of that name exists is known only to the
    scheduler's rules, which ignore the annotation of a key naming an unknown pool and
    log a warning event under the topic ``amm-rules``.

    Inside the block, ``dask.annotate(amm={...})`` is in effect. Nested blocks combine
    field by field: the inner block's fields win, fields it does not set are kept from
    the outer ``amm`` annotation.

    Wrap the call that sends the graph to the scheduler (``client.persist``,
    ``client.compute``, ``client.submit``, ``dask.persist``): annotations set only
    around the construction of a collection may be dropped by graph optimization.
    """
    return AnnotateContext(validate_annotation(fields))


class AnnotateContext:
    """What :func:`annotate` returns: checked fields, entered later.

    A class rather than a generator-based context manager so that the fields are
    checked when ``annotate(...)`` is called, not when the ``with`` block is entered,
    and so that the outer annotation is read at entry, not at the call.
    """

    def __init__(self, fields: dict[str, Any]):
        #: The checked fields, as plain values.
        self.fields = fields
        self._stack: list[Any] = []

    def __repr__(self) -> str:
        return f"amm_rules.annotate({', '.join(f'{k}={v!r}' for k, v in self.fields.items())})"

    def __enter__(self) -> dict[str, Any]:
        cm = _enter(self.fields)
        merged = cm.__enter__()
        self._stack.append(cm)
        return merged

    def __exit__(self, *exc_info: Any) -> None:
        self._stack.pop().__exit__(*exc_info)


@contextmanager
def _enter(fields: dict[str, Any]) -> Iterator[dict[str, Any]]:
    outer = dask.get_annotations().get(ANNOTATION)
    merged = {**outer, **fields} if isinstance(outer, Mapping) else dict(fields)
    with dask.annotate(**{ANNOTATION: merged}):
        yield merged
