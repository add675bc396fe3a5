"""A queue and a state machine in memory, on an injected clock, for unit tests and the benchmark
harness. Not part of the Lambda package."""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sluice.core.model import ExecutionInfo, Message, ParkedMessage, StartResult
from sluice.core.names import ORIGIN_ATTRIBUTE, execution_arn


@dataclass
class _Queued:
    message: Message
    visible_at: float = 0.0
    receives: int = 0


@dataclass
class MemoryQueue:
    """A FIFO queue with visibility timeouts, message groups and a DLQ, on an injected clock. As in
    SQS FIFO (and moto), a receive skips every group with a message in flight from an earlier
    receive, and hands out the rest in the order sent, several of one group together; a message
    that comes back goes ahead of its group's later ones. A message without a group (``""``) blocks
    nothing."""

    clock: object
    visibility_timeout: float = 180.0
    max_receive_count: int = 10
    messages: deque[_Queued] = field(default_factory=deque)
    in_flight: dict[str, _Queued] = field(default_factory=dict)
    dead: list[tuple[Message, str]] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    held: Counter[str] = field(default_factory=Counter)  # group -> its messages in flight
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
        back = [handle for handle, queued in self.in_flight.items() if queued.visible_at <= now]
        self.messages.extendleft(reversed([self._out_of_flight(handle) for handle in back]))
        return self._take(max_messages, now)

    def _out_of_flight(self, handle: str) -> _Queued:
        queued = self.in_flight.pop(handle)
        if queued.message.group_id:
            self.held[queued.message.group_id] -= 1
        return queued

    def _take(self, max_messages: int, now: float) -> list[Message]:
        """Hand out visible messages in order, but none of a group an earlier receive holds; a message
        past ``max_receive_count`` goes to the DLQ."""
        out: list[Message] = []
        blocked: list[_Queued] = []
        taken: set[str] = set()  # groups this receive hands out: their later messages come along
        while self.messages and len(out) < max_messages:
            queued = self.messages.popleft()
            group = queued.message.group_id
            if group and self.held[group] > 0 and group not in taken:
                blocked.append(queued)
                continue
            queued.receives += 1
            if queued.receives > self.max_receive_count:
                self.dead.append((queued.message, "maxReceiveCount exceeded"))
                continue
            handle = f"{queued.message.message_id}/{queued.receives}"
            queued.visible_at = now + self.visibility_timeout
            self.in_flight[handle] = queued
            if group:
                self.held[group] += 1
                taken.add(group)
            self._in_flight(handle, queued)
            out.append(replace(queued.message, receipt_handle=handle, receive_count=queued.receives))
        self.messages.extendleft(reversed(blocked))
        return out

    def _in_flight(self, handle: str, queued: _Queued) -> None:
        """Called for each message handed out (subclasses index in-flight messages)."""

    def delete(self, messages: Sequence[Message]) -> None:
        for i in range(0, len(messages), 10):
            self._count("DeleteMessageBatch")
            for m in messages[i : i + 10]:
                if m.receipt_handle in self.in_flight:
                    self._out_of_flight(m.receipt_handle)

    def release(self, messages: Sequence[Message], delay_seconds: int = 0) -> None:
        now = self.clock.now()  # type: ignore[attr-defined]
        for i in range(0, len(messages), 10):
            self._count("ChangeMessageVisibilityBatch")
            for m in messages[i : i + 10]:
                queued = self.in_flight.get(m.receipt_handle)
                if queued is not None:
                    queued.visible_at = now + delay_seconds

    def send_to_dlq(self, message: Message, reason: str, *, dedup: str | None = None) -> None:
        self._count("SendMessage")
        self.dead.append((message, reason))

    def requeue(self, parked: ParkedMessage) -> None:
        self._count("SendMessage")
        self.send(parked.body, parked.group_id, {**parked.attributes, ORIGIN_ATTRIBUTE: parked.message_id})

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

    def describe(self, name: str, arn: str | None = None) -> ExecutionInfo | None:
        self._count("DescribeExecution")
        if name in self.running:
            return ExecutionInfo(name, self.arn_for(name), "RUNNING", self.running[name])
        return self.ended.get(name)

    def list_running(self) -> set[str]:
        self._count("ListExecutions")
        self.calls["ListExecutions"] += max(0, (len(self.running) - 1) // 1000)
        return set(self.running)

    def redriven_succeeded(self) -> dict[str, float | None]:
        self._count("ListExecutions")
        return {}  # nothing here is redriven

    def vanished(self, arn: str | None) -> bool:
        return False  # one state machine, never deleted

    def check(self) -> None:
        self._count("DescribeStateMachine")
