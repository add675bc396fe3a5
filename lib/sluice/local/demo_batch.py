"""What the demo sends and runs: its workflow, and a batch of payloads with some invalid and some
re-submitted, sent by a producer while Sluice already runs."""

from __future__ import annotations

import json
import random
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.enqueue import Item, enqueue, read_items
from sluice.local.embedded import EmbeddedAws

# Raw messages each get a group of their own ("raw-1", ...): a dead-lettered message keeps its group,
# and the DLQ can only be read in full when no group holds more than one receive's worth.
RAW_GROUP = "raw"

# Wait $.seconds (2 s when absent or not a number), then fail when $.fail is true, else succeed.
DEMO_WORKFLOW: dict[str, Any] = {
    "Comment": "Sluice demo job: waits the payload's seconds, fails when the payload asks to.",
    "StartAt": "HasSeconds",
    "States": {
        "HasSeconds": {
            "Type": "Choice",
            "Choices": [
                {
                    "And": [
                        {"Variable": "$.seconds", "IsPresent": True},
                        {"Variable": "$.seconds", "IsNumeric": True},
                    ],
                    "Next": "Work",
                }
            ],
            "Default": "WorkTwoSeconds",
        },
        "Work": {"Type": "Wait", "SecondsPath": "$.seconds", "Next": "ShouldFail"},
        "WorkTwoSeconds": {"Type": "Wait", "Seconds": 2, "Next": "ShouldFail"},
        "ShouldFail": {
            "Type": "Choice",
            "Choices": [
                {
                    "And": [
                        {"Variable": "$.fail", "IsPresent": True},
                        {"Variable": "$.fail", "BooleanEquals": True},
                    ],
                    "Next": "Failed",
                }
            ],
            "Default": "Done",
        },
        "Failed": {"Type": "Fail", "Error": "DemoFailure", "Cause": "the payload asked to fail"},
        "Done": {"Type": "Succeed"},
    },
}

# Bodies a careless producer sends with the AWS CLI; the launcher dead-letters each with a reason.
INVALID_BODIES = [
    '{"id": "order-broken", "seconds": 2',
    "[1, 2, 3]",
    "{}",
    '"just a string"',
    '{"a": ' * 70 + "1" + "}" * 70,
    "null",
]


@dataclass(frozen=True)
class Planned:
    """One message to send: a payload through sluice.enqueue, or a raw body through SendMessage."""

    where: str
    body: str
    raw: bool = False
    resubmission: bool = False


@dataclass(frozen=True)
class Sent:
    where: str
    message_id: str
    key: str | None  # None for raw bodies
    group: str
    raw: bool
    resubmission: bool


def generate_batch(count: int, seed: int) -> list[Planned]:
    """``count`` messages: about 2% invalid, 5% re-submissions of an earlier payload right behind it in
    its FIFO group, the rest distinct orders of 8 customers (the message groups), each waiting 1 to 3 s,
    one in ten failing."""
    rng = random.Random(seed)
    invalid = max(1, round(count * 0.02)) if count >= 10 else 0
    resubmitted = max(1, round(count * 0.05)) if count >= 10 else 0
    distinct = max(1, count - invalid - resubmitted)
    customers = [f"customer-{c:02d}" for c in range(1, min(8, distinct) + 1)]
    payloads = [
        {
            "id": f"order-{i:04d}",
            "customer": rng.choice(customers),
            "seconds": rng.choice((1, 2, 3)),
            "fail": rng.random() < 0.1,
            "attempt": 1,
        }
        for i in range(1, distinct + 1)
    ]
    again = set(rng.sample(range(distinct), min(resubmitted, distinct)))
    planned: list[Planned] = []
    for i, payload in enumerate(payloads):
        planned.append(Planned(f"payload {len(planned) + 1}", json.dumps(payload)))
        if i in again:
            retry = {**payload, "attempt": 2}
            planned.append(Planned(f"payload {len(planned) + 1}", json.dumps(retry), resubmission=True))
    # Invalid bodies arrive spread over the batch, as they would from a careless producer.
    for n in range(invalid):
        at = rng.randrange(len(planned) + 1)
        planned.insert(at, Planned("raw", INVALID_BODIES[n % len(INVALID_BODIES)], raw=True))
    return [Planned(f"message {i}", p.body, p.raw, p.resubmission) for i, p in enumerate(planned, 1)]


def load_batch(path: Path) -> list[Planned]:
    """A file of payloads (a JSON array, one object, or JSON Lines). Lines sluice.enqueue would refuse
    are sent raw, so they reach the launcher and the DLQ."""
    from sluice.core.errors import InvalidPayload
    from sluice.enqueue import prepare

    planned: list[Planned] = []
    seen: set[str] = set()
    for item in read_items(path.read_text(encoding="utf-8")):
        try:
            key = prepare(item).key
        except InvalidPayload:
            planned.append(Planned(item.where, item.body, raw=True))
            continue
        planned.append(Planned(item.where, item.body, resubmission=key in seen))
        seen.add(key)
    return planned


def send_batch(sqs: Any, queue_url: str, planned: list[Planned], *, group_by: str | None) -> list[Sent]:
    """Valid payloads through ``sluice.enqueue`` (batches of 10), raw bodies with plain SendMessage."""
    sent: list[Sent] = []
    run: list[Planned] = []

    def flush() -> None:
        if not run:
            return
        items = [Item(p.where, p.body) for p in run]
        report = enqueue(sqs, queue_url, items, group_by=group_by)
        if report.stopped is not None:
            raise report.stopped
        by_where = {p.where: p for p in run}
        for where, key, message_id in report.sent:
            body = json.loads(by_where[where].body)
            group = str(body[group_by]) if group_by else key
            sent.append(Sent(where, message_id, key, group, False, by_where[where].resubmission))
        for where, _reason in report.failed:
            # Refused by sluice.enqueue after all: a producer without it would send it anyway.
            sent.append(_send_raw(sqs, queue_url, by_where[where]))
        run.clear()

    for p in planned:
        if p.raw:
            flush()
            sent.append(_send_raw(sqs, queue_url, p))
        else:
            run.append(p)
    flush()
    return sent


class Producer(threading.Thread):
    """Sends the batch in the background with a client of its own."""

    def __init__(
        self,
        aws: EmbeddedAws,
        queue_url: str,
        planned: list[Planned],
        by_customer: bool,
        then: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(name="producer", daemon=True)
        self.sqs = aws.session().client("sqs", endpoint_url=aws.endpoint)
        self.queue_url = queue_url
        self.planned = planned
        self.group_by = "customer" if by_customer else None
        self.sent: list[Sent] = []
        self.then = then  # sent after the batch (the DAG and the stored payload: demo_dag.py)
        self.then_result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.sent = send_batch(self.sqs, self.queue_url, self.planned, group_by=self.group_by)
            if self.then is not None:
                self.then_result = self.then()
        except BaseException as exc:  # reported by the main thread
            self.error = exc


def _send_raw(sqs: Any, queue_url: str, p: Planned) -> Sent:
    group = f"{RAW_GROUP}-{uuid.uuid4().hex[:8]}"
    message_id = sqs.send_message(
        QueueUrl=queue_url,
        MessageBody=p.body,
        MessageGroupId=group,
        MessageDeduplicationId=uuid.uuid4().hex,
    )["MessageId"]
    return Sent(p.where, message_id, None, group, True, False)
