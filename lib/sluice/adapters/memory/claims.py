"""``MemoryStore``'s claim and the marks on a live claim (``PayloadLeases``), each one write under
the table's lock, as DynamoStore writes each in one request or transaction. For tests and the
benchmark."""

from __future__ import annotations

from dataclasses import replace

from sluice.adapters.memory.keys import MemoryKeys
from sluice.adapters.memory.table import MemoryLanes, MemoryPool, MemoryTable
from sluice.core.errors import AlreadyDone, AlreadyRan, KeyFull, LeaseHeld, OnceUnknown
from sluice.core.model import Claim, ExecutionRecord, PayloadRecord, PayloadState
from sluice.core.records import KeyState

HISTORY_LIMIT = 20
HISTORY_KEEP = 10


class MemoryClaims:
    def __init__(self, table: MemoryTable, pool: MemoryPool, lanes: MemoryLanes, keys: MemoryKeys) -> None:
        self.table = table
        self.pool = pool
        self.lanes = lanes
        self.keys = keys

    def claim(self, claim: Claim) -> None:
        with self.table.lock:
            current = self.table.payloads.get(claim.key)
            earlier = self._admitted(claim, current)
            self.table.holders.add(claim.name)
            if claim.lane is not None:
                self.lanes.hold(claim.lane, claim.name)
            if claim.ckey is not None:
                self.keys.hold(claim.ckey, claim.name, claim.ticket)
            self.table.payloads[claim.key] = _claimed_payload(claim, current)
            self.table.executions[claim.name] = _claimed_record(claim, earlier)

    def _admitted(self, claim: Claim, current: PayloadRecord | None) -> ExecutionRecord | None:
        """Raise as DynamoStore's claim refuses, in its order; else the earlier record of its name."""
        if claim.once and current is not None and (current.succeeded_by or current.once_unknown) is not None:
            raise AlreadyDone(current) if current.succeeded_by is not None else OnceUnknown(current)
        if current is not None and (
            current.holder is not None or current.redriven is not None or current.redriven_more
        ):
            raise LeaseHeld(current)
        earlier = self.table.executions.get(claim.name)
        if earlier is not None and (earlier.state.ended or earlier.outcome_unknown):
            raise AlreadyRan(earlier)
        if claim.ckey is not None:
            self.keys.admits(claim.ckey, ticket=claim.ticket, uncapped=claim.uncapped)
        if claim.fair_newcomer and self.keys.any_waiting():
            raise KeyFull(KeyState(claim.ckey or ""))
        if claim.lane is not None:
            self.lanes.admits(claim.lane)
        self.pool.admits(claim.name)
        return earlier

    # -- marks on a live claim ----------------------------------------------------------------------

    def renew(
        self,
        *,
        name: str,
        now: float,
        claim_expires_at: float,
        arn: str | None = None,
        copy_id: str | None = None,
    ) -> bool:
        with self.table.lock:
            record = self.table.executions.get(name)
            if record is None or record.state is not PayloadState.CLAIMED or record.blocked_by:
                return False
            if not _mark_ours(record, copy_id):
                return False  # another copy's mark (DynamoStore's MARK_OURS)
            self.table.executions[name] = replace(
                record,
                copy_id=copy_id or record.copy_id,
                arn=arn or record.arn,
                claim_expires_at=claim_expires_at,
                claim_version=record.claim_version + 1,
                suspect_since=None,
                suspect_by=None,
                starting_at=None,
            )
            return True

    def block(self, *, name: str, by: str, now: float) -> bool:
        with self.table.lock:
            record = self.table.executions.get(name)
            if record is None or record.state is not PayloadState.CLAIMED or record.starting_at is not None:
                return False
            self.table.executions[name] = replace(record, blocked_by=by)
            return True

    def mark_starting(self, *, name: str, now: float, copy_id: str | None = None) -> bool:
        with self.table.lock:
            record = self.table.executions.get(name)
            if record is None or record.state is not PayloadState.CLAIMED or record.blocked_by:
                return False
            if copy_id is not None and record.copy_id not in (None, copy_id):
                return False  # another copy renewed since (DynamoStore's RENEWED_OURS)
            self.table.executions[name] = replace(record, starting_at=now)
            return True

    def suspect(
        self, *, name: str, claim_version: int, reconciler: str, now: float, replacing: float | None = None
    ) -> bool:
        with self.table.lock:
            record = self.table.executions.get(name)
            if (
                record is None
                or record.state is not PayloadState.CLAIMED
                or record.claim_version != claim_version
                or record.suspect_since != replacing
            ):
                return False
            self.table.executions[name] = replace(record, suspect_since=now, suspect_by=reconciler)
            return True

    def mark_running(self, *, key: str, name: str, arn: str, started_at: float, now: float) -> bool:
        with self.table.lock:
            payload, record = self.table.payloads.get(key), self.table.executions.get(name)
            if (
                payload is None
                or payload.holder != name
                or record is None
                or record.state is not PayloadState.CLAIMED
            ):
                return False
            self.table.payloads[key] = replace(
                payload, state=PayloadState.RUNNING, updated_at=now, expires_at=0
            )
            self.table.executions[name] = replace(
                record,
                state=PayloadState.RUNNING,
                arn=arn,
                started_at=started_at,
                expires_at=0,
                suspect_since=None,
                suspect_by=None,
            )
            return True

    def mark_redriven(self, *, key: str, name: str, now: float, by: str | None = None) -> bool:
        with self.table.lock:
            payload = self.table.payloads.get(key)
            if payload is None or payload.holder == name:
                return False
            stampable = payload.redriven is None or (payload.redriven == name and payload.redriven_by == by)
            if by is not None and not payload.redriven_more and stampable:
                marked = replace(payload, redriven=name, updated_at=now, redriven_at=now, redriven_by=by)
            elif payload.redriven is None or payload.redriven == name:
                marked = replace(payload, redriven=name, updated_at=now, redriven_at=None, redriven_by=None)
            else:
                more = payload.redriven_more | {name}
                marked = replace(
                    payload, redriven_more=more, updated_at=now, redriven_at=None, redriven_by=None
                )
            self.table.payloads[key] = marked
            return True

    def clear_redriven(self, *, key: str, name: str, as_read: PayloadRecord | None = None) -> bool:
        with self.table.lock:
            payload = self.table.payloads.get(key)
            if payload is None:
                return False
            stamp_held = as_read is None or (payload.redriven_at, payload.redriven_by) == (
                as_read.redriven_at,
                as_read.redriven_by,
            )
            first = payload.redriven == name and stamp_held
            more = name in payload.redriven_more
            if first:
                payload = replace(payload, redriven=None, redriven_at=None, redriven_by=None)
            self.table.payloads[key] = replace(payload, redriven_more=payload.redriven_more - {name})
            return first or more


