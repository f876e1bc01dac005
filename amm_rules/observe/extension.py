"""What makes an attached :class:`~amm_rules.engine.policy.RulesPolicy` seen: the
observer every policy loads when it attaches (the engine names it in
:data:`~amm_rules.engine.policy.OBSERVERS`, and never imports it).

When a policy attaches to a scheduler, :data:`OBSERVER`

- puts an :class:`EngineExtension` in ``scheduler.extensions["amm-rules"]``.
  distributed writes every extension with a ``_to_dict`` into
  ``Client.dump_cluster_state``, so a dump carries the rules in force (source, text,
  SHA-256, load time), the status report (per-rule conformance included) and the
  engine's recent decisions: a dump sent with a bug report explains itself. The
  scheduler calls its ``teardown`` when it closes, which takes the policy off
  ``/metrics``. :func:`engine_of` finds the policy of a scheduler from there (for a
  dashboard page or an HTTP route);
- gives the policy's handlers their :class:`Answers`: the engine's ``amm_rules_status``
  and ``amm_rules_explain`` handlers (:mod:`amm_rules.engine.handlers`, their one owner)
  then answer with :func:`~amm_rules.observe.status.status_report` and
  :func:`~amm_rules.observe.explain.explain_keys` (each a superset of the engine's own
  answer, which it extends);
- has the Prometheus collector scrape it (:mod:`amm_rules.observe.metrics`).

When the policy detaches, the extension and the metrics are undone (the handlers go
with the engine's). If two policies are attached to one scheduler, the extension and the
handlers belong to the last one attached, and both are scraped. Importing this module
changes nothing: a policy turns observation on when it attaches, whatever name it was
configured by (``amm_rules.RulesPolicy`` in a dask config, or the engine's own module).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Container
from typing import TYPE_CHECKING, Any

from amm_rules.engine.features import PROMETHEUS, missing
from amm_rules.engine.policy import RulesPolicy

if TYPE_CHECKING:
    from amm_rules.engine.handlers import Explanation

__all__ = ["OBSERVER", "Answers", "EngineExtension", "engine_of"]

logger = logging.getLogger(__name__)

#: The name of the extension in ``scheduler.extensions``.
NAME = "amm-rules"
#: Decisions a cluster dump carries.
DUMP_DECISIONS = 1_000


class EngineExtension:
    """The engine's entry in ``scheduler.extensions`` (see the module docstring)."""

    def __init__(self, policy: RulesPolicy):
        self.policy = policy

    def __repr__(self) -> str:
        return f"<amm-rules extension of {self.policy!r}>"

    def _to_dict(self, *, exclude: Container[str] = ()) -> dict[str, Any]:
        """What ``Client.dump_cluster_state`` writes under
        ``scheduler.extensions.amm-rules``: ``rules`` (``source``, ``sha256``,
        ``loaded_at``, ``text``), ``status`` (:func:`~amm_rules.observe.status.status_report`),
        ``decisions`` (the latest, oldest first) and ``runtime_targets`` (``[key, min,
        max]`` for each key with one, ``min``/``max`` a number or ``"all"``, and a fourth
        item naming the origin of a target set by distributed's own calls:
        ``"client.replicate"`` or ``"scatter broadcast"``; ``amm-rules simulate`` reads
        them back)."""
        from amm_rules.observe.status import decision_dict, status_report

        policy = self.policy
        ruleset = policy.ruleset
        out: dict[str, Any] = {
            "rules": {
                "source": policy.path if policy.path is not None else ruleset.source,
                "sha256": ruleset.sha256,
                "loaded_at": policy.loaded_at,
                "text": ruleset.text,
            },
            "status": status_report(policy),
            "decisions": [decision_dict(d) for d in policy.journal.recent(DUMP_DECISIONS)],
            "runtime_targets": [
                [key, t.target.min, t.target.max] + ([t.origin] if t.origin != "runtime" else [])
                for key, t in policy.index.runtime.items()
                # (Targets of other fields only, from amm_rules.persist: not recorded.)
                if t.target is not None
            ],
        }
        return {k: v for k, v in out.items() if k not in exclude}

    def teardown(self) -> None:
        """The scheduler is closing: stop publishing metrics for it."""
        _unregister_metrics(self.policy)


