"""The state of distributed's spans as rules read it: ``task.span_done``.

A span (``with distributed.span("etl"): ...``) is done when no task of it, nor of its
sub-spans, is left to run (``Span.done`` of the scheduler's ``SpansSchedulerExtension``:
every task group of the span's tree done). Asking that walks the span's groups, so
:class:`SpanStates` keeps the answer per span, *published*: expressions read the
published value (:meth:`SpanStates.done_of`), and once per cycle :meth:`SpanStates.refresh`
asks again for the spans that keys were classified under, within a budget of task groups
walked, and returns the spans whose state changed, so that their keys in memory are
classified again (by the spans section, :mod:`amm_rules.engine.sections.spans`). A span
seen for the first time is asked at once. Where there is no spans extension (a recorded
cluster), a span's state is what :meth:`SpanStates.set` recorded.

Neighbours: :mod:`amm_rules.engine.adapters` reads a key's span id and path;
:mod:`amm_rules.engine.decide.classify` reads :meth:`done_of` with a key's class.
"""

from __future__ import annotations

from collections.abc import Hashable
from itertools import islice
from typing import Any

#: Most spans followed (the oldest done ones are forgotten first beyond this).
MAX_SPANS = 10_000
#: Most task groups walked per cycle to learn which spans finished.
GROUPS_PER_CYCLE = 20_000


class SpanStates:
    """Published ``done`` per span id (see the module docstring)."""

    def __init__(self, extension: Any = None) -> None:
        #: The scheduler's ``SpansSchedulerExtension``, or None.
        self.extension = extension
        #: Span id -> whether it was done when last asked.
        self.published: dict[Hashable, bool] = {}
        #: Where the next refresh starts in :attr:`published` (spans in turn).
        self._turn = 0

    def done_of(self, ts: Any) -> bool:
        """The published state of the span of ``ts`` (asked now if new)."""
        span_id = getattr(ts.group, "span_id", None)
        if span_id is None:
            return False
        done = self.published.get(span_id)
        if done is None:
            done = self.published[span_id] = self._ask(span_id)
            if len(self.published) > MAX_SPANS:
                self._evict()
        return done

    def set(self, span_id: Hashable, done: bool) -> None:
        """Record a span's state (a recorded cluster's, which has no extension)."""
        self.published[span_id] = bool(done)

    def _ask(self, span_id: Hashable) -> bool:
        extension = self.extension
        span = extension.spans.get(span_id) if extension is not None else None
        return span is not None and bool(span.done)

    def refresh(self, groups_budget: int = GROUPS_PER_CYCLE) -> list[Hashable]:
        """Ask again whether the followed spans are done, in turn, until
        ``groups_budget`` task groups were walked; returns the spans whose state
        changed (their published value is the new one)."""
        extension = self.extension
        if extension is None or not self.published:
            return []
        ids = list(self.published)
        start = self._turn % len(ids)
        changed: list[Hashable] = []
        walked = asked = 0
        for span_id in (*ids[start:], *ids[:start]):
            if walked >= groups_budget:
                break
            span = extension.spans.get(span_id)
            asked += 1
            if span is None:
                continue
            groups = list(span.traverse_groups())
            walked += len(groups) or 1
            done = all(tg.done for tg in groups)
            if done != self.published[span_id]:
                self.published[span_id] = done
                changed.append(span_id)
        self._turn = start + asked
        return changed

    def groups_of(self, span_id: Hashable) -> list[Any]:
        """The task groups of a span's tree (empty without the extension)."""
        extension = self.extension
        span = extension.spans.get(span_id) if extension is not None else None
        return list(span.traverse_groups()) if span is not None else []

    def _evict(self) -> None:
        """Forget the oldest done spans (then the oldest) down to 90% of the limit."""
        excess = len(self.published) - MAX_SPANS * 9 // 10
        done = [s for s, d in self.published.items() if d][:excess]
        for span_id in done:
            del self.published[span_id]
        excess -= len(done)
        for span_id in list(islice(self.published, max(0, excess))):
            del self.published[span_id]

    def clear(self) -> None:
        self.published.clear()
        self._turn = 0
