"""The semaphore's records (``sluice.semaphore.step``) in memory, and Step Functions' task tokens in memory,
for unit tests and benchmarks. Not part of the Lambda package.

``MemorySemaphoreStore`` makes each step atomic under one lock, as the table's conditional writes and
transactions are; its permits are a ``MemorySlots``. It passes the contract suite that
``DynamoSemaphoreStore`` passes (tests/contract/test_semaphore_contract.py). ``keys`` names what it
holds as the table's item keys, so tests can compare what is left on both.

``MemoryTokens`` plays Step Functions: executions, the task tokens they wait on, and every answer
sent, in order. A token takes one answer: afterwards, or once its execution has ended or the token
timed out, SendTaskSuccess is refused (``Delivery.GONE``, as TaskTimedOut / InvalidToken would be).
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sluice.adapters.memory.slots import MemorySlots
from sluice.primitives.slots import DEFAULT_PER_SHARD
from sluice.semaphore.model import (
    Acquisition,
    Delivery,
    Freed,
    Opened,
    State,
    Ticket,
    acquisition_of,
    execution_hash,
    pool_of,
)


class MemorySemaphoreStore:
    def __init__(self, *, per_shard: int = DEFAULT_PER_SHARD, rng: random.Random | None = None) -> None:
        self.slots = MemorySlots(per_shard=per_shard, rng=rng)
        self._lock = threading.Lock()
        self._records: dict[tuple[str, str], Acquisition] = {}
        self._lines: dict[str, tuple[int, int]] = {}
        self._tickets: dict[tuple[str, int], Ticket] = {}
        self._held: dict[str, tuple[str, set[str]]] = {}  # execution hash -> (arn, entries)

    def keys(self) -> set[str]:
        """What is stored, named as the table's item keys (``sluice.adapters.dynamo.semaphore``)."""
        with self._lock:
            return (
                {f"SEMA#{n}#{h}" for n, h in self._records}
                | {f"SEMQ#{n}" for n in self._lines}
                | {f"SEMW#{n}#{t}" for n, t in self._tickets}
                | {f"SEMHELD#{h}" for h in self._held}
            )

    # -- records ------------------------------------------------------------------------------------

    def acquisition(self, name: str, holder: str) -> Acquisition | None:
        with self._lock:
            return self._records.get((name, holder))

    def acquisitions(self, name: str, holders: Sequence[str]) -> dict[str, Acquisition]:
        with self._lock:
            return {h: self._records[(name, h)] for h in holders if (name, h) in self._records}

    def open(self, acquisition: Acquisition, previous_gen: int | None, now: float) -> Opened:
        a = acquisition
        pool_of(a.semaphore)
        with self._lock:
            current = self._records.get((a.semaphore, a.holder))
            if previous_gen is None:
                fits = current is None
            else:
                fits = current is not None and (current.state, current.gen) == (State.RELEASED, previous_gen)
            if not fits:
                return Opened.RECORD_CHANGED
            if (a.semaphore, a.ticket) in self._tickets:
                return Opened.TICKET_TAKEN
            self._tickets[(a.semaphore, a.ticket)] = Ticket(
                a.semaphore, a.ticket, a.holder, a.gen, a.execution_arn, a.acquisition_id, now
            )
            self._records[(a.semaphore, a.holder)] = a
            key = execution_hash(a.execution_arn)
            self._held.setdefault(key, (a.execution_arn, set()))[1].add(f"{a.semaphore}|{a.acquisition_id}")
            return Opened.OPENED

    def _change(
        self, name: str, holder: str, when: Callable[[Acquisition], bool], **changes: Any
    ) -> Acquisition | None:
        with self._lock:
            current = self._records.get((name, holder))
            if current is None or not when(current):
                return None
            self._records[(name, holder)] = replace(current, **changes)
            return self._records[(name, holder)]

    def refresh(self, name: str, holder: str, gen: int, token: str) -> Acquisition | None:
        return self._change(
            name, holder, lambda a: a.gen == gen and a.state is not State.RELEASED, token=token
        )

    def grant(self, name: str, holder: str, gen: int, ticket: int, now: float) -> Acquisition | None:
        def when(a: Acquisition) -> bool:
            return (a.gen, a.state, a.ticket) == (gen, State.WAITING, ticket)

        return self._change(name, holder, when, state=State.GRANTED, granted_at=now)

    def ungrant(self, name: str, holder: str, gen: int, granted_at: float) -> bool:
        def when(a: Acquisition) -> bool:
            return (a.gen, a.state, a.granted_at) == (gen, State.GRANTED, granted_at)

        return self._change(name, holder, when, state=State.WAITING, granted_at=None) is not None

    def take_over(
        self, name: str, holder: str, gen: int, granted_at: float, now: float
    ) -> Acquisition | None:
        def when(a: Acquisition) -> bool:
            return (a.gen, a.state, a.granted_at, a.delivered_at) == (gen, State.GRANTED, granted_at, None)

        return self._change(name, holder, when, granted_at=now)

    def delivered(self, name: str, holder: str, gen: int, now: float, *, sure: bool) -> None:
        self._change(name, holder, lambda a: (a.gen, a.state) == (gen, State.GRANTED), delivered_at=now)

    def end(
        self,
        name: str,
        holder: str,
        gen: int,
        now: float,
        reason: str,
        *,
        token: str | None = None,
        granted_at: float | None = None,
    ) -> bool:
        def when(a: Acquisition) -> bool:
            return (
                a.gen == gen
                and a.state is not State.RELEASED
                and (token is None or a.token == token)
                and (granted_at is None or a.granted_at == granted_at)
            )

        changed = self._change(name, holder, when, state=State.RELEASED, released_at=now, reason=reason)
        return changed is not None

    def free(self, name: str, holder: str, shard: int | None) -> Freed:
        with self._lock:
            current = self._records.get((name, holder))
            if current is None or current.state is not State.RELEASED:
                return Freed.NOT_RELEASED
            if shard is not None and not self.slots.release(pool_of(name), shard, holder):
                return Freed.MOVED
            key = holder.partition(":")[0]
            if key in self._held:
                entries = self._held[key][1]
                entries.discard(f"{name}|{acquisition_of(holder)}")
                if not entries:
                    del self._held[key]
            return Freed.FREED

    def held_by(self, execution_arn: str) -> list[tuple[str, str]]:
        with self._lock:
            _, entries = self._held.get(execution_hash(execution_arn), ("", set()))
            pairs = (e.partition("|") for e in entries)
            return sorted((name, acquisition_id) for name, _, acquisition_id in pairs)

    # -- the line -----------------------------------------------------------------------------------

    def take_ticket(self, name: str) -> int:
        with self._lock:
            head, tail = self._lines.get(name, (0, 0))
            self._lines[name] = (head, tail + 1)
            return tail + 1

    def line(self, name: str) -> tuple[int, int]:
        with self._lock:
            return self._lines.get(name, (0, 0))

    def ticket(self, name: str, number: int) -> Ticket | None:
        with self._lock:
            return self._tickets.get((name, number))

    def tickets(self, name: str, first: int, last: int) -> list[Ticket]:
        with self._lock:
            return [self._tickets[(name, n)] for n in range(first, last + 1) if (name, n) in self._tickets]

    def tombstone(self, name: str, number: int, now: float) -> bool:
        with self._lock:
            if (name, number) in self._tickets:
                return False
            self._tickets[(name, number)] = Ticket(name, number)
            return True

    def advance(self, name: str, number: int, *, drop: bool) -> bool:
        with self._lock:
            head, tail = self._lines.get(name, (0, 0))
            if head != number - 1:
                return False
            self._lines[name] = (number, tail)
            if drop:
                self._tickets.pop((name, number), None)
            return True


