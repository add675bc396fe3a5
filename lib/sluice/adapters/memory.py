"""In-memory implementations of the ports: the store for unit tests and large benchmarks, a queue
and a state machine for the benchmark harness. The store passes the same contract suite as
``DynamoStore`` (tests/contract)."""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from sluice.errors import LeaseHeld, SlotsFull
from sluice.model import (
    ExecutionInfo,
    ExecutionRecord,
    Ledger,
    Message,
    PayloadRecord,
    PayloadState,
    StartedExecution,
    StartResult,
)
from sluice.names import execution_arn


class MemoryStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders: set[str] = set()
        self._external = 0
        self._drift = 0
        self._reconciled_at: float | None = None
        self._payloads: dict[str, PayloadRecord] = {}
        self._executions: dict[str, ExecutionRecord] = {}
        self._extra: dict[str, dict[str, object]] = {}

    def ledger(self) -> Ledger:
        with self._lock:
            return Ledger(frozenset(self._holders), self._external, self._reconciled_at, self._drift)

    def payload(self, key: str) -> PayloadRecord | None:
        with self._lock:
            return self._payloads.get(key)

    def execution(self, name: str) -> ExecutionRecord | None:
        with self._lock:
            return self._executions.get(name)

    def executions(self, names: Iterable[str]) -> dict[str, ExecutionRecord]:
        with self._lock:
            return {n: self._executions[n] for n in names if n in self._executions}

    def claim(
        self,
        *,
        key: str,
        name: str,
        message_id: str,
        limit: int,
        now: float,
        claim_expires_at: float,
        expires_at: int,
    ) -> None:
        if limit <= 0:
            raise SlotsFull(limit)
        with self._lock:
            current = self._payloads.get(key)
            if current is not None and current.holder is not None:
                raise LeaseHeld(current)
            if len(self._holders) >= limit or name in self._holders:
                raise SlotsFull(limit)
            self._holders.add(name)
            base = current or PayloadRecord(key=key, state=PayloadState.CLAIMED)
            self._payloads[key] = replace(
                base,
                state=PayloadState.CLAIMED,
                holder=name,
                executions=(*base.executions, name),
                attempts=base.attempts + 1,
                updated_at=now,
                expires_at=expires_at,
                reason=None,
            )
            self._executions[name] = ExecutionRecord(
                name=name,
                key=key,
                message_id=message_id,
                state=PayloadState.CLAIMED,
                claimed_at=now,
                claim_expires_at=claim_expires_at,
                expires_at=expires_at,
            )

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
            self._payloads[key] = replace(payload, state=PayloadState.RUNNING, updated_at=now)
            self._executions[name] = replace(
                record, state=PayloadState.RUNNING, arn=arn, started_at=started_at
            )
            return True

    def mark_running_many(self, started: Sequence[StartedExecution], *, now: float) -> int:
        return sum(
            self.mark_running(key=s.key, name=s.name, arn=s.arn, started_at=s.started_at, now=now)
            for s in started
        )

    def release(
        self,
        *,
        name: str,
        state: PayloadState,
        now: float,
        error: str | None = None,
        cause: str | None = None,
        ended_at: float | None = None,
    ) -> ExecutionRecord | None:
        with self._lock:
            record = self._executions.get(name)
            if record is None or not record.state.holds_lease or name not in self._holders:
                return None
            payload = self._payloads.get(record.key)
            if payload is None or payload.holder != name:
                return None
            self._holders.discard(name)
            self._payloads[record.key] = replace(
                payload, state=state, holder=None, updated_at=now, reason=error or payload.reason
            )
            self._executions[name] = replace(
                record,
                state=state,
                ended_at=ended_at if ended_at is not None else now,
                error=error or record.error,
                cause=cause[:4_000] if cause else record.cause,
            )
            return record

    def record_duplicate(self, *, key: str, message_id: str, now: float) -> None:
        with self._lock:
            payload = self._payloads.get(key) or PayloadRecord(key=key, state=PayloadState.RELEASED)
            self._payloads[key] = replace(payload, duplicates=payload.duplicates + 1, updated_at=now)

    def record_invalid(self, *, key: str, reason: str, now: float, expires_at: int) -> None:
        with self._lock:
            payload = self._payloads.get(key)
            if payload is not None and payload.holder is not None:
                return
            base = payload or PayloadRecord(key=key, state=PayloadState.INVALID)
            self._payloads[key] = replace(
                base, state=PayloadState.INVALID, reason=reason, updated_at=now, expires_at=expires_at
            )

    def save_reconciliation(self, *, external: int, drift: int, now: float) -> None:
        with self._lock:
            self._external, self._drift, self._reconciled_at = external, drift, now


# -- a queue and a state machine for the benchmark harness -------------------------------------


