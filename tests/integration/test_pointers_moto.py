"""Stored payloads against moto, with the real adapters: `sluice enqueue` stores a large body in the
payload bucket and enqueues its pointer; the launcher checks the pointer before any claim, starts
the execution with the pointer as input, dead-letters a pointer to a missing or altered object with
its reason, and leaves the message for a later tick when S3 throttles or fails."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from handlers import _shared
from sluice.core.model import Outcome
from sluice.features.pointers import POINTER_FIELD, object_key
from tests.support.aws import REGION, build_stack
from tests.support.cli import sluice, use_env
from tests.support.hooks import error_answer, throttle

BUCKET = "sluice-test-payloads"
BIG = {"id": "scene-42", "manifest": "m" * 600 * 1024}  # 600 KiB of payload, and then some
BODY = json.dumps(BIG).encode()
SHA = hashlib.sha256(BODY).hexdigest()


@pytest.fixture
def stack(session):
    s3 = session.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_bucket_encryption(
        Bucket=BUCKET,
        ServerSideEncryptionConfiguration={
            "Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}]
        },
    )
    return build_stack(session, payload_bucket=BUCKET)


@pytest.fixture
def cli(stack, monkeypatch, capsys):
    use_env(monkeypatch, stack, SLUICE_PAYLOAD_BUCKET=BUCKET)
    _shared.reset()
    yield lambda *argv: sluice(capsys, *argv, session=stack.session)
    _shared.reset()


def put(stack: Any, body: bytes, key: str = object_key(SHA), **extra: Any) -> None:
    stack.client("s3").put_object(Bucket=BUCKET, Key=key, Body=body, **extra)


def pointer(**changes: Any) -> str:
    spec = {"uri": f"s3://{BUCKET}/{object_key(SHA)}", "sha256": SHA, "size": len(BODY), **changes}
    return json.dumps({"id": "scene-42", POINTER_FIELD: spec})


def payload_record(stack: Any) -> dict[str, Any]:
    return stack.runtime().store().payload("scene-42")


def test_a_600_kib_payload_is_stored_encrypted_and_runs_from_its_pointer(stack, cli, tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(BODY)

    first = cli("enqueue", path, "--json")
    again = cli("enqueue", path, "--json")  # a retried enqueue: same object, and SQS drops the message

    assert first.code == again.code == 0, first.err
    uri = f"s3://{BUCKET}/payloads/{SHA}"
    assert [s["stored"] for s in first.json["sent"]] == [uri]
    s3 = stack.client("s3")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]] == [f"payloads/{SHA}"]
    head = s3.head_object(Bucket=BUCKET, Key=f"payloads/{SHA}", ChecksumMode="ENABLED")
    assert head["ServerSideEncryption"] == "AES256" and head["ContentLength"] == len(BODY)
    assert (
        hashlib.sha256(s3.get_object(Bucket=BUCKET, Key=f"payloads/{SHA}")["Body"].read()).hexdigest() == SHA
    )
    assert stack.queue_counts() == (1, 0)

    summary = stack.launcher().tick()

    assert summary.n(Outcome.STARTED) == 1
    [started] = stack.inputs()
    assert started == {"id": "scene-42", POINTER_FIELD: {"uri": uri, "sha256": SHA, "size": len(BODY)}}
    assert payload_record(stack).state.value == "CLAIMED"  # its lease held; started
    assert stack.queue_counts() == (0, 0) and stack.dlq_messages() == []


def test_the_threshold_flag_sends_a_small_payload_by_pointer_too(stack, cli, tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"id": "small"}))

    run = cli("enqueue", path, "--pointer-threshold", "0", "--json")

    assert run.code == 0, run.err
    [sent] = run.json["sent"]
    assert sent["key"] == "small" and sent["stored"].startswith(f"s3://{BUCKET}/payloads/")
    assert stack.launcher().tick().n(Outcome.STARTED) == 1
    assert list(stack.inputs()[0]) == ["id", POINTER_FIELD]


def test_a_threshold_above_what_a_message_holds_is_a_usage_error(cli, tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps({"id": "small"}))
    run = cli("enqueue", path, "--pointer-threshold", "262144")
    assert run.code == 2 and "must be from 0 to 260,096" in run.err


def dead_lettered(stack: Any, summary: Any) -> str:
    """The one message in the DLQ: its body is the pointer as sent, its reason recorded on the payload
    too; nothing started and nothing is left in the queue."""
    assert (summary.n(Outcome.INVALID), summary.n(Outcome.STARTED)) == (1, 0)
    assert stack.executions() == []
    assert stack.queue_counts() == (0, 0)
    [dead] = stack.dlq_messages()
    assert dead["Body"] == pointer()
    reason = dead["MessageAttributes"]["sluice-error"]["StringValue"]
    record = payload_record(stack)
    assert record.state.value == "INVALID" and record.reason == reason and record.holder is None
    return reason


def test_a_pointer_to_a_missing_object_is_dead_lettered_with_its_reason(stack):
    stack.send(pointer(), sluice_key="scene-42")

    reason = dead_lettered(stack, stack.launcher().tick())

    assert reason == (
        f"stored payload s3://{BUCKET}/payloads/{SHA} does not exist (never stored, deleted, or expired)"
    )


@pytest.mark.parametrize(
    "checksum",
    [{"ChecksumAlgorithm": "SHA256"}, {}],
    ids=["S3 keeps its SHA-256", "S3 keeps none: read and hashed"],
)
def test_a_pointer_to_an_altered_object_is_dead_lettered_with_its_reason(stack, checksum):
    altered = BODY.replace(b"mmm", b"MMM", 1)  # same size, other bytes
    put(stack, altered, **checksum)
    stack.send(pointer(), sluice_key="scene-42")

    reason = dead_lettered(stack, stack.launcher().tick())

    assert reason == (
        f"stored payload s3://{BUCKET}/payloads/{SHA} has SHA-256 {hashlib.sha256(altered).hexdigest()}; "
        f"the pointer says {SHA} (the object was changed after the pointer was made)"
    )


def test_an_object_stored_without_a_checksum_runs_once_read_and_hashed(stack):
    put(stack, BODY)  # as a producer without Sluice might: S3 keeps a CRC32, no SHA-256
    stack.send(pointer(), sluice_key="scene-42")
    assert stack.launcher().tick().n(Outcome.STARTED) == 1


def test_a_malformed_pointer_is_dead_lettered_with_its_reason(stack):
    stack.send(json.dumps({POINTER_FIELD: {"uri": f"s3://{BUCKET}/k", "sha256": "x", "size": 1}}))
    summary = stack.launcher().tick()
    assert (summary.n(Outcome.INVALID), summary.n(Outcome.STARTED)) == (1, 0)
    [dead] = stack.dlq_messages()
    assert dead["MessageAttributes"]["sluice-error"]["StringValue"] == (
        "malformed pointer (sluicePayload): sha256 must be 64 lowercase hexadecimal digits"
    )


def refuse(client: Any, operation: str, code: str, status: int) -> None:
    """Answer ``operation`` once with an S3 error, without sending it."""
    calls = []

    def hook(**_: Any) -> Any:
        if not calls:
            calls.append(operation)
            return error_answer(code, status)
        return None

    client.meta.events.register(f"before-call.s3.{operation}", hook)


@pytest.mark.parametrize(
    ("operation", "fault"),
    [
        ("HeadObject", "throttled"),
        ("HeadObject", "SlowDown"),
        ("HeadObject", "InternalError"),
        ("GetObject", "throttled"),
    ],
)
def test_a_throttled_or_failing_s3_leaves_the_message_for_a_later_tick(stack, operation, fault):
    put(stack, BODY, **({"ChecksumAlgorithm": "SHA256"} if operation == "HeadObject" else {}))
    stack.send(pointer(), sluice_key="scene-42")
    runtime = stack.runtime()
    launcher, s3 = runtime.launcher(), runtime.client("s3")
    if fault == "throttled":
        throttle(s3, operation, times=1)
    else:
        refuse(s3, operation, fault, 503 if fault == "SlowDown" else 500)

    summary = launcher.tick()

    assert summary.stopped == "transient" and summary.n(Outcome.INTERRUPTED) == 1
    assert stack.executions() == [] and stack.dlq_messages() == []
    assert stack.queue_counts() == (1, 0)  # back in the queue, visible
    assert stack.runtime().store().payload("scene-42") is None  # nothing claimed, nothing recorded

    assert launcher.tick().n(Outcome.STARTED) == 1  # S3 answers again: it runs