@dataclass(frozen=True)
class Sent:
    """One answer sent to a token: what, to whom, and whether Step Functions took it."""

    token: str
    execution_arn: str
    kind: str  # "success" or "failure"
    answer: Delivery
    output: Mapping[str, object]


class MemoryTokens:
    """Step Functions' side of task tokens. ``before_send`` and ``after_send`` (token, then token and
    answer) run around every SendTaskSuccess outside the lock: tests raise a crash from them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        self._owner: dict[str, str] = {}  # token -> execution ARN
        self._open: set[str] = set()
        self._status: dict[str, str] = {}
        self._answered: dict[str, threading.Event] = {}
        self.sent: list[Sent] = []
        self.calls: Counter[str] = Counter()
        self.before_send: Callable[[str], None] | None = None
        self.after_send: Callable[[str, Delivery], None] | None = None

    # -- playing Step Functions ---------------------------------------------------------------------

    def issue(self, execution_arn: str) -> str:
        """A task token of the execution (started if new), as a ``.waitForTaskToken`` task gets one."""
        with self._lock:
            token = f"token-{next(self._numbers)}"
            self._status.setdefault(execution_arn, "RUNNING")
            self._owner[token] = execution_arn
            self._open.add(token)
            self._answered[token] = threading.Event()
            return token

    def time_out(self, token: str) -> None:
        with self._lock:
            self._open.discard(token)

    def end(self, execution_arn: str, status: str = "SUCCEEDED") -> None:
        with self._lock:
            self._status[execution_arn] = status
            self._open -= {t for t, arn in self._owner.items() if arn == execution_arn}

    def wait(self, token: str, timeout: float = 30.0) -> bool:
        """Block until the token got an answer (threads of tests stand in for waiting executions)."""
        return self._answered[token].wait(timeout)

    def delivered(self) -> list[str]:
        """Execution ARNs whose SendTaskSuccess was taken, in order."""
        with self._lock:
            return [
                s.execution_arn for s in self.sent if s.kind == "success" and s.answer is Delivery.DELIVERED
            ]

    def _on_delivered(self, execution_arn: str) -> None:
        """Called under the lock at each delivery (subclasses count holders)."""

    # -- the port -----------------------------------------------------------------------------------

    def succeed(self, token: str, output: Mapping[str, object]) -> Delivery:
        self.calls["SendTaskSuccess"] += 1
        if self.before_send:
            self.before_send(token)
        answer = self._answer(token, "success", output)
        if self.after_send:
            self.after_send(token, answer)
        return answer

    def fail(self, token: str, error: str, cause: str) -> Delivery:
        self.calls["SendTaskFailure"] += 1
        return self._answer(token, "failure", {"error": error, "cause": cause})

    def _answer(self, token: str, kind: str, output: Mapping[str, object]) -> Delivery:
        with self._lock:
            arn = self._owner.get(token, "")
            live = token in self._open and self._status.get(arn) == "RUNNING"
            answer = Delivery.DELIVERED if live else Delivery.GONE
            if live:
                self._open.discard(token)
                self._answered[token].set()
                if kind == "success":
                    self._on_delivered(arn)
            self.sent.append(Sent(token, arn, kind, answer, dict(output)))
            return answer

    def execution_status(self, execution_arn: str) -> str | None:
        self.calls["DescribeExecution"] += 1
        with self._lock:
            return self._status.get(execution_arn)
