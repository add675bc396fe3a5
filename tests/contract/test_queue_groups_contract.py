"""Message groups, written once and run against the in-memory queue and the SQS adapter on moto: a
receive skips every group with a message in flight from an earlier receive, hands out the rest in
the order sent (several of one group together), and a message that comes back goes ahead of its
group's later ones. The benchmark's queue and the fair lanes' measurements rest on this."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import count

import boto3
import pytest
from moto import mock_aws

from sluice.adapters.aws.sqs import SqsQueue
from sluice.adapters.memory.aws import MemoryQueue
from sluice.core.clock import FakeClock
from sluice.core.model import Message


@dataclass
class Queue:
    adapter: MemoryQueue | SqsQueue
    send: Callable[[str, str], None]  # (body, group)

    def bodies(self, n: int = 10) -> list[str]:
        return [m.body for m in self.received(n)]

    def received(self, n: int = 10) -> list[Message]:
        return self.adapter.receive(n, 0)


@pytest.fixture(params=["memory", "moto"])
def queue(request: pytest.FixtureRequest) -> Iterator[Queue]:
    if request.param == "memory":
        memory = MemoryQueue(clock=FakeClock(1_000.0))
        yield Queue(memory, lambda body, group: memory.send(body, group) and None)
        return
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        url = sqs.create_queue(QueueName="groups.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"]
        ids = count()

        def send(body: str, group: str) -> None:
            sqs.send_message(
                QueueUrl=url,
                MessageBody=body,
                MessageGroupId=group,
                MessageDeduplicationId=f"d{next(ids)}",
            )

        yield Queue(SqsQueue(sqs, url), send)


def test_a_group_in_flight_is_skipped_until_its_message_is_deleted(queue):
    for body, group in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
        queue.send(body, group)
    (a1,) = queue.received(1)
    assert a1.body == "a1"
    assert queue.bodies() == ["b1"]  # a2 waits behind a1, in flight
    queue.adapter.delete([a1])
    assert queue.bodies() == ["a2"]
    assert queue.bodies() == []  # every group holds a message in flight


def test_one_receive_hands_out_several_messages_of_a_group_in_order(queue):
    for body, group in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a")]:
        queue.send(body, group)
    assert queue.bodies(3) == ["a1", "b1", "a2"]
    queue.send("b2", "b")
    assert queue.bodies() == []  # a3 behind a1 and a2, b2 behind b1


def test_a_message_sent_back_goes_ahead_of_its_groups_later_ones(queue):
    queue.send("b1", "b")
    (b1,) = queue.received()
    queue.send("b2", "b")
    assert queue.bodies() == []
    queue.adapter.release([b1])
    assert queue.bodies() == ["b1", "b2"]


def test_the_in_memory_queue_blocks_no_message_without_a_group():
    memory = MemoryQueue(clock=FakeClock(1_000.0))
    for body in ("x1", "x2", "x3"):
        memory.send(body)
    assert [m.body for m in memory.receive(1, 0)] == ["x1"]
    assert [m.body for m in memory.receive(10, 0)] == ["x2", "x3"]
