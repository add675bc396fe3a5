"""The waiting room for deferred duplicates (``SLUICE_DUPLICATE_POLICY=defer``).

A message whose key is held by a live execution is parked in the table behind that execution and
deleted from the queue: it spends no receives and does not hold its FIFO group while it waits.
When the execution's lease is released (its end, a rolled-back claim, reconciliation), every
message parked behind it goes back to the queue, in its group, carrying its original message id
(``sluice-origin-message-id``), from which its execution name is derived as before. A wake-up lost
to a crash is found by reconciliation, which looks at every execution with messages parked behind
it and wakes those whose lease has ended.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from sluice.core.model import ExecutionRecord, ParkedMessage, Payload
from sluice.core.names import origin_id
from sluice.core.ports import Queue, Store
from sluice.features.keys import waiter_attributes

log = logging.getLogger("sluice.parking")


def park(*, store: Store, payload: Payload, holder: str, now: float) -> bool:
    """Park ``payload``'s message behind ``holder``. False when ``holder`` is no longer live."""
    message = payload.message
    parked = ParkedMessage(
        message_id=origin_id(message.message_id, message.attributes),
        key=payload.key,
        holder=holder,
        body=message.body,
        group_id=message.group_id,
        # Without its origin id (given again when it is sent back) and without a key's ticket: a
        # woken waiter deferred here gave its kept slot up, and comes back as a newcomer to the line.
        attributes=waiter_attributes(message),
        parked_at=now,
        copy_id=message.message_id,
    )
    return store.park(parked)


def wake(*, store: Store, queue: Queue, record: ExecutionRecord, now: float) -> int:
    """Send every message parked behind ``record`` back to the queue. Returns how many."""
    waiting = store.parked_messages(record.name, record.parked) if record.parked else []
    for parked in waiting:
        # An item the previous version parked has no copy id: its re-send is told apart from that
        # version's (whose deduplication id SQS remembers 5 minutes) by when it was parked.
        queue.requeue(
            parked if parked.copy_id else replace(parked, copy_id=f"parked-at-{parked.parked_at!r}")
        )
        log.info(
            "parked message woken",
            extra={"correlation_id": parked.key, "message_id": parked.message_id, "holder": record.name},
        )
    # Every id the release read, woken now or not waiting for it any more; never one parked since
    # (behind a new claim of the same name, whose end wakes it), nor a copy re-sent and parked again.
    store.unpark(record.name, record.parked, woken=waiting, now=now)
    return len(waiting)


def sweep(*, store: Store, queue: Queue, now: float, holders: frozenset[str] | None = None) -> int:
    """Wake messages parked behind executions whose lease has ended (a wake-up lost to a crash).
    ``holders``: the index as already read (``Store.rooms``)."""
    holders = store.parked_holders() if holders is None else holders
    if not holders:
        return 0
    records = store.executions(holders)
    woken = 0
    for name in sorted(holders):
        record = records.get(name)
        if record is None:
            store.unpark(name, (), now=now)
        elif not record.state.holds_lease:
            woken += wake(store=store, queue=queue, record=record, now=now)
    return woken