@dataclass
class _Queued:
    message: Message
    visible_at: float = 0.0
    receives: int = 0


@dataclass
class MemoryQueue:
    """A FIFO queue with visibility timeouts and a DLQ, on an injected clock. One group per message
    is assumed (Sluice's default: group = payload key), so group blocking is not modelled."""

    clock: object
    visibility_timeout: float = 180.0
    max_receive_count: int = 10
    messages: deque[_Queued] = field(default_factory=deque)
    in_flight: dict[str, _Queued] = field(default_factory=dict)
    dead: list[tuple[Message, str]] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def _count(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1

    def send(self, body: str, group_id: str = "", attributes: dict[str, str] | None = None) -> str:
        message_id = f"m-{next(self._ids):08d}"
        self.messages.append(_Queued(Message(message_id, "", body, group_id, 0, dict(attributes or {}))))
        return message_id

    def receive(self, max_messages: int, wait_seconds: int) -> list[Message]:
        self._count("ReceiveMessage")
        now = self.clock.now()  # type: ignore[attr-defined]
        for handle, queued in list(self.in_flight.items()):
            if queued.visible_at <= now:
                del self.in_flight[handle]
                self.messages.appendleft(queued)
        return self._take(max_messages, now)

    def _take(self, max_messages: int, now: float) -> list[Message]:
        """Hand out visible messages in order; a message past ``max_receive_count`` goes to the DLQ."""
        out: list[Message] = []
        while self.messages and len(out) < max_messages:
            queued = self.messages.popleft()
            queued.receives += 1
            if queued.receives > self.max_receive_count:
                self.dead.append((queued.message, "maxReceiveCount exceeded"))
                continue
            handle = f"{queued.message.message_id}/{queued.receives}"
            queued.visible_at = now + self.visibility_timeout
            self.in_flight[handle] = queued
            self._in_flight(handle, queued)
            out.append(replace(queued.message, receipt_handle=handle, receive_count=queued.receives))
        return out

    def _in_flight(self, handle: str, queued: _Queued) -> None:
        """Called for each message handed out (subclasses index in-flight messages)."""

    def delete(self, messages: Sequence[Message]) -> None:
        for i in range(0, len(messages), 10):
            self._count("DeleteMessageBatch")
            for m in messages[i : i + 10]:
                self.in_flight.pop(m.receipt_handle, None)

    def release(self, messages: Sequence[Message], delay_seconds: int = 0) -> None:
        now = self.clock.now()  # type: ignore[attr-defined]
        for i in range(0, len(messages), 10):
            self._count("ChangeMessageVisibilityBatch")
            for m in messages[i : i + 10]:
                queued = self.in_flight.get(m.receipt_handle)
                if queued is not None:
                    queued.visible_at = now + delay_seconds

    def send_to_dlq(self, message: Message, reason: str) -> None:
        self._count("SendMessage")
        self.dead.append((message, reason))

    def __len__(self) -> int:
        return len(self.messages) + len(self.in_flight)


@dataclass
class MemoryExecutions:
    """A Standard state machine whose executions end when the harness says so."""

    state_machine_arn: str = "arn:aws:states:us-east-1:123456789012:stateMachine:sluice-bench"
    running: dict[str, float] = field(default_factory=dict)
    ended: dict[str, ExecutionInfo] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    clock: object | None = None

    def _count(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1

    def _now(self) -> float:
        return self.clock.now() if self.clock is not None else 0.0  # type: ignore[attr-defined]

    def arn_for(self, name: str) -> str:
        return execution_arn(self.state_machine_arn, name)

    def start(self, name: str, input_json: str) -> StartResult:
        self._count("StartExecution")
        if name in self.running:
            if self.inputs[name] == input_json:
                return StartResult(self.arn_for(name))
            return StartResult(self.arn_for(name), already_existed=True)
        if name in self.ended:
            return StartResult(self.arn_for(name), already_existed=True)
        self.running[name] = self._now()
        self.inputs[name] = input_json
        return StartResult(self.arn_for(name))

    def finish(self, name: str, status: str = "SUCCEEDED") -> ExecutionInfo:
        started = self.running.pop(name)
        info = ExecutionInfo(name, self.arn_for(name), status, started, self._now())
        self.ended[name] = info
        return info

    def describe(self, name: str) -> ExecutionInfo | None:
        self._count("DescribeExecution")
        if name in self.running:
            return ExecutionInfo(name, self.arn_for(name), "RUNNING", self.running[name])
        return self.ended.get(name)

    def list_running(self) -> set[str]:
        self._count("ListExecutions")
        self.calls["ListExecutions"] += max(0, (len(self.running) - 1) // 1000)
        return set(self.running)

    def check(self) -> None:
        self._count("DescribeStateMachine")
