"""A completion's refill by hand-over: the slot a release frees passes to the next payload in the
release's own transaction, so a refill costs what a release costs plus a receive, a start and a
delete (``Store.hand_over``).

    completion of E (on shard i)              SQS FIFO        DynamoDB                       Step Functions
    ────────────────────────────              ────────        ────────                       ──────────────
    BatchGet EXEC#E + SLOTS#launcher ─────────────────────────► E holds shard i; the pool is
                                                                neither frozen nor paused
    receive 1 (no wait) ◄────────────────────  M (name N)
    validate M: plain? (no awaits, no key, no pointer, not E's key)
    TransactWrite ────────────────────────────────────────────► shard i: REMOVE E, SET N
                                                                  IF E there AND size ≤ cap
                                                                PAYLOAD#<E's key>: released,
                                                                  receipt              IF holder = E
                                                                EXEC#E: ended    IF live, parked as read
                                                                PAYLOAD#<M's key>: holder = N
                                                                                       IF free
                                                                EXEC#N: CLAIMED, start mark
                                                                                 IF no parked
    StartExecution(N, M's body) ───────────────────────────────────────────────────────► RUNNING
    delete M ──────────────────────────────►

The swap is the claim: N takes E's slot only where E holds it and the shard is within its cap, so
a lowered MAX that froze the pool, or a cap an adoption overran, hands nothing over. N is left
CLAIMED: no RUNNING mark is written (a redelivered M finds N's claim and asks DescribeExecution
before it starts anything; reconciliation asks it of a claim it does not see listed). Where the
successor cannot ride the release (its key held, or the same as E's; a run-once key that has
SUCCEEDED; no room on the shard) the release goes alone and M is claimed its own way, as a refill
did before. Where the queue had nothing (the receive does not wait: the release is on hold meanwhile),
the refill after the release receives as before, waiting, and takes what the release woke (a
deferred duplicate, a key's waiter, a waiter whose awaits it met, an effect) or what arrived. Where
the pool has no room (frozen, paused) or E holds a slot from before the shards, nothing is received
and the refill reads the slots as before.

Crash points:

    after the receive, before the write   E still holds; M returns after its visibility timeout.
                                          EventBridge retries the event, or reconciliation finds
                                          E ended and releases it.
    after the write, before the start     E released, N CLAIMED; M returns with the same id, so
                                          the same name: the claim is N's own, it resumes. E's
                                          wake-ups (parked, key line, waiters) are the sweeps'.
    reconciliation would block N (a        the block is refused (N carries its start mark): N starts
    redriven run of its key)               beside that run, as if the run had been redriven after
                                           N's start; the key is marked, so N's successor adopts it.
    after the start, before the delete    M returns; DescribeExecution finds N running: deleted.
    StartExecution refused for sure       N's claim is rolled back (fenced by its version) and M
                                          returned, as any refused start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from sluice.core.errors import InvalidPayload, TransientError
from sluice.core.gates import OPEN, Gate, Grant
from sluice.core.model import Claim, ExecutionRecord, Message, Payload
from sluice.core.names import ORIGIN_ATTRIBUTE, execution_name, origin_id
from sluice.core.ports import Executions, Queue
from sluice.core.validation import KEY_ATTRIBUTE, validate_message
from sluice.features.attributes import check_attributes
from sluice.features.lanes import LANE_ATTRIBUTE
from sluice.features.pointers import POINTER_FIELD
from sluice.features.receipts import ONCE_ATTRIBUTE, is_once

# The only Sluice attributes a message may carry to ride a release: its key, its origin (a parked
# message sent back), run-once, its lane's stamp. Any other (awaits and their policy, a concurrency
# key or its ticket, anything added later) means more than a claim before its start: it is claimed
# its own way after the release, where every attribute is checked (a bad one dead-lettered).
PLAIN_ATTRIBUTES = frozenset({KEY_ATTRIBUTE, ORIGIN_ATTRIBUTE, ONCE_ATTRIBUTE, LANE_ATTRIBUTE})


class HandOverOffer:
    """``sluice.launch.completion.Offer`` for a completion's refill: receives one message, when the freed
    slot can pass on, and offers it as the successor when it needs nothing but a claim."""

    def __init__(
        self,
        *,
        queue: Queue,
        executions: Executions,
        now: Callable[[], float],
        claim_timeout: float,
        time_left: Callable[[], bool],
        gate: Gate = OPEN,
    ) -> None:
        self.queue, self.executions, self.now = queue, executions, now
        self.claim_timeout, self.time_left = claim_timeout, time_left
        self.gate = gate  # a grant before the receive, given back unless a message came
        self.grant: Grant | None = None  # taken where the gate has a limit in force
        self.asked = False  # the release read its record and asked (it holds the lease)
        self.room = False  # and the freed slot could pass on: a receive was made
        self.message: Message | None = None
        self.name: str | None = None  # the successor's name, when one was offered
        self.claimed = False

    def take(self, record: ExecutionRecord, room: bool) -> Claim | None:
        self.asked, self.room = True, room and self.time_left()
        if not self.room or not self._granted():
            return None
        # No wait: the release is on hold until this returns. With the queue empty the refill after
        # the release receives as before, waiting, and finds what that release woke.
        try:
            received = self.queue.receive(1, 0)
        except TransientError:
            return None  # the release goes on alone; the refill after it receives, or is skipped
        if not received:
            return None
        self.message = received[0]
        payload = _plain(self.message)
        if payload is None:
            return None
        message_id = origin_id(self.message.message_id, self.message.attributes)
        self.name = execution_name(payload.key, message_id)
        now = self.now()
        return Claim(
            key=payload.key,
            name=self.name,
            message_id=message_id,
            now=now,
            claim_expires_at=now + self.claim_timeout,
            arn=self.executions.arn_for(self.name),
            once=is_once(self.message),
            copy_id=self.message.message_id,
        )

    def settled(self, claimed: bool) -> None:
        self.claimed = claimed
        # A message received spends the grant, claimed here or its own way after the release
        # (``Launcher._admit_received``, which may start it); none received gives it back.
        if self.grant is not None and self.message is None:
            with contextlib.suppress(TransientError):  # kept spent: one start fewer, never one more
                self.gate.give_back(self.grant, 1)

    def _granted(self) -> bool:
        """A grant from the gate (``sluice.core.gates``): none, and nothing is received; the
        refill after the release finds the gate shut too."""
        try:
            grant = self.gate.before_receive(None, 1, self.now())
        except TransientError:
            return False
        self.grant = grant if grant.gated else None
        return grant.n > 0

    @property
    def held(self) -> bool:
        """The gate had no room: the refill after the release has none either."""
        return self.grant is not None and self.grant.n == 0

    @property
    def handed(self) -> dict[str, str]:
        """The message the hand-over claimed, by id, with its name (empty when it claimed none)."""
        if self.claimed and self.message is not None and self.name is not None:
            return {self.message.message_id: self.name}
        return {}


def _plain(message: Message) -> Payload | None:
    """The payload, when claiming is all it needs before its start; else None (claimed, parked or
    dead-lettered its own way after the release, with the reason that path gives)."""
    if any(a.startswith("sluice-") and a not in PLAIN_ATTRIBUTES for a in message.attributes):
        return None
    if check_attributes(message) is not None:
        return None  # dead-lettered by admission, with the attribute named
    try:
        payload = validate_message(message)
    except InvalidPayload:
        return None
    if POINTER_FIELD in payload.body or "\\u" in payload.body:
        return None
    return payload
