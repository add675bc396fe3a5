"""Promise 5, entry by entry: bad input never crashes a tick and never blocks its FIFO group.

Each unusable message is sent first in its group, with a valid payload behind it in the same
group. One tick must survive it, dead-letter it (body untouched, the reason in the ``sluice-error``
attribute) and start the payload behind it. A body too big to dead-letter beside the reason (a copy
is at most 262,144 bytes as SQS counts them) is replaced in the copy by a note that points at it.
The catalogue, with the reason each entry gets, is in tests/reliability/README.md; the entries at SQS's,
DynamoDB's and Python's limits are in ``tests/support/bad_input.py``.

Three entries are not bad input, and the tests say so: an id with characters an execution name
may not hold, ids that look alike once sanitised, and a message without the ``sluice-key``
attribute. Those run, each exactly once, under distinct valid names and distinct leases.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest
from moto import mock_aws

from sluice.core.model import Outcome
from sluice.core.names import NAME_PATTERN
from tests.reliability.world import pool
from tests.support.aws import build_stack
from tests.support.bad_input import EXTREME_PAYLOADS, HOSTILE, sqs_size_limit

BIG = json.dumps({"id": "big", "pad": "x" * 300_000})

# (case, body, message attributes, what the reason must say)
UNUSABLE: list[tuple[str, str, dict[str, str] | None, str]] = [
    ("not JSON", "this is not JSON", None, r"not JSON: Expecting value at line 1 column 1"),
    ("truncated JSON", '{"id": "x"', None, r"not JSON: Expecting ',' delimiter"),
    ("JSON array", "[1, 2, 3]", None, r"must be a JSON object, got an array"),
    ("number", "42", None, r"must be a JSON object, got a number"),
    ("null", "null", None, r"must be a JSON object, got null"),
    ("string", '"run me"', None, r"must be a JSON object, got a string"),
    ("empty object without a key", "{}", None, r"empty JSON object: nothing to run and no key"),
    ("nesting 65 deep", '{"a":' * 65 + "1" + "}" * 65, None, r"nested deeper than 64 levels"),
    ("nesting 20,000 deep", '{"a":' * 20_000 + "1" + "}" * 20_000, None, r"nested deeper than 64 levels"),
    ("over 256 KiB", BIG, None, rf"payload is {len(BIG):,} bytes; Step Functions accepts at most 262,144"),
    ("lone surrogate in a value", '{"id": "x\\ud800y"}', None, r"lone surrogate"),
    ("lone surrogate in a field name", '{"id": "x", "\\udc00": 1}', None, r"lone surrogate"),
    (
        "10,000-character id",
        json.dumps({"id": "k" * 10_000}),
        None,
        r"'id' is 10,000 bytes in UTF-8; keys are at most 1,024 bytes",
    ),
    (
        "control character in the id",
        json.dumps({"id": "a\u0001b"}),
        None,
        r"'id' contains a control character",
    ),
    (
        "10,000-character sluice-key attribute",
        json.dumps({"id": "fine"}),
        {"sluice-key": "k" * 10_000},
        r"attribute 'sluice-key' is 10,000 bytes in UTF-8",
    ),
    (
        "sluice-key attribute of 300 four-byte characters",
        json.dumps({"id": "fine"}),
        {"sluice-key": "\U0001f600" * 300},
        r"attribute 'sluice-key' is 1,200 bytes in UTF-8; keys are at most 1,024 bytes",
    ),
    (
        "malformed pointer",
        json.dumps({"sluicePayload": {"uri": "s3://bucket/k", "sha256": "00", "size": 5}}),
        None,
        r"^malformed pointer \(sluicePayload\): sha256 must be 64 lowercase hexadecimal digits$",
    ),
    (
        "pointer on a stack without a payload bucket",
        json.dumps({"sluicePayload": {"uri": "s3://bucket/k", "sha256": "0" * 64, "size": 5}}),
        None,
        r"a pointer to a stored payload \(s3://bucket/k\), but this stack has no payload bucket",
    ),
    *((name.replace("_", " "), h.body, None, h.reason) for name, h in HOSTILE.items()),
]
# Too big for a dead-letter copy (262,144 bytes as SQS counts, with the reason attributes): the
# copy is a note that points at the original.
NOTED = {"over 256 KiB", *(name.replace("_", " ") for name, h in HOSTILE.items() if not h.body_kept)}


@pytest.fixture
def stack():
    """The shared ``stack`` fixture, on boto3 clients made once per process (they are slow to build)."""
    with mock_aws():
        built = build_stack(pool(), name="sluice-bad-input")
        # SQS's size rule, which moto does not apply to attributes, on the launcher's client.
        with sqs_size_limit(built.runtime().client("sqs")):
            yield built


def send(stack: Any, body: str, group: str, attributes: dict[str, str] | None = None) -> str:
    request: dict[str, Any] = {
        "QueueUrl": stack.settings.queue_url,
        "MessageBody": body,
        "MessageGroupId": group,
        "MessageDeduplicationId": hashlib.sha256(
            f"{group}/{body}/{attributes}".encode("utf-8", "surrogatepass")
        ).hexdigest(),
    }
    if attributes:
        request["MessageAttributes"] = {
            k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()
        }
    return stack.client("sqs").send_message(**request)["MessageId"]


def drain_dlq(stack: Any) -> list[dict[str, Any]]:
    sqs = stack.client("sqs")
    out: list[dict[str, Any]] = []
    while got := sqs.receive_message(
        QueueUrl=stack.settings.dlq_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
    ).get("Messages", []):
        out.extend(got)
        sqs.delete_message_batch(
            QueueUrl=stack.settings.dlq_url,
            Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)],
        )
    return out


def started_inputs(stack: Any) -> list[Any]:
    return stack.inputs()


def payload_record(stack: Any, key: str) -> dict[str, Any] | None:
    return (
        stack.client("dynamodb")
        .get_item(
            TableName=stack.settings.table_name, Key={"pk": {"S": f"PAYLOAD#{key}"}}, ConsistentRead=True
        )
        .get("Item")
    )


@pytest.mark.parametrize(("case", "body", "attributes", "reason"), UNUSABLE, ids=[u[0] for u in UNUSABLE])
def test_unusable_input_is_dead_lettered_and_its_group_runs_on(stack, case, body, attributes, reason):
    bad = send(stack, body, "g", attributes)
    send(stack, json.dumps({"id": "behind"}), "g")

    summary = stack.launcher().tick()  # survives: returns, raises nothing

    assert (summary.n(Outcome.INVALID), summary.n(Outcome.STARTED)) == (1, 1)
    assert started_inputs(stack) == [{"id": "behind"}]
    [dead] = drain_dlq(stack)
    attrs = dead["MessageAttributes"]
    assert re.search(reason, attrs["sluice-error"]["StringValue"]), attrs["sluice-error"]["StringValue"]
    assert attrs["sluice-source-message-id"]["StringValue"] == bad
    if case in NOTED:
        raw = body.encode()
        note = json.loads(dead["Body"])
        assert "too large" in note.pop("sluice-dead-letter-note")
        assert note == {
            "source_message_id": bad,
            "bytes": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest(),
        }
        assert attrs["sluice-body-truncated"]["StringValue"] == str(len(raw))
    else:
        assert dead["Body"] == body  # untouched, to fix and redrive
    assert stack.queue_counts() == (0, 0)


def test_every_unusable_input_at_once_in_one_group(stack):
    """All of them, one after another in a single group, then one valid payload: one tick."""
    for _, body, attributes, _ in UNUSABLE:
        send(stack, body, "g", attributes)
    send(stack, json.dumps({"id": "behind"}), "g")

    launcher = stack.launcher()
    summaries = [launcher.tick()]
    while stack.queue_counts() != (0, 0) and len(summaries) < 5:
        summaries.append(launcher.tick())

    assert sum(s.n(Outcome.INVALID) for s in summaries) == len(UNUSABLE)
    assert started_inputs(stack) == [{"id": "behind"}]
    reasons = [m["MessageAttributes"]["sluice-error"]["StringValue"] for m in drain_dlq(stack)]
    assert len(reasons) == len(UNUSABLE) and all(reasons)


@pytest.mark.parametrize("case", sorted(EXTREME_PAYLOADS))
def test_payloads_at_the_limits_run(stack, case):
    """A key of 1,024 UTF-8 bytes fits DynamoDB's 2,048-byte partition key once prefixed (moto
    enforces that limit); a 4,300-digit integer is as long as Python reads."""
    payload = EXTREME_PAYLOADS[case]
    send(stack, json.dumps(payload, ensure_ascii=False), "g")

    summary = stack.launcher().tick()

    assert summary.n(Outcome.STARTED) == 1
    assert started_inputs(stack) == [payload]
    assert payload_record(stack, payload["id"])["state"]["S"] == "CLAIMED"  # its lease held; started


def test_an_id_an_execution_name_may_not_hold_runs(stack):
    """Ids like cirrus's ``collection/item`` are valid payloads: the name sanitises a readable
    prefix and adds a hash of the raw key and message id. Not dead-lettered, by design."""
    key = "landsat-c2l2/LC09_L2SP_042034_20240101:2 #1 ü"
    send(stack, json.dumps({"id": key}), "g")

    summary = stack.launcher().tick()

    assert summary.n(Outcome.STARTED) == 1
    [execution] = stack.executions()
    assert NAME_PATTERN.match(execution["name"])
    assert execution["name"].startswith("landsat-c2l2-LC09_L2SP_042034_20240101-")  # readable prefix
    assert payload_record(stack, key)["holder"]["S"] == execution["name"]
    assert drain_dlq(stack) == []


def test_ids_that_look_alike_once_sanitised_each_run_once(stack):
    """Sanitised, these prefixes collide; the names (hash of the raw key) and leases do not, so no
    false duplicate: every one runs, exactly once."""
    keys = ["a/b", "a:b", "a b", "ключ/1", "ключ:1", "键/1", "キー/1"]
    for i, key in enumerate(keys):
        send(stack, json.dumps({"id": key}), f"g{i}")

    stack.client("ssm").put_parameter(
        Name=stack.settings.max_parameter, Value="10", Type="String", Overwrite=True
    )
    summary = stack.launcher().tick()

    assert summary.n(Outcome.STARTED) == len(keys) and summary.n(Outcome.DUPLICATE) == 0
    names = [e["name"] for e in stack.executions()]
    assert len(set(names)) == len(keys) and all(NAME_PATTERN.match(n) for n in names)
    holders = {payload_record(stack, k)["holder"]["S"] for k in keys}
    assert holders == set(names)  # one lease per raw key
    assert sorted(i["id"] for i in started_inputs(stack)) == sorted(keys)


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ({"id": "from-the-cli"}, "from-the-cli"),
        (
            {"job": "resize", "width": 640},
            hashlib.sha256(b'{"job":"resize","width":640}').hexdigest(),  # canonical JSON
        ),
    ],
    ids=["with an id", "without an id"],
)
def test_a_message_without_sluice_attributes_runs_under_the_derived_key(stack, body, key):
    """Sent with the AWS CLI: no ``sluice-key`` attribute. The key is ``id``, else the content hash,
    the same key ``sluice enqueue`` would have chosen, so duplicates are still recognised."""
    send(stack, json.dumps(body), "g")
    send(stack, json.dumps(body, indent=2), "g")  # the same payload, other bytes: a duplicate

    summary = stack.launcher().tick()

    assert (summary.n(Outcome.STARTED), summary.n(Outcome.DUPLICATE)) == (1, 1)
    record = payload_record(stack, key)
    assert record["state"]["S"] == "CLAIMED" and int(record["duplicates"]["N"]) == 1
