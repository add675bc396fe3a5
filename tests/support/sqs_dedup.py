"""SQS FIFO deduplication as SQS does it, for the queue's ``DeduplicationScope``, as a botocore hook.

moto compares a FIFO send's deduplication id only with the messages still in the queue (a copy of a
message already deleted gets through), on the whole queue whatever its ``DeduplicationScope``. SQS
drops a send whose deduplication id it accepted in the last 5 minutes (the send is answered as
accepted, with the first send's message id, and nothing is delivered): on the whole queue when the
scope is ``queue``, within the message's group when it is ``messageGroup`` (high-throughput FIFO, the
stack's queues: a send of the same id in another group is delivered).

``sqs_dedup`` installs, on a boto3 session (every client made from it afterwards) or on given
clients, hooks on ``SendMessage`` and ``SendMessageBatch`` that answer a repeat as SQS does, without
sending it, and give every other send to moto under a deduplication id of its own, so that moto
drops nothing; ``ReceiveMessage`` shows each message's id as it was sent. The queue's scope is read
from moto's queue at each send (``set_queue_attributes`` changes it, as on SQS). ``clock``: the time
the 5 minutes are counted in (``time.time``, which freezegun moves). Every repeat answered is in
``SqsDedup.dropped``. With ``sqs_rules`` too, open ``sqs_rules`` first: its refusals then never count
as sends here. A send without a deduplication id reaches moto untouched.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from moto.sqs.models import sqs_backends

from tests.support.hooks import _Http
from tests.support.sqs_rules import Refusal

WINDOW = 300.0  # SQS's deduplication interval, seconds
_CONTEXT = "sqs-dedup"
_RULES = "sqs-rules"  # tests.support.sqs_rules's refusal of a single send
_REGION = re.compile(r"sqs\.([a-z0-9-]+)\.")
Key = tuple[str, str, str]  # (queue URL, group or "" for the whole queue, deduplication id)


@dataclass
class SqsDedup:
    """The repeats answered without delivery: (queue URL, group, deduplication id), in order."""

    clock: Callable[[], float] = field(default=lambda: time.time())
    dropped: list[Key] = field(default_factory=list)
    # the sends accepted: key → (when, the message id SQS gave; None until moto has answered)
    accepted: dict[Key, tuple[float, str | None]] = field(default_factory=dict)
    sent_as: dict[str, str] = field(default_factory=dict)  # moto's deduplication id → the one sent
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, url: str, entry: dict[str, Any]) -> tuple[Key, str | None] | None:
        """The send's key and, for a repeat within the window, the first send's message id (a new id
        while that send is still on its way); None when it has no deduplication id or is not FIFO.
        An accepted ``entry`` (the caller's copy) is given moto's deduplication id."""
        dedup = entry.get("MessageDeduplicationId")
        if not url.endswith(".fifo") or not isinstance(dedup, str):
            return None
        group = str(entry.get("MessageGroupId", "")) if scope(url) == "messageGroup" else ""
        key = (url, group, dedup)
        now = self.clock()
        with self.lock:
            first = self.accepted.get(key)
            if first is not None and now - first[0] < WINDOW:
                self.dropped.append(key)
                return key, first[1] or uuid.uuid4().hex
            self.accepted[key] = (now, None)
            mine = f"dedup-{uuid.uuid4().hex}"
            self.sent_as[mine] = dedup
            entry["MessageDeduplicationId"] = mine
            return key, None

    def answered(self, key: Key, message_id: str | None) -> None:
        """The accepted send ``key`` was answered: its message id, or None when it failed (then it
        was never accepted)."""
        with self.lock:
            when = self.accepted.get(key, (self.clock(), None))[0]
            if message_id is None:
                self.accepted.pop(key, None)
            else:
                self.accepted[key] = (when, message_id)


def scope(url: str) -> str:
    """The queue's ``DeduplicationScope`` as moto holds it (``queue`` if moto has no such queue)."""
    account, name = url.rstrip("/").split("/")[-2:]
    found = _REGION.search(url)
    region = found.group(1) if found else "us-east-1"
    queue = sqs_backends[account][region].queues.get(name)
    return str(getattr(queue, "deduplication_scope", "queue")) if queue is not None else "queue"


def _dropped_answer(entry: dict[str, Any], message_id: str) -> dict[str, Any]:
    return {
        "MessageId": message_id,
        "MD5OfMessageBody": hashlib.md5(str(entry.get("MessageBody", "")).encode()).hexdigest(),
    }


@contextmanager
def sqs_dedup(
    session: Any = None, *clients: Any, clock: Callable[[], float] | None = None
) -> Iterator[SqsDedup]:
    """While open, FIFO sends are deduplicated as SQS does for each queue's scope; see the module
    docstring. ``session``: a boto3 session whose clients made from now on are hooked; ``clients``:
    clients made already."""
    dedup = SqsDedup() if clock is None else SqsDedup(clock=clock)

    def keep(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        url = str(params.get("QueueUrl", ""))
        if "Entries" not in params:
            if not isinstance(context.get(_RULES), Refusal):
                context[_CONTEXT] = dedup.take(url, params)
            return
        kept, accepted, repeats = [], {}, []
        for entry in params["Entries"]:
            entry = dict(entry)  # the caller's entries stay as they were given
            taken = dedup.take(url, entry)
            if taken is not None and taken[1] is not None:
                repeats.append((taken[0], {"Id": entry.get("Id", ""), **_dropped_answer(entry, taken[1])}))
                continue
            kept.append(entry)
            if taken is not None:
                accepted[entry.get("Id", "")] = taken[0]
        params["Entries"] = kept
        context[_CONTEXT] = (accepted, repeats, bool(kept))

    def answer(params: dict[str, Any], context: dict[str, Any], **_: Any) -> Any:
        taken = context.get(_CONTEXT)
        if taken is None or taken[1] is None:
            return None
        parsed = {**_dropped_answer(params, taken[1]), "ResponseMetadata": {"HTTPStatusCode": 200}}
        context[_CONTEXT] = None
        return _Http(200), parsed

    def batch_answer(context: dict[str, Any], **_: Any) -> Any:
        taken = context.get(_CONTEXT)
        if taken is not None and taken[1] and not taken[2]:
            # every entry a repeat: nothing reaches SQS; after-call adds them
            return _Http(200), {"Successful": [], "Failed": [], "ResponseMetadata": {"HTTPStatusCode": 200}}
        return None

    def sent(http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        taken = context.get(_CONTEXT)
        if taken is not None and taken[1] is None:
            ok = http_response.status_code < 300 and "Error" not in parsed
            dedup.answered(taken[0], parsed.get("MessageId") if ok else None)

    def batch_sent(parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        taken = context.get(_CONTEXT)
        if taken is None:
            return
        accepted, repeats, _ = taken
        ids = {s["Id"]: s["MessageId"] for s in parsed.get("Successful", [])}
        for entry_id, key in accepted.items():
            dedup.answered(key, ids.get(entry_id))
        if repeats and "Error" not in parsed:
            for key, answered in repeats:  # a repeat of an entry of this batch: that entry's id
                answered["MessageId"] = dedup.accepted.get(key, (0, None))[1] or answered["MessageId"]
            parsed.setdefault("Successful", []).extend(answered for _, answered in repeats)

    def received(parsed: dict[str, Any], **_: Any) -> None:
        for message in parsed.get("Messages", []):
            system = message.get("Attributes", {})
            mine = system.get("MessageDeduplicationId")
            if mine in dedup.sent_as:
                system["MessageDeduplicationId"] = dedup.sent_as[mine]

    hooks = [
        ("before-parameter-build.sqs.SendMessage", keep),
        ("before-parameter-build.sqs.SendMessageBatch", keep),
        ("before-call.sqs.SendMessage", answer),
        ("before-call.sqs.SendMessageBatch", batch_answer),
        ("after-call.sqs.SendMessage", sent),
        ("after-call.sqs.SendMessageBatch", batch_sent),
        ("after-call.sqs.ReceiveMessage", received),
    ]
    emitters = [client.meta.events for client in clients]
    if session is not None:
        emitters.append(session.events)
    for emitter in emitters:
        for event, hook in hooks:
            emitter.register(event, hook)
    try:
        yield dedup
    finally:
        for emitter in emitters:
            for event, hook in hooks:
                emitter.unregister(event, hook)
