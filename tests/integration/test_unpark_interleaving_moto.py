"""A park landing inside ``unpark`` (explorer seed 227091189).

``ParkingTable.unpark`` marks each ``PARK#`` woken and takes its id out of the holder's ``parked``
set. In two writes, a park of the same message id behind the same holder (a copy of the woken
message, the holder live again) landing between them was taken out of ``parked`` unwoken, and the
index dropped the holder: nothing woke that message any more, the sweep included::

    waker (unpark H, [m])                  another launcher
    PARK#m woken                           (a copy of m, H running again)
                                           park m behind H: PARK#m unwoken, H.parked {m}, index {H}
    H.parked DELETE m    → {}
    index DELETE H IF H.parked absent ✓    → PARK#m unwoken, behind H, on no index

The mark and the removal are one transaction now: the park lands before it (and is the message the
waker re-sent) or after it, and stays on the index. The broken variant ``unpark_mark_apart``
(tests/explorer/broken.py) is the code before.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from sluice.core.clock import FakeClock
from sluice.core.model import Outcome
from sluice.core.names import named_entry
from sluice.launch.settings import DuplicatePolicy
from tests.explorer.broken import VARIANTS, patch
from tests.support.aws import build_stack


def _park_after_the_woken_mark(stack: Any, variant: str | None = None) -> tuple[Any, str, str, Counter[str]]:
    stack.send({"id": "same", "v": 1}, group="g")
    stack.launcher().tick()
    (holder,) = stack.running()
    waiting_id = stack.send({"id": "same", "v": 2}, group="g2")
    assert stack.launcher().tick().n(Outcome.DEFERRED) == 1
    store = stack.runtime().store()
    (parked,) = store.parked_messages(holder, [named_entry("same", waiting_id)])

    waker = stack.runtime()
    fired: Counter[str] = Counter()

    def park_again(params: dict[str, Any], **_: Any) -> None:
        if fired["parked"]:
            return
        if fired["marked"]:  # the waker's next write after its woken mark
            fired["parked"] += int(stack.runtime().store().park(parked))  # its own clients
        elif "SET woken_at" in json.dumps(params):
            fired["marked"] += 1

    waker.client("dynamodb").meta.events.register("before-parameter-build.dynamodb", park_again)
    saved = patch(VARIANTS[variant][1]) if variant else []
    try:
        waker.store().unpark(holder, [parked.entry], woken=[parked], now=1.0)
    finally:
        patch(saved)
    return store, holder, waiting_id, fired


def test_a_park_landing_after_the_woken_mark_stays_parked_on_the_index(session) -> None:
    stack = build_stack(session, clock=FakeClock(), duplicate_policy=DuplicatePolicy.DEFER)
    store, holder, waiting_id, fired = _park_after_the_woken_mark(stack)
    assert fired["parked"] == 1  # the fault fired: parked again right after the woken mark
    entry = named_entry("same", waiting_id)
    assert [p.message_id for p in store.parked_messages(holder, [entry])] == [waiting_id]  # unwoken
    assert store.executions([holder])[holder].parked == frozenset({entry})  # its end wakes it
    assert holder in store.parked_holders()  # and the sweep finds it if that wake-up is lost


def test_the_mark_and_the_removal_apart_lose_the_park(session) -> None:
    """The broken variant, on the same interleaving: the park is left unwoken on no index."""
    stack = build_stack(session, clock=FakeClock(), duplicate_policy=DuplicatePolicy.DEFER)
    store, holder, waiting_id, fired = _park_after_the_woken_mark(stack, "unpark_mark_apart")
    assert fired["parked"] == 1
    entry = named_entry("same", waiting_id)
    assert [p.message_id for p in store.parked_messages(holder, [entry])] == [waiting_id]
    assert store.executions([holder])[holder].parked == frozenset()
    assert holder not in store.parked_holders()