class Answers:
    """What the ``amm_rules_status`` and ``amm_rules_explain`` handlers of one policy
    answer once it is observed (see :class:`amm_rules.engine.handlers.Answers`)."""

    def __init__(self, policy: RulesPolicy):
        self.policy = policy

    def status(self) -> dict[str, Any]:
        """:func:`amm_rules.observe.status.status_report` of the policy."""
        from amm_rules.observe.status import status_report

        return status_report(self.policy)

    def explain(
        self, keys: Any = (), unmet: bool = False, rule: Any = None, limit: Any = 10
    ) -> Explanation:
        """Why is each key where it is (see :mod:`amm_rules.observe.explain`)? With
        ``unmet=True``, for up to ``limit`` keys whose target is unmet (of ``rule``, a
        rule's name, if given) instead of ``keys``; at most
        :func:`~amm_rules.engine.handlers.explain_cap` keys, the others counted. What
        the handler explains a slice at a time. Bad arguments raise ``ValueError``."""
        from amm_rules.engine.handlers import Explanation, check_keys, explain_cap
        from amm_rules.observe.explain import Explainer, count_unmet, unmet_keys

        explainer = Explainer(self.policy)
        most = explain_cap(len(explainer.cluster.workers))
        if not unmet:
            keys = check_keys(keys)
            return Explanation(keys[:most], len(keys), most, explainer)
        if rule is not None and not isinstance(rule, str):
            raise ValueError(f"rule: expected a rule's name, got {type(rule).__name__}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit: expected a whole number of keys >= 1, got {limit!r}")
        picked = unmet_keys(self.policy, rule, min(limit, most))
        total = count_unmet(self.policy, rule) if len(picked) == min(limit, most) else 0
        return Explanation(picked, max(total, len(picked)), most, explainer)


class _Observer:
    """Installs and removes what makes one policy seen (see the module docstring)."""

    def __repr__(self) -> str:
        return "<amm-rules observe>"

    def attached(self, scheduler: Any, policy: RulesPolicy) -> None:
        scheduler.extensions[NAME] = EngineExtension(policy)
        policy.handlers.answers = Answers(policy)
        if importlib.util.find_spec("prometheus_client") is None:
            return  # no /metrics on this scheduler: nothing of ours to serve there
        lacking = missing(PROMETHEUS, scheduler)
        if lacking:
            policy.unsupported_feature(PROMETHEUS.name, lacking)
            return
        from amm_rules.observe import metrics

        try:
            metrics.register(policy)
        except Exception:  # metrics are a convenience: never fail the scheduler for them
            logger.exception("amm-rules: could not register Prometheus metrics")

    def detached(self, scheduler: Any, policy: RulesPolicy) -> None:
        extension = scheduler.extensions.get(NAME)
        if isinstance(extension, EngineExtension) and extension.policy is policy:
            del scheduler.extensions[NAME]
        _unregister_metrics(policy)


def _unregister_metrics(policy: RulesPolicy) -> None:
    try:
        from amm_rules.observe import metrics
    except ImportError:  # distributed's collector moved: the metrics were never registered
        return
    metrics.unregister(policy)


#: The observer :data:`~amm_rules.engine.policy.OBSERVERS` names.
OBSERVER = _Observer()


def engine_of(scheduler: Any) -> RulesPolicy | None:
    """The :class:`~amm_rules.engine.policy.RulesPolicy` attached to ``scheduler``
    (the last one attached), or None."""
    extension = getattr(scheduler, "extensions", {}).get(NAME)
    return extension.policy if isinstance(extension, EngineExtension) else None
