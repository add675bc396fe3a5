"""``MemoryStore``'s records (``Records``) and waiting room (``WaitingRoom``), for tests and the
benchmark."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from sluice.adapters.memory.table import MemoryTable
from sluice.core.model import EffectsLog, ExecutionRecord, ParkedMessage, PayloadRecord, PayloadState
from sluice.features.receipts import left_released


class MemoryRecords:
    def __init__(self, table: MemoryTable) -> None:
        self.table = table
        self.sighted: dict[str, str] = {}  # message id -> the receive that saw it first

    def payload(self, key: str) -> PayloadRecord | None:
        with self.table.lock:
            return self.table.payloads.get(key)

    def execution(self, name: str) -> ExecutionRecord | None:
        with self.table.lock:
            return self.table.executions.get(name)

    def effects(self, name: str) -> EffectsLog | None:
        with self.table.lock:
            return self.table.effects.get(name)

    def executions(self, names: Iterable[str]) -> dict[str, ExecutionRecord]:
        with self.table.lock:
            return {n: self.table.executions[n] for n in names if n in self.table.executions}

    def payloads(self, keys: Iterable[str]) -> dict[str, PayloadRecord]:
        with self.table.lock:
            return {k: self.table.payloads[k] for k in set(keys) if k in self.table.payloads}

    def record_duplicate(self, *, key: str, message_id: str, now: float) -> None:
        with self.table.lock:
            payload = self.table.payloads.get(key) or PayloadRecord(key=key, state=PayloadState.RELEASED)
            self.table.payloads[key] = replace(payload, duplicates=payload.duplicates + 1, updated_at=now)

    def first_sighting(self, *, key: str, message_id: str, receipt: str, now: float) -> bool:
        with self.table.lock:
            return self.sighted.setdefault(message_id, receipt) == receipt  # the same receive: a retry

    def record_already_done(
        self, *, key: str, message_id: str, now: float, seen: PayloadRecord | None = None
    ) -> None:
        with self.table.lock:
            payload = self.table.payloads.get(key) or PayloadRecord(key=key, state=PayloadState.RELEASED)
            state = payload.state
            if seen is not None and left_released(seen) and left_released(payload):
                state = payload.receipt_state or state
            self.table.payloads[key] = replace(
                payload, state=state, already_done=payload.already_done + 1, updated_at=now
            )

    def record_invalid(self, *, key: str, reason: str, now: float) -> None:
        with self.table.lock:
            payload = self.table.payloads.get(key)
            if payload is not None and payload.holder is not None:
                return
            base = payload or PayloadRecord(key=key, state=PayloadState.INVALID)
            self.table.payloads[key] = replace(
                base,
                state=PayloadState.INVALID,
                reason=reason,
                updated_at=now,
                # A once-key's success keeps its record without expiry (sluice.features.receipts).
                expires_at=0 if base.once_by is not None else int(now) + self.table.retention_seconds,
            )


class MemoryParking:
    def __init__(self, table: MemoryTable) -> None:
        self.table = table
        self.parked: dict[str, tuple[ParkedMessage, bool]] = {}  # entry -> (message, woken)
        self.holders: set[str] = set()

    def park(self, parked: ParkedMessage) -> bool:
        with self.table.lock:
            existing = self.parked.get(parked.entry)
            held = (parked.holder, parked.copy_id, False)
            if existing is not None and (existing[0].holder, existing[0].copy_id, existing[1]) == held:
                return True  # parked already: a redelivery
            holder = self.table.executions.get(parked.holder)
            if holder is None or not holder.state.holds_lease:
                return False
            self.table.executions[parked.holder] = replace(holder, parked=holder.parked | {parked.entry})
            self.parked[parked.entry] = (parked, False)
            self.holders.add(parked.holder)
            return True

    def parked_messages(self, holder: str, entries: Iterable[str]) -> list[ParkedMessage]:
        with self.table.lock:
            waiting = [
                p
                for p, woken in (self.parked[e] for e in set(entries) if e in self.parked)
                if p.holder == holder and not woken
            ]
        return sorted(waiting, key=lambda p: (p.parked_at, p.message_id))

    def unpark(
        self, holder: str, entries: Iterable[str], *, woken: Sequence[ParkedMessage] = (), now: float
    ) -> None:
        copies = {p.entry: p.copy_id for p in woken}
        with self.table.lock:
            done: set[str] = set()
            for e in frozenset(entries):
                item = self.parked.get(e)
                waiting = item is not None and item[0].holder == holder and not item[1]
                if waiting and e in copies and item[0].copy_id == copies[e]:
                    self.parked[e] = (item[0], True)
                    waiting = False
                if not waiting:
                    done.add(e)
            record = self.table.executions.get(holder)
            if record is not None:
                record = replace(record, parked=record.parked - done)
                self.table.executions[holder] = record
            if record is None or not record.parked:
                self.holders.discard(holder)

    def parked_holders(self) -> frozenset[str]:
        with self.table.lock:
            return frozenset(self.holders)
