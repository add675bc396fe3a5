"""A park landing inside ``unpark``'s writes (explorer seed 227091189, open).

``ParkingTable.unpark`` marks each ``PARK#`` woken, then deletes the ids from the holder's ``parked``
set, then takes the holder off the ``PARKED`` index, in separate writes. A park of the same message
id behind the same holder (a copy of the woken message, the holder live again) landing between the
first write and the second is deleted from ``parked`` unwoken, and the index drops the holder:
nothing wakes that message any more, the sweep included::

    waker (unpark H, [m])                  another launcher
    PARK#m woken                           (a copy of m, H running again)
                                           park m behind H: PARK#m unwoken, H.parked {m}, index {H}
    H.parked DELETE m    → {}
    index DELETE H IF H.parked absent ✓    → PARK#m unwoken, behind H, on no index
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from sluice.core.clock import FakeClock
from sluice.core.model import Outcome
from sluice.launch.settings import DuplicatePolicy
from tests.support.aws import build_stack


@pytest.mark.xfail(strict=True, reason="open: explorer seed 227091189 (tests/explorer/README.md)")
def test_a_park_landing_inside_unpark_stays_on_the_index(session) -> None:
    stack = build_stack(session, clock=FakeClock(), duplicate_policy=DuplicatePolicy.DEFER)
    stack.send({"id": "same", "v": 1}, group="g")
    stack.launcher().tick()
    (holder,) = stack.running()
    waiting_id = stack.send({"id": "same", "v": 2}, group="g2")
    assert stack.launcher().tick().n(Outcome.DEFERRED) == 1
    store = stack.runtime().store()
    (parked,) = store.parked_messages(holder, [waiting_id])

    waker = stack.runtime()
    fired: Counter[str] = Counter()

    def park_again(params: dict[str, Any], **_: Any) -> None:
        if "DELETE parked" in params.get("UpdateExpression", "") and not fired["parked"]:
            fired["parked"] += int(stack.runtime().store().park(parked))  # its own clients

    waker.client("dynamodb").meta.events.register("before-parameter-build.dynamodb.UpdateItem", park_again)
    waker.store().unpark(holder, [waiting_id], now=1.0)
    assert fired["parked"] == 1  # the fault fired: parked again between the woken mark and the delete
    assert [p.message_id for p in store.parked_messages(holder, [waiting_id])] == [waiting_id]  # unwoken
    assert holder in store.parked_holders(), (
        "an unwoken park's holder is on no index: the sweep cannot find it"
    )
