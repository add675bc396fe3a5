"""The store in memory, for unit tests and large benchmarks. It passes the same contract suite as
``DynamoStore`` (tests/contract). Not part of the Lambda package."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from sluice.adapters.memory_awaits import MemoryAwaits
from sluice.adapters.memory_handover import MemoryHandOver
from sluice.adapters.memory_keys import MemoryKeys
from sluice.errors import AlreadyDone, AlreadyRan, KeyFull, LeaseHeld, OnceUnknown, SlotsFull
from sluice.keys import DEFAULT_KEY_CONCURRENCY
from sluice.model import (
    ClaimFence,
    EffectsLog,
    ExecutionRecord,
    ExternalCount,
    Ledger,
    LimitSource,
    ParkedMessage,
    PayloadRecord,
    PayloadState,
    Rooms,
    record_expiry,
)
from sluice.records import KeyState, LaneRoom, LaneSetting, ReceiptOutput

HISTORY_LIMIT = 20
HISTORY_KEEP = 10
DEFAULT_RETENTION = 30 * 86_400


class MemoryStore(MemoryHandOver, MemoryAwaits, MemoryKeys):
    def __init__(
        self, *, retention_seconds: int = DEFAULT_RETENTION, key_concurrency: int = DEFAULT_KEY_CONCURRENCY
    ) -> None:
        self.retention_seconds = retention_seconds
        self.key_concurrency = key_concurrency
        self._lock = threading.RLock()  # a hand-over holds it across its release and its claim
        self._holders: set[str] = set()
        self._limit: int | None = None
        self._source: LimitSource | None = None
        self._external = 0
        self._count = 0  # the number of the external count saved
        self._listed_after: int | None = 0  # the number taken before its listing (0: unknown)
        self._counts = 0  # the numbering counter
        self._drift = 0
        self._reconciled_at: float | None = None
        self._payloads: dict[str, PayloadRecord] = {}
        self._executions: dict[str, ExecutionRecord] = {}
        self._effects: dict[str, EffectsLog] = {}
        self._parked: dict[str, tuple[ParkedMessage, bool]] = {}  # message id -> (message, woken)
        self._parked_holders: set[str] = set()
        # lanes (sluice.lanes): each lane's holders, its limit in force with its stamp, its setting
        self._lane_holders: dict[str, set[str]] = {}
        self._lane_limits: dict[str, tuple[int, float]] = {}
        self._lane_settings: dict[str, LaneSetting] = {}

    def ledger(self) -> Ledger:
        with self._lock:
            return Ledger(
                frozenset(self._holders),
                self._external,
                self._reconciled_at,
                self._drift,
                self._limit,
                count=self._count,
                listed_after=self._listed_after,
                numbered=self._counts,
            )

    def look(self, shards: Sequence[int] | None = None) -> Ledger:
        return self.ledger()  # one lock holds every slot: reading all of them costs nothing

    def set_limit(self, source: LimitSource) -> int | None:
        with self._lock:
            # The pool's stamp keeps no listing start (as in DynamoDB): a later merge takes it as unknown.
            self._source = replace(source.merged(self._source), listed_after=0)
            self._limit = self._source.limit
            return self._limit

    def payload(self, key: str) -> PayloadRecord | None:
        with self._lock:
            return self._payloads.get(key)

    def execution(self, name: str) -> ExecutionRecord | None:
        with self._lock:
            return self._executions.get(name)

    def effects(self, name: str) -> EffectsLog | None:
        with self._lock:
            return self._effects.get(name)

    def executions(self, names: Iterable[str]) -> dict[str, ExecutionRecord]:
        with self._lock:
            return {n: self._executions[n] for n in names if n in self._executions}

    def claim(
        self,
        *,
        key: str,
        name: str,
        message_id: str,
        now: float,
        claim_expires_at: float,
        arn: str | None = None,
        once: bool = False,
        ckey: str | None = None,
        ticket: str | None = None,
        lane: str | None = None,
        fair_newcomer: bool = False,
        uncapped: bool = False,
    ) -> None:
        with self._lock:
            limit = self._limit or 0
            current = self._payloads.get(key)
            if once and current is not None and (current.succeeded_by or current.once_unknown) is not None:
                raise AlreadyDone(current) if current.succeeded_by is not None else OnceUnknown(current)
            if current is not None and (
                current.holder is not None or current.redriven is not None or current.redriven_more
            ):
                raise LeaseHeld(current)
            earlier = self._executions.get(name)
            if earlier is not None and earlier.state.ended:
                raise AlreadyRan(earlier)
            if ckey is not None:
                self._key_admits(ckey, ticket=ticket, uncapped=uncapped)
            if fair_newcomer:
                self._key_rooms()
                if self._keys_waiting:
                    raise KeyFull(KeyState(ckey or ""))
            if lane is not None:
                lane_limit = self._lane_limits.get(lane, (0, 0.0))[0]
                if len(self._lane_holders.get(lane, ())) >= lane_limit:
                    raise SlotsFull(lane_limit)
            if len(self._holders) >= limit or name in self._holders:
                raise SlotsFull(limit)
            self._holders.add(name)
            if lane is not None:
                self._lane_holders.setdefault(lane, set()).add(name)
            if ckey is not None:
                self._key_hold(ckey, name, ticket)
            base = current or PayloadRecord(key=key, state=PayloadState.CLAIMED)
            history = (
                base.executions if len(base.executions) < HISTORY_LIMIT else base.executions[-HISTORY_KEEP:]
            )
            self._payloads[key] = replace(
                base,
                state=PayloadState.CLAIMED,
                holder=name,
                executions=(*history, name),
                attempts=base.attempts + 1,
                updated_at=now,
                expires_at=0,
                reason=None,
            )
            self._executions[name] = ExecutionRecord(
                name=name,
                key=key,
                message_id=message_id,
                state=PayloadState.CLAIMED,
                claimed_at=now,
                claim_expires_at=claim_expires_at,
                arn=arn,
                once=once,
                ckey=ckey,
                lane=lane,
                lane_shard=None if lane is None else 0,
                # An earlier claim of this name whose waiters were never woken: they wait for this one.
                parked=earlier.parked if earlier is not None else frozenset(),
            )

    # -- lanes (sluice.lanes) ------------------------------------------------------------------------

    def lane_rooms(self, lanes: Sequence[str], *, whole: bool = False) -> dict[str, LaneRoom]:
        with self._lock:
            out = {}
            for lane in lanes:
                limit, _ = self._lane_limits.get(lane, (0, 0.0))
                running = len(self._lane_holders.get(lane, ()))
                out[lane] = LaneRoom(
                    limit, running, max(0, limit - running), exists=lane in self._lane_limits
                )
            return out

    def lane_settings(self, lanes: Sequence[str]) -> dict[str, LaneSetting]:
        with self._lock:
            return {lane: self._lane_settings[lane] for lane in lanes if lane in self._lane_settings}

    def set_lane_limit(self, lane: str, limit: int, stamp: float) -> int | None:
        with self._lock:
            current = self._lane_limits.get(lane)
            if current is not None and current[1] > stamp:
                return None  # a newer limit is in force
            self._lane_limits[lane] = (limit, stamp)
            return limit

    def write_lane_setting(self, setting: LaneSetting) -> None:
        with self._lock:
            self._lane_settings[setting.name] = setting

    def thaw_lane(self, lane: str) -> None:
        pass  # one count against one limit: never frozen

    def renew(self, *, name: str, now: float, claim_expires_at: float, arn: str | None = None) -> bool:
        with self._lock:
            record = self._executions.get(name)
            if record is None or record.state is not PayloadState.CLAIMED or record.blocked_by:
                return False
            self._executions[name] = replace(
                record,
                arn=arn or record.arn,
                claim_expires_at=claim_expires_at,
                claim_version=record.claim_version + 1,
                suspect_since=None,
                suspect_by=None,
                starting_at=None,
            )
            return True

    def block(self, *, name: str, by: str, now: float) -> bool:
        with self._lock:
            record = self._executions.get(name)
            if record is None or record.state is not PayloadState.CLAIMED or record.starting_at is not None:
                return False
            self._executions[name] = replace(record, blocked_by=by)
            return True

    def mark_starting(self, *, name: str, now: float) -> bool:
        with self._lock:
            record = self._executions.get(name)
            if record is None or record.state is not PayloadState.CLAIMED or record.blocked_by:
                return False
            self._executions[name] = replace(record, starting_at=now)
            return True

    def suspect(
        self, *, name: str, claim_version: int, reconciler: str, now: float, replacing: float | None = None
    ) -> bool:
        with self._lock:
            record = self._executions.get(name)
            if (
                record is None
                or record.state is not PayloadState.CLAIMED
                or record.claim_version != claim_version
                or record.suspect_since != replacing
            ):
                return False
            self._executions[name] = replace(record, suspect_since=now, suspect_by=reconciler)
            return True

    def mark_running(self, *, key: str, name: str, arn: str, started_at: float, now: float) -> bool:
        with self._lock:
            payload, record = self._payloads.get(key), self._executions.get(name)
            if (
                payload is None
                or payload.holder != name
                or record is None
                or record.state is not PayloadState.CLAIMED
            ):
                return False
            self._payloads[key] = replace(payload, state=PayloadState.RUNNING, updated_at=now, expires_at=0)
            self._executions[name] = replace(
                record,
                state=PayloadState.RUNNING,
                arn=arn,
                started_at=started_at,
                expires_at=0,
                suspect_since=None,
                suspect_by=None,
            )
            return True

    def release(
        self,
        *,
        name: str,
        state: PayloadState,
        now: float,
        error: str | None = None,
        cause: str | None = None,
        ended_at: float | None = None,
        started_at: float | None = None,
        fence: ClaimFence | None = None,
        confirm: Callable[[ExecutionRecord], bool] | None = None,
        output: Callable[[ExecutionRecord], ReceiptOutput | None] | None = None,
        outcome_unknown: bool = False,
    ) -> ExecutionRecord | None:
        seen = self.execution(name)
        if confirm is not None and seen is not None and seen.adopted_at is not None and not confirm(seen):
            return None
        kept = None
        if output is not None and state.ended and seen is not None and seen.state.holds_lease:
            kept = output(seen)  # outside the lock, as DynamoStore does it before its transaction
        with self._lock:
            record = self._executions.get(name)
            if record is None or not record.state.holds_lease or name not in self._holders:
                return None
            if fence is not None and not fence.holds(record):
                return None
            payload = self._payloads.get(record.key)
            if payload is None or payload.holder != name:
                return None
            once_by, unknown = payload.once_by, payload.once_unknown
            if record.once and (state is PayloadState.SUCCEEDED or outcome_unknown):
                once_by, unknown = once_by or name, name if outcome_unknown else unknown
            # A once-key's success is kept: it must never run again, whatever ran after it.
            expires = 0 if once_by is not None else int(now) + self.retention_seconds
            self._holders.discard(name)
            if record.ckey is not None:
                self._key_free(record.ckey, name)
            if record.lane is not None:
                self._lane_holders.get(record.lane, set()).discard(name)
            self._payloads[record.key] = replace(
                payload,
                state=state,
                holder=None,
                updated_at=now,
                reason=error or payload.reason,
                expires_at=expires,
                receipt=name if state.ended else payload.receipt,
                receipt_state=state if state.ended else payload.receipt_state,
                succeeded_by=payload.succeeded_by or (name if state is PayloadState.SUCCEEDED else None),
                once_by=once_by,
                once_unknown=unknown,
            )
            ended = ended_at if ended_at is not None else now
            outputs = {}
            if kept is not None:
                outputs = {"output": kept.inline, "output_ref": kept.pointer, "output_size": kept.size}
            self._executions[name] = replace(
                record,
                state=state,
                started_at=record.started_at if record.started_at is not None else started_at,
                ended_at=ended,
                error=error or record.error,
                cause=cause[:4_000] if cause else record.cause,
                expires_at=record_expiry(state, now=now, retention_seconds=self.retention_seconds),
                **outputs,
            )
            if kept is not None and kept.effects is not None:
                self._effects[name] = kept.effects  # in the release's own write (sluice.effects)
            # Flagged as awaited once a waiter parked on the key (MemoryAwaits keeps every such key).
            return replace(record, awaited=record.key in self._await_rooms()[1])

    def adopt(self, *, name: str, now: float) -> bool:
        with self._lock:
            record = self._executions.get(name)
            if record is None or record.state.holds_lease or name in self._holders:
                return False
            payload = self._payloads.get(record.key) or PayloadRecord(
                key=record.key, state=PayloadState.RUNNING
            )
            if payload.holder is not None:
                return False
            self._holders.add(name)
            if record.ckey is not None:
                self._key_hold(record.ckey, name)  # it runs already: counted whatever the key's cap
            if record.lane is not None and record.lane in self._lane_limits:
                self._lane_holders.setdefault(record.lane, set()).add(name)  # whatever the lane's cap
            self._payloads[record.key] = replace(
                payload,
                state=PayloadState.RUNNING,
                holder=name,
                updated_at=now,
                expires_at=0,
                redriven=None,
                redriven_more=payload.redriven_more - {name},
            )
            self._executions[name] = replace(
                record,
                state=PayloadState.RUNNING,
                ended_at=None,
                earlier_end_at=record.ended_at,
                expires_at=0,
                adopted_at=now,
                output=None,
                output_ref=None,
                output_size=None,
            )
            return True

    def mark_redriven(self, *, key: str, name: str, now: float) -> bool:
        with self._lock:
            payload = self._payloads.get(key)
            if payload is None or payload.holder is None or payload.holder == name:
                return False
            if payload.redriven is None or payload.redriven == name:
                self._payloads[key] = replace(payload, redriven=name, updated_at=now)
            else:
                more = payload.redriven_more | {name}
                self._payloads[key] = replace(payload, redriven_more=more, updated_at=now)
            return True

    def clear_redriven(self, *, key: str, name: str) -> bool:
        with self._lock:
            payload = self._payloads.get(key)
            if payload is None or (payload.redriven != name and name not in payload.redriven_more):
                return False
            redriven = None if payload.redriven == name else payload.redriven
            self._payloads[key] = replace(
                payload, redriven=redriven, redriven_more=payload.redriven_more - {name}
            )
            return True

    def record_duplicate(self, *, key: str, message_id: str, now: float) -> None:
        with self._lock:
            payload = self._payloads.get(key) or PayloadRecord(key=key, state=PayloadState.RELEASED)
            self._payloads[key] = replace(payload, duplicates=payload.duplicates + 1, updated_at=now)

    def first_sighting(self, *, key: str, message_id: str, receipt: str, now: float) -> bool:
        with self._lock:
            sighted: dict[str, str] = self.__dict__.setdefault("_sighted", {})
            return sighted.setdefault(message_id, receipt) == receipt  # the same receive: a retry

    def record_already_done(self, *, key: str, message_id: str, now: float) -> None:
        with self._lock:
            payload = self._payloads.get(key) or PayloadRecord(key=key, state=PayloadState.RELEASED)
            self._payloads[key] = replace(payload, already_done=payload.already_done + 1, updated_at=now)

    def record_invalid(self, *, key: str, reason: str, now: float) -> None:
        with self._lock:
            payload = self._payloads.get(key)
            if payload is not None and payload.holder is not None:
                return
            base = payload or PayloadRecord(key=key, state=PayloadState.INVALID)
            self._payloads[key] = replace(
                base,
                state=PayloadState.INVALID,
                reason=reason,
                updated_at=now,
                # A once-key's success keeps its record without expiry (sluice.receipts).
                expires_at=0 if base.once_by is not None else int(now) + self.retention_seconds,
            )

    def next_count(self) -> int:
        with self._lock:
            self._counts += 1
            return self._counts

    def save_reconciliation(
        self, *, external: int, drift: int, now: float, count: int = 0, listed_after: int | None = None
    ) -> bool:
        with self._lock:
            saved = ExternalCount(self._external, self._count, self._listed_after)
            merged = ExternalCount(external, count, listed_after).merged(saved)
            self._external, self._count, self._listed_after = merged.external, merged.count, merged.began
            if count < saved.count:
                return False
            self._drift, self._reconciled_at = drift, now
            return True

    # -- the waiting room ---------------------------------------------------------------------

    def park(self, parked: ParkedMessage) -> bool:
        with self._lock:
            existing = self._parked.get(parked.message_id)
            if existing is not None and existing[0].holder == parked.holder and not existing[1]:
                return True  # parked already, by an earlier delivery
            holder = self._executions.get(parked.holder)
            if holder is None or not holder.state.holds_lease:
                return False
            self._executions[parked.holder] = replace(holder, parked=holder.parked | {parked.message_id})
            self._parked[parked.message_id] = (parked, False)
            self._parked_holders.add(parked.holder)
            return True

    def parked_messages(self, holder: str, message_ids: Iterable[str]) -> list[ParkedMessage]:
        with self._lock:
            waiting = [
                p
                for p, woken in (self._parked[m] for m in set(message_ids) if m in self._parked)
                if p.holder == holder and not woken
            ]
        return sorted(waiting, key=lambda p: (p.parked_at, p.message_id))

    def unpark(self, holder: str, message_ids: Iterable[str], *, now: float) -> None:
        woken = frozenset(message_ids)
        with self._lock:
            for m in woken:
                entry = self._parked.get(m)
                if entry is not None and entry[0].holder == holder:
                    self._parked[m] = (entry[0], True)
            record = self._executions.get(holder)
            if record is not None:
                record = replace(record, parked=record.parked - woken)
                self._executions[holder] = record
            if record is None or not record.parked:
                self._parked_holders.discard(holder)

    def parked_holders(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._parked_holders)

    def rooms(self) -> Rooms:
        return Rooms(self.parked_holders(), self.waiting(), self.keys_waiting())
