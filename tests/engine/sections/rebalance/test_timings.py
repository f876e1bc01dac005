"""The ``rebalance`` section's timings (cool-down, copy and drop timeouts) reach the
policy's move book and follow a reload, applying to moves in flight and keys cooling
down. No cluster: the reload reads only the scheduler's tasks (to classify them again).
"""

from __future__ import annotations

from types import SimpleNamespace

from amm_rules.engine.policy import RulesPolicy
from amm_rules.engine.rebalance.plan import Move, PendingMove
from amm_rules.engine.sections.rebalance import RebalanceSection
from tests.support.rules_files import reload_now, write_atomically

TIMED = """\
version: 1
rebalance:
  cool-down: {cool}
  copy-timeout: {copy}
  drop-timeout: {drop}
"""


def test_rebalance_timings_reach_the_move_book_and_follow_a_reload(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(TIMED.format(cool="90s", copy="10s", drop="2 min"))
    policy = RulesPolicy(str(path))
    rebalancer = policy.rebalancer
    book = rebalancer.book
    assert (book.cooldown, book.copy_timeout, book.drop_timeout) == (90.0, 10.0, 120.0)
    # A key cooling down and a move in flight when the file changes.
    book.refuse(Move("cooling", "a", "b", 1), now=0.0)
    book.start(Move("moving", "a", "b", 1), now=0.0)

    policy._manager = SimpleNamespace(scheduler=SimpleNamespace(tasks={}))
    write_atomically(path, TIMED.format(cool="0", copy="5s", drop="1s"))
    reload_now(policy)
    assert policy.rebalancer is rebalancer and rebalancer.book is book
    assert (book.cooldown, book.copy_timeout, book.drop_timeout) == (0.0, 5.0, 1.0)
    status = policy.section(RebalanceSection).status()
    assert status["cool_down"] == 0.0
    assert status["copy_timeout"] == 5.0
    # The new cool-down counts from when the key started cooling: 0 s is over already.
    assert "cooling" not in book.cooling(0.0)
    # The move in flight is kept, and the new copy-timeout applies to it.
    assert list(book.pending) == ["moving"]
    settled = book.settle(6.0, holders={"moving": {"a"}}.get, alive={"a", "b"})
    assert settled.void == (
        (PendingMove("moving", "a", "b", 1, 0.0), "copy did not land within 5s"),
    )
