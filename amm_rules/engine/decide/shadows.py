"""A rule whose every match is taken: who decides its fields first, for the keys it
matches.

A rule that governs no key is ``idle`` when its match is false for every key in memory
(it names its keys otherwise than the data is named), and ``shadowed`` when it matches
keys but every field it sets is decided first for each of them by something earlier in
the cascade: an earlier rule, the key's ``amm`` annotation or a runtime target
(``checkpoints`` with ``replicate: 3`` before ``arrays-everywhere`` with ``replicate:
all`` on the same numpy keys). :class:`Shadow` counts, from the keys a rule matches, who
took its fields; :func:`shadow_words` says it in one sentence. Live status
(:mod:`amm_rules.observe.conformance`), ``simulate`` and ``diff``
(:mod:`amm_rules.offline.report`) and ``validate --dump`` (:mod:`amm_rules.offline.checks`)
say the same thing with it.

Pure: reads :class:`~amm_rules.language.ruleset.Desired` and rules, nothing of a cluster.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from amm_rules.engine.decide.plan import source_label
from amm_rules.language.plurals import counted
from amm_rules.language.ruleset import Desired, Rule

#: The states of a rule that governs no key while keys are in memory.
IDLE = "idle"
SHADOWED = "shadowed"


@dataclass
class Shadow:
    """What the keys a rule matches say of it."""

    #: Keys it matches (of those looked at).
    matched: int = 0
    #: Of those, keys it decides a field of.
    decided: int = 0
    #: Keys whose every field of the rule something else decided first: label (a rule's
    #: name, ``(annotation)``, ``(runtime)``...) -> keys.
    takers: Counter[str] = field(default_factory=Counter)
    #: Label -> the fields of the rule it took.
    fields: dict[str, set[str]] = field(default_factory=dict)

    @property
    def shadowed(self) -> bool:
        """It matches keys, and decides nothing for any of them."""
        return self.matched > 0 and not self.decided and bool(self.takers)

    def add(self, rule: Rule, desired: Desired) -> None:
        """One key ``rule`` matches, and what the cascade decided for it."""
        self.matched += 1
        taken = []
        for name in rule.actions.set_fields():
            reason = desired.reasons.get(name)
            if reason is None:
                return  # not classified yet: nobody took it (the rule would decide it)
            if reason.kind == "rule" and reason.rule == rule.name:
                self.decided += 1
                return
            taken.append((source_label(desired, name), name))
        for who in dict.fromkeys(who for who, _ in taken):
            self.takers[who] += 1
        for who, name in taken:
            self.fields.setdefault(who, set()).add(name)

    def to_dict(self) -> dict[str, object]:
        return {
            "matched": self.matched,
            "taken_by": {
                who: {"keys": n, "fields": sorted(self.fields.get(who, ()))}
                for who, n in self.takers.most_common()
            },
        }


def shadow_words(shadow: Shadow, looked_at: int | None = None) -> str:
    """``matches 3 keys, all taken by checkpoints (replicate)``; with ``looked_at`` (a
    sample of the keys in memory): ``matches 3 of 2,000 keys sampled, ...``."""
    n = shadow.matched
    if looked_at is None:
        head = f"matches {counted(n, 'key')}"
    else:
        head = f"matches {n:,} of {looked_at:,} keys sampled"
    takers = ", ".join(
        f"{who} ({', '.join(sorted(shadow.fields.get(who, ())))})"
        for who, _ in shadow.takers.most_common()
    )
    return f"{head}, {'all ' if n != 1 else ''}taken by {takers}"
