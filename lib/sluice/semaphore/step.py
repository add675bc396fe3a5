"""Semaphore step: a named semaphore that workflows acquire around a critical section.

An Acquire task (``.waitForTaskToken``) hands Sluice its token: ``acquire`` puts the acquisition in the
semaphore's FIFO line and runs the hand-off, which answers SendTaskSuccess once a permit is free. A
waiting execution spends no state transition and no Lambda time. ``release`` (a Release state) and
``release_execution`` (the execution ended, by any path) free permits and hand them to the oldest live
waiter. Permits are slots of the pool ``sem:<name>`` (``sluice.primitives.slots``) held by
``<hash of the execution ARN>:<acquisition id>`` (``sluice.semaphore.model``): one execution may hold
several semaphores, and a release frees only the permit of its own (execution, acquisition id).

Records (``SemaphoreStore``): per (semaphore, holder) an acquisition record with the full execution
ARN, the acquisition id, the latest token, a generation, a state and its ticket; per semaphore the line
(``head``: last ticket served, ``tail``: last issued) and one item per ticket naming holder and
generation; per execution an index of ``<semaphore>|<acquisition id>`` (release_execution reads no more).

    (none | RELEASED) ─acquire─▶ WAITING ─hand-off─▶ GRANTED ─release / execution ended─▶ RELEASED
                                    └────────── release / execution ended / token gone ──────┘

Every acquisition goes through the line, even when a permit is free: a newcomer never overtakes a
waiter that a release's hand-off has not reached yet, and tokens are answered from one place.

Lost wake-up: enqueue, then hand off once more
----------------------------------------------

    acquirer A                                 releaser B (holds the last permit)
    ──────────                                 ──────────────────────────────────
    reads the record: a new acquisition
                                               release: permit freed
                                               hand-off: the line is empty → done
    ticket 7 (ADD tail), ticket item written
    returns "waiting"                    ✗     nobody hands off again: A waits for ever
    hand-off: head 6, ticket 7, a permit free → grant, claim, SendTaskSuccess   ✓

The same holds inside the hand-off: one that finds no permit for the head gives its grant back and
looks at the permits once more (a release's hand-off may have seen the grant and stopped meanwhile).

The grant first, then the permit; release marks first, then frees
-----------------------------------------------------------------

The hand-off records the grant on the acquisition (WAITING → GRANTED, ``granted_at``) before it claims
a permit, so that one hand-off claims for a waiter (a holder claimed on two shards would be two
permits), and reads the record again after its claim. A release marks the record RELEASED, then frees
(``free``: the slot's release and the index entry in one transaction, IF RELEASED):

    hand-off                                   release_execution (the execution ended)
    ────────                                   ───────────────────────────────────────
    mark GRANTED IF WAITING
                                               mark RELEASED
                                               free H: no permit held yet
    claim a permit for H
    read the record: RELEASED → free H   ✓     (read before the mark: GRANTED; then the
                                                release's free comes after the claim and takes it)

An execution that acquires again with the same acquisition id (a loop) reuses the holder name. Frees
are conditioned on the record being RELEASED at that instant, so a late free never takes the permit of
the next generation, which moved the record out of RELEASED before anything was claimed for it.

Crash between grant and SendTaskSuccess: the delivery grace
-----------------------------------------------------------

Once delivered, the task is closed: a second SendTaskSuccess answers TaskTimedOut or InvalidToken,
as for a dead waiter, so a resend cannot tell "delivered before" from "gone". Only the hand-off that
made the grant may give the permit back on such an answer; another resends only after
``granted_at + grace``, taking the delivery over with a conditional write that also fences the first
one's give-back (``end IF token = T AND granted_at = t``):

    hand-off 1                                 hand-off 2
    ──────────                                 ──────────
    mark GRANTED (granted_at t), claim H
    …crash before SendTaskSuccess…             now < t + grace: a delivery is under way → stop
                                               now ≥ t + grace: take over (granted_at t → t2 IF t)
                                               SendTaskSuccess: delivered   ✓ once
                                               (gone: kept unless the execution has ended: it may
                                                have been delivered before the crash)

A repeated acquire with a new token (the Acquire task retried) changes ``token``: the first hand-off's
give-back then fails, and it sends the new token instead.
"""

