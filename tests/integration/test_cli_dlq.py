"""``sluice dlq list | redrive | delete`` against a moto stack with both kinds of dead letters:
one Sluice dead-lettered (invalid, with a reason) and one SQS moved after maxReceiveCount receives."""

from __future__ import annotations

import json

import pytest

from sluice.ops import MOVED_BY_SQS, redrive_dedup_id
from tests.support.cli import receive_all


class Crash(BaseException):
    pass


@pytest.fixture
def dead(env, cli):
    """Two DLQ messages: ``moved`` (valid, SQS gave up on it) and ``invalid`` (Sluice refused it)."""
    sqs = env.client("sqs")
    moved = env.send({"id": "scene-7", "tile": "T31"}, group="tiles", sluice_key="scene-7")
    for _ in range(6):  # maxReceiveCount is 5: the sixth receive moves it
        sqs.receive_message(QueueUrl=env.settings.queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0)
    invalid = env.send(json.dumps([1, 2, 3]), group="bad")
    assert cli("tick").code == 0  # dead-letters the array with its reason
    assert env.queue_counts() == (0, 0)
    assert env.queue_counts(env.settings.dlq_url) == (2, 0)
    dlq_ids = {m["MessageId"]: m for m in _peek(env)}
    invalid_dlq = next(i for i, m in dlq_ids.items() if m["Body"] == "[1, 2, 3]")
    return {"moved": moved, "invalid": invalid, "invalid_dlq": invalid_dlq}


def _peek(env):
    """Read the DLQ and make everything visible again (as a second operator would)."""
    sqs = env.client("sqs")
    messages = receive_all(env, env.settings.dlq_url)
    for m in messages:
        sqs.change_message_visibility(
            QueueUrl=env.settings.dlq_url, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )
    return messages


def test_list_shows_each_message_and_consumes_none(env, cli, dead):
    run = cli("dlq", "list", "--json")

    assert run.code == 0
    data = run.json
    assert data["visible"] == 2 and data["in_flight"] == 0
    by_id = {m["message_id"]: m for m in data["messages"]}
    moved = by_id[dead["moved"]]  # SQS keeps the message id when it moves a message
    assert moved["reason"] == MOVED_BY_SQS
    assert moved["group_id"] == "tiles" and moved["key"] == "scene-7"
    assert moved["source_message_id"] == dead["moved"]
    assert moved["receive_count"] >= 6
    assert json.loads(moved["body"]) == {"id": "scene-7", "tile": "T31"}
    invalid = by_id[dead["invalid_dlq"]]
    assert invalid["reason"] == "payload must be a JSON object, got an array"
    assert invalid["source_message_id"] == dead["invalid"]
    assert invalid["group_id"] == "bad" and invalid["receive_count"] == 1
    # Listing consumed nothing: both are visible again at once.
    assert env.queue_counts(env.settings.dlq_url) == (2, 0)

    human = cli("dlq", "list", "--width", "20")
    assert human.code == 0
    assert f"{dead['invalid_dlq']}  group bad  receives 1" in human.out
    assert f"  source   {dead['invalid']}" in human.out
    assert "  reason   payload must be a J…" in human.out
    assert '  body     {"id": "scene-7", "…' in human.out
    assert "comes straight back here" in human.out
    assert env.queue_counts(env.settings.dlq_url) == (2, 0)


def test_list_of_an_empty_dlq(env, cli):
    run = cli("dlq", "list")
    assert run.code == 0 and run.out.strip() == "the DLQ is empty"


def test_redrive_one_message_sends_it_back_and_it_runs(env, cli, dead):
    run = cli("dlq", "redrive", "--id", dead["moved"], "--json")

    assert run.code == 0
    (done,) = run.json["done"]
    assert done["dlq_message_id"] == dead["moved"]
    (back,) = receive_all(env)
    assert back["MessageId"] == done["message_id"]
    assert json.loads(back["Body"]) == {"id": "scene-7", "tile": "T31"}
    assert back["Attributes"]["MessageGroupId"] == "tiles"
    assert back["Attributes"]["MessageDeduplicationId"] == redrive_dedup_id(dead["moved"])
    assert back["MessageAttributes"]["sluice-key"]["StringValue"] == "scene-7"
    assert "sluice-error" not in back.get("MessageAttributes", {})
    assert env.queue_counts(env.settings.dlq_url) == (1, 0)  # only the invalid one is left

    env.client("sqs").change_message_visibility(
        QueueUrl=env.settings.queue_url, ReceiptHandle=back["ReceiptHandle"], VisibilityTimeout=0
    )
    assert cli("tick", "--json").json["started"] == 1
    assert [json.loads(i)["id"] for i in map(json.dumps, env.inputs())] == ["scene-7"]


def test_redrive_all_and_an_invalid_payload_comes_back(env, cli, dead):
    run = cli("dlq", "redrive", "--all")

    assert run.code == 0
    assert run.out.startswith("redrove 2 messages to the main queue")
    assert "comes back to the DLQ unless it was fixed" in run.out
    assert env.queue_counts(env.settings.dlq_url) == (0, 0)
    assert env.queue_counts() == (2, 0)

    summary = cli("tick", "--json").json
    assert summary["started"] == 1 and summary["invalid"] == 1
    (again,) = _peek(env)
    assert again["Body"] == "[1, 2, 3]"
    assert (
        again["MessageAttributes"]["sluice-error"]["StringValue"]
        == "payload must be a JSON object, got an array"
    )


def test_redrive_needs_an_id_or_all(env, cli, dead):
    run = cli("dlq", "redrive")
    assert run.code == 2
    assert "--id MESSAGE_ID" in run.err and "--all" in run.err
    assert env.queue_counts(env.settings.dlq_url) == (2, 0) and env.queue_counts() == (0, 0)
    assert cli("dlq", "redrive", "--all", "--id", dead["moved"]).code == 2  # one or the other


def test_redrive_of_an_unknown_id_exits_1_and_moves_nothing(env, cli, dead):
    run = cli("dlq", "redrive", "--id", "no-such-message")
    assert run.code == 1
    assert "no-such-message: not found" in run.err
    assert env.queue_counts(env.settings.dlq_url) == (2, 0) and env.queue_counts() == (0, 0)


def test_a_redrive_that_dies_before_the_delete_is_not_sent_twice(env, cli, dead):
    """Interrupted after the send, before the delete: the message is still in the DLQ, and running
    the redrive again within 5 minutes sends nothing new (same deduplication id)."""

    def crash(**_):
        raise Crash

    env.session.events.register("before-call.sqs.DeleteMessageBatch", crash)
    with pytest.raises(Crash):
        cli("dlq", "redrive", "--id", dead["moved"])
    env.session.events.unregister("before-call.sqs.DeleteMessageBatch", crash)
    assert env.queue_counts() == (1, 0)
    assert env.queue_counts(env.settings.dlq_url) == (2, 0)  # still there, visible again

    run = cli("dlq", "redrive", "--id", dead["moved"])

    assert run.code == 0
    assert env.queue_counts() == (1, 0)  # same deduplication id: SQS kept one
    assert env.queue_counts(env.settings.dlq_url) == (1, 0)


def test_delete_drops_only_the_named_message(env, cli, dead):
    run = cli("dlq", "delete", "--id", dead["invalid_dlq"])
    assert run.code == 0 and run.out.startswith("deleted 1 message from the DLQ")
    assert [m["MessageId"] for m in _peek(env)] == [dead["moved"]]
    assert env.queue_counts() == (0, 0)
    assert cli("dlq", "delete").code == 2  # --id is required