def _claimed_payload(claim: Claim, current: PayloadRecord | None) -> PayloadRecord:
    base = current or PayloadRecord(key=claim.key, state=PayloadState.CLAIMED)
    history = base.executions if len(base.executions) < HISTORY_LIMIT else base.executions[-HISTORY_KEEP:]
    return replace(
        base,
        state=PayloadState.CLAIMED,
        holder=claim.name,
        executions=(*history, claim.name),
        attempts=base.attempts + 1,
        updated_at=claim.now,
        expires_at=0,
        reason=None,
    )


def _mark_ours(record: ExecutionRecord, copy_id: str | None) -> bool:
    """A renewal by ``copy_id`` may lift the record's start mark: none, or its own."""
    return copy_id is None or record.starting_at is None or record.copy_id in (None, copy_id)


def _claimed_record(claim: Claim, earlier: ExecutionRecord | None) -> ExecutionRecord:
    return ExecutionRecord(
        name=claim.name,
        key=claim.key,
        message_id=claim.message_id,
        state=PayloadState.CLAIMED,
        claimed_at=claim.now,
        claim_expires_at=claim.claim_expires_at,
        arn=claim.arn,
        once=claim.once,
        ckey=claim.ckey,
        lane=claim.lane,
        lane_shard=None if claim.lane is None else 0,
        starting_at=claim.now,  # the start mark, in the claim (DynamoStore's record item)
        copy_id=claim.copy_id,
        # An earlier claim of this name whose waiters were never woken: they wait for this one.
        parked=earlier.parked if earlier is not None else frozenset(),
    )