from __future__ import annotations

import random

from sluice.core.errors import SlotsFull, TransientError
from sluice.core.ports import Clock
from sluice.primitives.slots import Capacity, Occupancy, Plan, candidates
from sluice.semaphore.model import (
    UNKNOWN_ERROR,
    AcquireResult,
    Acquisition,
    BadSemaphoreName,
    Delivery,
    Freed,
    HandOff,
    Holder,
    Opened,
    Outcome,
    Released,
    SemaphoreStatus,
    SemaphoreStore,
    State,
    Tokens,
    Waiter,
    acquisition_of,
    holder_name,
    pool_of,
)

__all__ = ["DELIVERY_GRACE", "Semaphores"]

DELIVERY_GRACE = 60.0  # seconds; longer than any function that hands off may run
MAX_STEPS = 1_000  # tickets one hand-off looks at
ROUNDS = 5


def _shards_of(occupancy: Occupancy, holder: str) -> list[int]:
    return [s.index for s in occupancy.shards if holder in s.holders]


def _ended(status: str | None) -> bool:
    return status != "RUNNING"


def _output(record: Acquisition) -> dict[str, object]:
    return {"semaphore": record.semaphore, "acquisitionId": record.acquisition_id}


class Semaphores:
    def __init__(
        self,
        store: SemaphoreStore,
        tokens: Tokens,
        clock: Clock,
        *,
        grace: float = DELIVERY_GRACE,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.slots = store.slots
        self.tokens = tokens
        self.clock = clock
        self.grace = grace
        self.rng = rng or random.Random()

    def _now(self, now: float | None) -> float:
        return self.clock.now() if now is None else now

    # -- acquire and release ------------------------------------------------------------------------

    def acquire(
        self,
        semaphore: str,
        execution_arn: str,
        acquisition_id: str,
        task_token: str,
        now: float | None = None,
    ) -> AcquireResult:
        """Join the line and hand off. Asked again for the same (execution, acquisition id): the same
        place or permit, answered on the newest token."""
        name, holder = semaphore, holder_name(execution_arn, acquisition_id)
        pool = pool_of(name)
        if not task_token:
            raise BadSemaphoreName("an acquisition needs a task token")
        now = self._now(now)
        for _ in range(ROUNDS):
            current = self.store.acquisition(name, holder)
            if current is not None and current.state is not State.RELEASED:
                if current.token != task_token:
                    current = self.store.refresh(name, holder, current.gen, task_token)
                    if current is None:
                        continue
                if current.state is State.GRANTED and current.delivered_at is not None:
                    self.tokens.succeed(task_token, _output(current))  # gone: it was answered already
                    return AcquireResult(Outcome.GRANTED, name, acquisition_id, current.ticket)
                return self._after_hand_off(name, holder, acquisition_id, now)
            if current is not None and current.token == task_token:
                return AcquireResult(Outcome.RELEASED, name, acquisition_id, current.ticket)
            if self.slots.occupancy(pool).version == 0:
                self.tokens.fail(task_token, UNKNOWN_ERROR, f"no semaphore named {name!r}")
                return AcquireResult(Outcome.REFUSED, name, acquisition_id)
            record = Acquisition(
                semaphore=name,
                execution_arn=execution_arn,
                acquisition_id=acquisition_id,
                token=task_token,
                gen=(current.gen if current else 0) + 1,
                state=State.WAITING,
                ticket=self.store.take_ticket(name),
                requested_at=now,
            )
            if self.store.open(record, current.gen if current else None, now) is Opened.OPENED:
                return self._after_hand_off(name, holder, acquisition_id, now)
        raise TransientError(f"acquire on {name!r}: the record kept changing", operation="acquire")

    def _after_hand_off(self, name: str, holder: str, acquisition_id: str, now: float) -> AcquireResult:
        self.hand_off(name, now)
        record = self.store.acquisition(name, holder)
        if record is None or record.state is State.RELEASED:
            return AcquireResult(Outcome.RELEASED, name, acquisition_id, record.ticket if record else None)
        outcome = Outcome.GRANTED if record.state is State.GRANTED else Outcome.WAITING
        return AcquireResult(outcome, name, acquisition_id, record.ticket)

    def release(
        self, semaphore: str, execution_arn: str, acquisition_id: str, now: float | None = None
    ) -> Released:
        """Free the permit of this (execution, acquisition id), or take it out of the line; hand off."""
        name, holder, now = semaphore, holder_name(execution_arn, acquisition_id), self._now(now)
        result = Released.NOTHING
        for _ in range(ROUNDS):
            record = self.store.acquisition(name, holder)
            if record is None or record.state is State.RELEASED:
                break
            if self.store.end(name, holder, record.gen, now, "released"):
                result = Released.LINE if record.state is State.WAITING else Released.PERMIT
                break
        if self._free(name, holder):  # also after a release that stopped between its two steps
            result = Released.PERMIT
        self.hand_off(name, now)
        return result

    def release_execution(
        self, execution_arn: str, now: float | None = None
    ) -> list[tuple[str, str, Released]]:
        """Everything the execution holds or waits for, from its index; its places in line are skipped."""
        now = self._now(now)
        return [
            (name, acquisition_id, self.release(name, execution_arn, acquisition_id, now))
            for name, acquisition_id in self.store.held_by(execution_arn)
        ]

    def _free(self, name: str, holder: str, shard: int | None = None) -> bool:
        """Give back the holder's permits if its record is RELEASED: the one on ``shard``, or every
        one found (and the index entry even when none is held). True when a permit was freed."""
        freed = False
        for _ in range(ROUNDS):
            shards = [shard] if shard is not None else _shards_of(self.slots.occupancy(pool_of(name)), holder)
            if not shards:
                self.store.free(name, holder, None)  # the index entry alone
                return freed
            results = [self.store.free(name, holder, s) for s in shards]
            if Freed.NOT_RELEASED in results:
                return freed
            freed = freed or Freed.FREED in results
            if Freed.MOVED not in results:
                return freed
            shard = None  # released by someone else meanwhile: look again
        return freed

    # -- the hand-off -------------------------------------------------------------------------------

    def hand_off(self, semaphore: str, now: float | None = None) -> HandOff:
        """While a permit is free, grant the oldest live waiter. Safe to run anywhere, any number of
        times at once: the head moves by one conditional write per ticket."""
        name, now = semaphore, self._now(now)
        done = HandOff([], [])
        for _ in range(MAX_STEPS):
            head, tail = self.store.line(name)
            if head >= tail:
                break
            number = head + 1
            ticket = self.store.ticket(name, number)
            if ticket is None:  # its acquirer is between ADD tail and the item, or died there
                if self._occupancy(name).free == 0:
                    # Nothing to hand off: leave it its place. It hands off itself once enqueued,
                    # and if it died there, the hand-off of the next free permit passes it.
                    break
                if self.store.tombstone(name, number, now):
                    self.store.advance(name, number, drop=False)
                continue
            if ticket.holder is None:
                self.store.advance(name, number, drop=False)
                continue
            record = self.store.acquisition(name, ticket.holder)
            if (
                record is None
                or (record.gen, record.ticket) != (ticket.gen, number)
                or record.state is State.RELEASED
            ):
                if record is not None and record.state is State.RELEASED and record.ticket == number:
                    # Released at its place in line, and its release may have stopped between its
                    # two steps (a crash after the mark): a waiter holds no permit for the sweep to
                    # find, and a granted one's retried event would find no index entry left. Its
                    # permit, if any, and its index entry go here together (IF RELEASED).
                    self._free(name, ticket.holder)
                self.store.advance(name, number, drop=True)
                done.skipped.append(
                    Waiter(number, ticket.execution_arn, ticket.acquisition_id, ticket.enqueued_at)
                )
                continue
            if record.state is State.WAITING:
                if not self._grant(name, record, now, done):
                    break
            elif record.delivered_at is not None:
                self.store.advance(name, number, drop=True)
            elif record.granted_at is not None and now < record.granted_at + self.grace:
                break  # another hand-off is delivering it
            elif not self._take_over(name, record, now, done):
                break
        return done

    def _grant(self, name: str, record: Acquisition, now: float, done: HandOff) -> bool:
        """Grant the head waiter a permit and deliver it. False: no permit is free."""
        occupancy = self._occupancy(name)
        if occupancy.free == 0 and not _shards_of(occupancy, record.holder):
            return False
        granted = self.store.grant(name, record.holder, record.gen, record.ticket, now)
        if granted is None:
            return True  # granted by another hand-off, or it left the line: look again
        assert granted.granted_at is not None
        shard = self._claim(name, record.holder, now, occupancy)
        if shard is None:
            self.store.ungrant(name, record.holder, record.gen, granted.granted_at)
            return self._occupancy(name).free > 0  # freed since: its hand-off may have seen our grant
        if self._still(name, granted, shard):
            self._deliver(name, granted, shard, now, done, fresh=True)
        return True

    def _take_over(self, name: str, record: Acquisition, now: float, done: HandOff) -> bool:
        assert record.granted_at is not None
        taken = self.store.take_over(name, record.holder, record.gen, record.granted_at, now)
        if taken is None:
            return True
        shard = self._claim(name, record.holder, now, self._occupancy(name))
        if shard is None:  # the crash came before the claim: never delivered, back in line
            assert taken.granted_at is not None
            self.store.ungrant(name, record.holder, record.gen, taken.granted_at)
            return self._occupancy(name).free > 0
        if self._still(name, taken, shard):
            self._deliver(name, taken, shard, now, done, fresh=False)
        return True

    def _still(self, name: str, granted: Acquisition, shard: int) -> bool:
        """After a claim: is the grant still this one? If the record was released meanwhile, free
        what was claimed; if another hand-off took the delivery over, keep one permit (the lowest
        shard's) of the holder's, as every claimer does, so racing claims leave exactly one."""
        current = self.store.acquisition(name, granted.holder)
        if current is not None and (current.gen, current.state, current.granted_at) == (
            granted.gen,
            State.GRANTED,
            granted.granted_at,
        ):
            return True
        if current is None or current.state is State.RELEASED or current.gen != granted.gen:
            self._free(name, granted.holder)
        else:
            self._keep_one(name, granted.holder)
        return False

    def _keep_one(self, name: str, holder: str) -> int | None:
        pool = pool_of(name)
        shards = _shards_of(self.slots.occupancy(pool), holder)
        for extra in shards[1:]:
            self.slots.release(pool, extra, holder)
        return shards[0] if shards else None

    def _occupancy(self, name: str) -> Occupancy:
        pool = pool_of(name)
        occupancy = self.slots.occupancy(pool)
        if occupancy.frozen and occupancy.running <= occupancy.limit:
            self.slots.rebalance(pool)  # a lowered limit the holders fit under again
            occupancy = self.slots.occupancy(pool)
        return occupancy

    def _claim(self, name: str, holder: str, now: float, occupancy: Occupancy) -> int | None:
        """The shard of the holder's permit: held already (a crashed hand-off claimed it) or claimed
        now. None when no permit is free."""
        pool = pool_of(name)
        for _ in range(ROUNDS):
            held = _shards_of(occupancy, holder)
            if held:
                return held[0] if len(held) == 1 else self._keep_one(name, holder)
            order = candidates(occupancy, self.rng)
            if not order:
                return None
            for shard in order[:3]:
                try:
                    self.slots.claim(pool, shard, holder, now)
                except SlotsFull:
                    continue
                return shard
            occupancy = self._occupancy(name)
        return None

    def _deliver(
        self, name: str, record: Acquisition, shard: int, now: float, done: HandOff, *, fresh: bool
    ) -> None:
        token, holder = record.token, record.holder
        gone = Waiter(record.ticket, record.execution_arn, record.acquisition_id, record.requested_at)
        for _ in range(ROUNDS):
            if self.tokens.succeed(token, _output(record)) is Delivery.DELIVERED:
                self.store.delivered(name, holder, record.gen, now, sure=True)
                done.granted.append(Holder(record.execution_arn, record.acquisition_id, now))
                break
            if not fresh:  # it may have been delivered before: keep it unless the execution ended
                if _ended(self.tokens.execution_status(record.execution_arn)):
                    if self.store.end(name, holder, record.gen, now, "execution-ended"):
                        self._free(name, holder, shard)
                    done.skipped.append(gone)
                else:
                    self.store.delivered(name, holder, record.gen, now, sure=False)
                break
            if self.store.end(
                name, holder, record.gen, now, "token-gone", token=token, granted_at=record.granted_at
            ):
                self._free(name, holder, shard)
                done.skipped.append(gone)
                break
            again = self.store.acquisition(name, holder)
            if again is None or (again.gen, again.state, again.granted_at) != (
                record.gen,
                State.GRANTED,
                record.granted_at,
            ):
                break  # released, or taken over by another hand-off
            token = again.token  # a repeated acquire brought a new token: send that one
        else:
            return  # kept changing: the next hand-off looks again
        self.store.advance(name, record.ticket, drop=True)

    # -- reconciliation, limits, status -------------------------------------------------------------

    def reconcile(self, semaphore: str, now: float | None = None) -> list[Holder]:
        """Release every permit whose execution has ended (DescribeExecution), or whose record is
        RELEASED already (a release that stopped between its two steps); then hand off."""
        name, now = semaphore, self._now(now)
        occupancy = self.slots.occupancy(pool_of(name))
        holders = {h: since for s in occupancy.shards for h, since in s.holders.items()}
        statuses: dict[str, str | None] = {}
        out = []
        for holder, record in sorted(self.store.acquisitions(name, sorted(holders)).items()):
            if record.state is not State.RELEASED:
                arn = record.execution_arn
                if arn not in statuses:
                    statuses[arn] = self.tokens.execution_status(arn)
                if not _ended(statuses[arn]):
                    continue
                self.release(name, arn, record.acquisition_id, now)
            elif not self._free(name, holder):
                continue
            out.append(Holder(record.execution_arn, record.acquisition_id, holders[holder]))
        self.hand_off(name, now)
        return out

    def create(self, semaphore: str, limit: int) -> bool:
        """Create the semaphore with ``limit`` if it does not exist: the pool item and its shards in
        one conditional create (``attribute_not_exists``). False when it exists, however recently:
        its limit stays. A new pool has nobody in line (an acquire is refused until it exists)."""
        return self.slots.set_limit(Capacity(pool_of(semaphore), limit, only_new=True)) is not None

    def set_limit(self, semaphore: str, limit: int, now: float | None = None) -> Plan | None:
        """Put ``limit`` in force (a lowering evicts nobody: see ``sluice.primitives.slots``); then hand off."""
        plan = self.slots.set_limit(Capacity(pool_of(semaphore), limit))
        self.hand_off(semaphore, self._now(now))
        return plan

    def status(self, semaphore: str, *, max_waiters: int = 100) -> SemaphoreStatus:
        """The limit, the holders (oldest first) and up to ``max_waiters`` live waiters in line order."""
        name = semaphore
        occupancy = self.slots.occupancy(pool_of(name))
        holders = {h: since for s in occupancy.shards for h, since in s.holders.items()}
        head, tail = self.store.line(name)
        tickets = [t for t in self.store.tickets(name, head + 1, min(tail, head + max_waiters)) if t.holder]
        records = self.store.acquisitions(
            name, sorted(set(holders) | {t.holder for t in tickets if t.holder})
        )
        shown = tuple(
            Holder(records[h].execution_arn if h in records else "", acquisition_of(h), since)
            for h, since in sorted(holders.items(), key=lambda kv: (kv[1], kv[0]))
        )
        waiters = tuple(
            Waiter(t.number, t.execution_arn, t.acquisition_id, t.enqueued_at)
            for t in tickets
            if t.holder in records
            and (records[t.holder].gen, records[t.holder].ticket, records[t.holder].state)
            == (t.gen, t.number, State.WAITING)
        )
        return SemaphoreStatus(name, occupancy.limit, occupancy.frozen, shown, waiters, max(0, tail - head))
