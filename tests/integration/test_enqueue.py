"""Producer side against moto: what reaches the queue, and what the launcher then does with it."""

from __future__ import annotations

import json

from sluice.core.model import Outcome
from sluice.enqueue import enqueue, read_items


def all_messages(stack) -> list[dict]:
    return stack.drain(stack.settings.queue_url)


def test_json_lines_with_bad_lines_sends_the_good_ones_and_names_the_bad(stack):
    text = "\n".join(
        [json.dumps({"id": f"s{i}", "tile": f"T{i % 3}"}) for i in range(23)]
        + ["not json", "[1]", json.dumps({"id": "big", "b": "x" * 270_000})]
    )
    report = enqueue(stack.client("sqs"), stack.settings.queue_url, list(read_items(text)), group_by="tile")
    assert len(report.sent) == 23
    assert stack.queue_counts() == (23, 0)
    assert [(w, r.split(":")[0]) for w, r in report.failed] == [
        ("line 24", "not JSON"),
        ("line 25", "payload must be a JSON object, got an array"),
        (
            "line 26",
            "payload is 270,022 bytes; Step Functions accepts at most 262,144 bytes of input (with the "
            "stack's payload bucket, SLUICE_PAYLOAD_BUCKET, it would be stored there)",
        ),
    ]
    messages = all_messages(stack)
    assert len(messages) == 23
    assert {m["Attributes"]["MessageGroupId"] for m in messages} == {"T0", "T1", "T2"}
    assert {m["MessageAttributes"]["sluice-key"]["StringValue"] for m in messages} == {
        f"s{i}" for i in range(23)
    }


def test_key_field_travels_to_the_launcher_as_an_attribute(stack):
    items = list(read_items(json.dumps([{"scene": "a", "v": 1}, {"scene": "a", "v": 2}])))
    report = enqueue(stack.client("sqs"), stack.settings.queue_url, items, key_field="scene")
    assert [k for _, k, _ in report.sent] == ["a", "a"]
    summary = stack.launcher().tick()
    # Same key, so the second is a duplicate of the first while it runs.
    assert (summary.n(Outcome.STARTED), summary.n(Outcome.DUPLICATE)) == (1, 1)
    assert stack.runtime().store().payload("a").duplicates == 1


def test_identical_payloads_are_deduplicated_by_sqs(stack):
    items = list(read_items('{"id": "x", "a": 1}\n{"a": 1, "id": "x"}'))
    report = enqueue(stack.client("sqs"), stack.settings.queue_url, items)
    assert len(report.sent) == 2 and len(all_messages(stack)) == 1
