"""``MemoryStore``'s release and adoption (``PayloadLeases``): each one write under the table's lock,
as DynamoStore writes each in one transaction. For tests and the benchmark."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from sluice.adapters.memory.awaits import MemoryAwaits
from sluice.adapters.memory.keys import MemoryKeys
from sluice.adapters.memory.table import MemoryLanes, MemoryTable
from sluice.core.model import ClaimFence, Ending, ExecutionRecord, PayloadRecord, PayloadState, record_expiry
from sluice.core.records import ReceiptOutput
from sluice.features.receipts import drops_once_claim


class MemoryReleases:
    def __init__(
        self, table: MemoryTable, lanes: MemoryLanes, keys: MemoryKeys, awaits: MemoryAwaits
    ) -> None:
        self.table = table
        self.lanes = lanes
        self.keys = keys
        self.awaits = awaits

    def release(
        self,
        name: str,
        ending: Ending,
        *,
        fence: ClaimFence | None = None,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
    ) -> ExecutionRecord | None:
        with self.table.lock:
            seen = self.table.executions.get(name)
        if confirm is not None and seen is not None and seen.adopted_at is not None and not confirm(seen):
            return None
        kept = None
        if output is not None and ending.state.ended and seen is not None and seen.state.holds_lease:
            kept = output(seen)  # outside the lock, as DynamoStore does it before its transaction
        with self.table.lock:
            record = self.table.executions.get(name)
            if record is None or not record.state.holds_lease or name not in self.table.holders:
                return None
            if fence is not None and not fence.holds(record):
                return None
            if confirm is not None and record.adopted_at is not None and not confirm(record):
                return None  # adopted since ``seen``: the end judged again, as DynamoStore does
            payload = self.table.payloads.get(record.key)
            if payload is None or payload.holder != name:
                return None
            self._free(record)
            self.table.payloads[record.key] = self._released_payload(payload, record, ending)
            self.table.executions[name] = self._ended_record(record, ending, kept)
            if kept is not None and kept.effects is not None:
                self.table.effects[name] = (
                    kept.effects
                )  # in the release's own write (sluice.features.effects)
            # Flagged as awaited once a waiter parked on the key (MemoryAwaits keeps every such key).
            return replace(record, awaited=self.awaits.is_awaited(record.key))

    def record_later_success(
        self, record: ExecutionRecord, *, ended_at: float, now: float, receipt: ReceiptOutput | None
    ) -> bool:
        with self.table.lock:
            current = self.table.executions.get(record.name)
            if current is None:
                return False
            fresh = int(now) + self.table.retention_seconds  # written afresh where TTL took it
            payload = self.table.payloads.get(record.key) or PayloadRecord(
                key=record.key,
                state=PayloadState.SUCCEEDED,
                updated_at=now,
                receipt=record.name,
                expires_at=fresh,
            )
            if current.state is not record.state or current.ended_at != record.ended_at:
                return False
            ending = Ending(PayloadState.SUCCEEDED, now, ended_at=ended_at)
            ended = self._ended_record(current, ending, receipt)
            self.table.executions[record.name] = replace(ended, error=None, cause=None)
            its_receipt = payload.receipt in (record.name, None)  # its own, or none (TTL took it)
            self.table.payloads[record.key] = replace(
                payload,
                succeeded_by=payload.succeeded_by or record.name,
                once_by=payload.once_by or (record.name if record.once else None),
                expires_at=0 if record.once else payload.expires_at,
                receipt=record.name if its_receipt else payload.receipt,
                receipt_state=PayloadState.SUCCEEDED if its_receipt else payload.receipt_state,
            )
            if receipt is not None and receipt.effects is not None:
                self.table.effects[record.name] = receipt.effects
            return True

    def _free(self, record: ExecutionRecord) -> None:
        self.table.holders.discard(record.name)
        if record.ckey is not None:
            self.keys.free(record.ckey, record.name)
        if record.lane is not None:
            self.lanes.free(record.lane, record.name)

    def _released_payload(
        self, payload: PayloadRecord, record: ExecutionRecord, ending: Ending
    ) -> PayloadRecord:
        name, state = record.name, ending.state
        once_by, unknown = payload.once_by, payload.once_unknown
        if (record.once and state is PayloadState.SUCCEEDED) or ending.outcome_unknown:
            once_by, unknown = once_by or name, name if ending.outcome_unknown else unknown
        # A once-key's success is kept: it must never run again, whatever ran after it.
        expires = 0 if once_by is not None else int(ending.now) + self.table.retention_seconds
        shown = state
        if drops_once_claim(record, state, ending.outcome_unknown) and payload.succeeded_by:
            shown = payload.receipt_state or PayloadState.SUCCEEDED  # a run-once claim dropped over a success
        return replace(
            payload,
            state=shown,
            holder=None,
            updated_at=ending.now,
            reason=ending.error or payload.reason,
            expires_at=expires,
            receipt=name if state.ended else payload.receipt,
            receipt_state=state if state.ended else payload.receipt_state,
            succeeded_by=payload.succeeded_by or (name if state is PayloadState.SUCCEEDED else None),
            once_by=once_by,
            once_unknown=unknown,
        )

    def _ended_record(
        self, record: ExecutionRecord, ending: Ending, kept: ReceiptOutput | None
    ) -> ExecutionRecord:
        outputs = {}
        if kept is not None:
            outputs = {"output": kept.inline, "output_ref": kept.pointer, "output_size": kept.size}
        return replace(
            record,
            state=ending.state,
            started_at=record.started_at if record.started_at is not None else ending.started_at,
            ended_at=ending.ended_at if ending.ended_at is not None else ending.now,
            error=ending.error or record.error,
            cause=ending.cause[:4_000] if ending.cause else record.cause,
            expires_at=record_expiry(
                ending.state,
                now=ending.now,
                retention_seconds=self.table.retention_seconds,
                ran=ending.outcome_unknown,
            ),
            outcome_unknown=record.outcome_unknown or ending.outcome_unknown,
            **outputs,
        )

    def sight_adoption(self, *, record: ExecutionRecord, by: str, now: float) -> bool:
        with self.table.lock:
            held = self.table.executions.get(record.name)
            if (
                held is None
                or held.state is not PayloadState.RUNNING
                or held.adopted_at is None
                or (held.adopted_at, held.adoptions) != (record.adopted_at, record.adoptions)
                or held.seen_by(by) is not None
            ):
                return False
            others = tuple(seen for seen in held.adoption_seen if seen[0] != by)
            seen = tuple(sorted((*others, (by, held.adopted_at, now))))
            self.table.executions[record.name] = replace(held, adoption_seen=seen)
            return True

    def adopt(
        self, *, name: str, now: float, redriven_at: float | None = None, by: str | None = None
    ) -> bool:
        with self.table.lock:
            record = self.table.executions.get(name)
            if record is None or record.state.holds_lease or name in self.table.holders:
                return False
            payload = self.table.payloads.get(record.key) or PayloadRecord(
                key=record.key, state=PayloadState.RUNNING
            )
            if payload.holder is not None:
                return False
            self.table.holders.add(name)
            if record.ckey is not None:
                self.keys.hold(record.ckey, name)  # it runs already: counted whatever the key's cap
            if record.lane is not None:
                self.lanes.adopt(record.lane, name)
            self.table.payloads[record.key] = replace(
                payload,
                state=PayloadState.RUNNING,
                holder=name,
                updated_at=now,
                expires_at=0,
                **(
                    {"redriven": None, "redriven_at": None, "redriven_by": None}
                    if payload.redriven in (None, name)
                    else {}
                ),
                redriven_more=payload.redriven_more - {name},
            )
            self.table.executions[name] = replace(
                record,
                state=PayloadState.RUNNING,
                ended_at=None,
                earlier_end_at=record.ended_at,
                redriven_at=record.redriven_at if redriven_at is None else redriven_at,
                expires_at=0,
                adopted_at=now,
                adoptions=record.adoptions + 1,
                adoption_seen=() if by is None else ((by, now, now),),
                output=None,
                output_ref=None,
                output_size=None,
            )
            return True
