"""A woken waiter that parks again before its wake has noted it keeps no slot (``sluice.features.keys``,
the wake's timeline), on moto with the real adapters.

    completion of a0 (key a, rate 1/second)      launcher B
    release a0; wake a: room 1 → send a1 (e)
                                                 (another grant of a takes the second's room)
                                                 receive a1: no grant → park again, replacing e
    woken 0 → 1, inflight += e

Before the fix, ``e`` kept a slot for nobody: the rate's room less the slots kept was 0, so no wake
sent a1 again until ``INFLIGHT_SECONDS`` (5 minutes) had passed. The interleaving is forced by a
botocore ``before-parameter-build`` hook on the completion's wake (the ``TransactWriteItems`` that moves
``woken``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sluice.adapters.dynamo.keys import KeysTable
from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.features.rate_limits import Rate, RateDefaults, key_scope
from tests.support.aws import build_stack


def _moves_woken(params: dict[str, Any], ckey: str) -> bool:
    return any(
        item.get("Update", {}).get("Key", {}).get("pk", {}).get("S") == f"CKEY#{ckey}"
        and item["Update"]["UpdateExpression"].startswith("SET #woken")
        for item in params.get("TransactItems", [])
    )


def at_the_wake(client: Any, ckey: str, act: Callable[[], None]) -> list[int]:
    """Run ``act`` once on ``client``, as its wake of ``ckey`` is about to note the waiter it sent
    (the transaction that moves ``woken``); the list returned records that it fired."""
    fired: list[int] = []

    def hook(params: dict[str, Any], **_: Any) -> None:
        if not fired and _moves_woken(params, ckey):
            fired.append(1)
            act()

    client.meta.events.register("before-parameter-build.dynamodb.TransactWriteItems", hook)
    return fired


def test_a_waiter_parked_again_before_its_wake_noted_it_is_woken_when_the_rate_has_room(session):
    assert _parked_again_then_started(session)


def test_a_park_again_that_does_not_note_its_entry_landed_is_caught(session, monkeypatch):
    """The variant: the park again only takes its entry out of ``inflight`` (the code before)."""
    line_item = KeysTable._line_item

    def unlanded(self: KeysTable, *args: Any, **kwargs: Any) -> dict[str, Any]:
        made = line_item(self, *args, **kwargs)
        update = made["Update"]
        update["UpdateExpression"] = update["UpdateExpression"].replace(" ADD #landed :replaces", "")
        update["ExpressionAttributeNames"].pop("#landed", None)
        return made

    monkeypatch.setattr(KeysTable, "_line_item", unlanded)
    with pytest.raises(AssertionError, match="not started within"):
        _parked_again_then_started(session)


def _parked_again_then_started(session: Any) -> bool:
    clock = FakeClock()
    stack = build_stack(
        session, max_concurrency=10, clock=clock, key_concurrency=5, rates=RateDefaults(key=Rate(1, 1))
    )
    stack.send({"id": "a0"}, group="g0", sluice_concurrency_key="a")
    stack.send({"id": "a1"}, group="g1", sluice_concurrency_key="a")
    stack.runtime().launcher().tick()  # a0 takes the second's grant and starts; a1 waits in a's line
    (a0,) = stack.running()
    assert a0.startswith("a0-") and stack.runtime().store().key_state("a").waiting == 1

    clock.advance(2)
    completion = stack.runtime()

    def meanwhile() -> None:
        other = stack.runtime()
        assert other.rates().take([key_scope("a")], 1, clock.now()).n == 1  # another start of a
        other.launcher().tick()  # receives a1, finds no grant: parks it again

    fired = at_the_wake(completion.client("dynamodb"), "a", meanwhile)
    completion.launcher().on_status_change(StatusChange.from_event(stack.finish(a0)))
    assert fired, "the wake never moved woken: the interleaving was not forced"
    state = stack.runtime().store().key_state("a")
    assert (state.waiting, state.holders) == (1, frozenset())  # a1 parked again, nothing runs

    for _ in range(6):  # 3 seconds: the rate has room again, far within INFLIGHT_SECONDS
        clock.advance(0.5)
        stack.runtime().launcher().tick()
    assert [n[:2] for n in stack.running()] == ["a1"], "a1 not started within 3 seconds"
    assert stack.runtime().store().key_state("a").waiting == 0
    assert stack.queue_counts() == (0, 0)
    return True
