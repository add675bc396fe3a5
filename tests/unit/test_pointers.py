"""Stored payloads without AWS: the pointer format, the checks, and what the launcher does with them."""

from __future__ import annotations

import hashlib
import json

import pytest

from sluice.adapters.memory.aws import MemoryExecutions, MemoryQueue
from sluice.adapters.memory.payloads import MemoryPayloadObjects
from sluice.adapters.memory.store import MemoryStore
from sluice.core.clock import FakeClock
from sluice.core.errors import InvalidPayload
from sluice.core.limits import MaxReading
from sluice.core.model import Message, Outcome, Payload, PayloadState
from sluice.core.validation import validate_message
from sluice.enqueue import Item, enqueue
from sluice.features.pointers import (
    DEFAULT_THRESHOLD,
    POINTER_FIELD,
    Pointer,
    check_pointer,
    object_key,
    pointer_of,
    store,
)
from sluice.launch.launcher import Launcher
from sluice.launch.settings import Settings, pointer_threshold

BIG = {"id": "scene-42", "manifest": "x" * 600 * 1024}
BODY = json.dumps(BIG).encode()
SHA = hashlib.sha256(BODY).hexdigest()


def payload(body: str, key: str = "scene-42") -> Payload:
    return Payload(key=key, body=body, message=Message("m-1", "r-1", body, "g", 1, {}))


def spec(**changes) -> dict:
    fields = {"uri": f"s3://sluice-test-payloads/{object_key(SHA)}", "sha256": SHA, "size": len(BODY)}
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not ...}


# -- the format --------------------------------------------------------------------------------------


def test_store_keys_the_object_by_its_sha256_so_a_repeat_writes_the_same_object():
    objects = MemoryPayloadObjects()
    first, again = store(objects, BODY), store(objects, BODY)
    assert first == again == Pointer("sluice-test-payloads", f"payloads/{SHA}", SHA, len(BODY))
    assert list(objects.objects) == [f"payloads/{SHA}"]
    assert first.uri == f"s3://sluice-test-payloads/payloads/{SHA}"


def test_the_pointer_body_is_the_documented_shape_and_reads_back():
    pointer = store(MemoryPayloadObjects(), BODY)
    body = json.loads(pointer.body("scene-42"))
    assert body == {"id": "scene-42", POINTER_FIELD: {"uri": pointer.uri, "sha256": SHA, "size": len(BODY)}}
    assert pointer_of(body) == pointer
    assert json.loads(pointer.body()) == {POINTER_FIELD: body[POINTER_FIELD]}  # id is optional
    assert pointer_of({"id": "plain", "sluice": 1}) is None  # a plain payload


MALFORMED = [
    ({POINTER_FIELD: "s3://b/k"}, "must be an object with uri, sha256 and size"),
    ({POINTER_FIELD: spec(size=...)}, "lacks size"),
    ({POINTER_FIELD: spec(uri=..., sha256=...)}, "lacks uri, sha256"),
    ({POINTER_FIELD: {**spec(), "md5": "x"}}, "unknown field(s) 'md5'"),
    ({POINTER_FIELD: spec(), "tile": "T31"}, "no other field than 'id', found 'tile'"),
    ({POINTER_FIELD: spec(), "id": 7}, "'id' must be a non-empty string"),
    ({POINTER_FIELD: spec(uri="https://example.com/x")}, "uri must be a string s3://<bucket>/<key>"),
    ({POINTER_FIELD: spec(uri="s3://bucket-only")}, "is not s3://<bucket>/<key>"),
    ({POINTER_FIELD: spec(uri="s3://Not_A_Bucket/k")}, "is not s3://<bucket>/<key>"),
    ({POINTER_FIELD: spec(uri="s3://bkt/" + "k" * 1025)}, "longer than S3's 1,024 bytes"),
    ({POINTER_FIELD: spec(sha256=SHA.upper())}, "64 lowercase hexadecimal digits"),
    ({POINTER_FIELD: spec(sha256=SHA[:63])}, "64 lowercase hexadecimal digits"),
    ({POINTER_FIELD: spec(size=-1)}, "size must be a whole number of bytes"),
    ({POINTER_FIELD: spec(size="614400")}, "size must be a whole number of bytes"),
    ({POINTER_FIELD: spec(size=True)}, "size must be a whole number of bytes"),
    ({POINTER_FIELD: spec(size=1.5)}, "size must be a whole number of bytes"),
]


@pytest.mark.parametrize(("body", "reason"), MALFORMED, ids=[r for _, r in MALFORMED])
def test_a_malformed_pointer_is_refused_with_what_is_wrong(body, reason):
    with pytest.raises(InvalidPayload) as refused:
        pointer_of(body)
    assert refused.value.reason.startswith(f"malformed pointer ({POINTER_FIELD}): ")
    assert reason in refused.value.reason


# -- the checks --------------------------------------------------------------------------------------


@pytest.fixture
def objects():
    bucket = MemoryPayloadObjects()
    store(bucket, BODY)
    return bucket


def refusal(body: str, objects) -> str:
    with pytest.raises(InvalidPayload) as refused:
        check_pointer(payload(body), objects)
    assert refused.value.key == "scene-42"  # recorded on the payload
    return refused.value.reason


def test_a_good_pointer_passes_on_the_stored_checksum_without_reading_the_object(objects):
    pointer = store(objects, BODY)
    assert check_pointer(payload(pointer.body("scene-42")), objects) == pointer
    assert objects.reads == 0


def test_a_plain_payload_is_not_a_pointer():
    assert check_pointer(payload(json.dumps({"id": "p", "note": "sluice"})), None) is None


def test_a_field_name_spelled_with_escapes_is_still_a_pointer(objects):
    body = json.dumps({POINTER_FIELD: spec(size=1)}).replace(POINTER_FIELD, "\\u0073luicePayload")
    assert POINTER_FIELD not in body
    assert f"is {len(BODY):,} bytes; the pointer says 1" in refusal(body, objects)


def test_a_missing_object_is_bad_input(objects):
    body = json.dumps({POINTER_FIELD: spec(uri="s3://sluice-test-payloads/payloads/gone")})
    assert refusal(body, objects) == (
        "stored payload s3://sluice-test-payloads/payloads/gone does not exist (never stored, deleted, or expired)"
    )


def test_a_size_that_differs_is_bad_input(objects):
    assert refusal(json.dumps({POINTER_FIELD: spec(size=10)}), objects).endswith(
        f"is {len(BODY):,} bytes; the pointer says 10"
    )


def test_a_stored_checksum_that_differs_is_bad_input(objects):
    objects.put(object_key(SHA), b"y" * len(BODY), sha256="")
    reason = refusal(json.dumps({POINTER_FIELD: spec()}), objects)
    assert f"has SHA-256 {hashlib.sha256(b'y' * len(BODY)).hexdigest()}; the pointer says {SHA}" in reason
    assert objects.reads == 0


def test_an_object_without_a_stored_checksum_is_read_and_hashed(objects):
    objects.replace(object_key(SHA), BODY)
    assert check_pointer(payload(json.dumps({POINTER_FIELD: spec()})), objects) is not None
    objects.replace(object_key(SHA), b"z" * len(BODY))  # same size, other bytes
    assert "the object was changed after the pointer was made" in refusal(
        json.dumps({POINTER_FIELD: spec()}), objects
    )
    assert objects.reads == 2


def test_a_pointer_outside_the_stacks_bucket_or_without_one_is_bad_input(objects):
    elsewhere = json.dumps({POINTER_FIELD: spec(uri=f"s3://other-bucket/{object_key(SHA)}")})
    assert refusal(elsewhere, objects) == (
        "pointer names bucket 'other-bucket'; this stack reads stored payloads from 'sluice-test-payloads' only"
    )
    assert "this stack has no payload bucket (SLUICE_PAYLOAD_BUCKET)" in refusal(
        json.dumps({POINTER_FIELD: spec()}), None
    )


def test_the_threshold_setting_and_its_bounds():
    assert Settings.from_env({}).pointer_threshold == DEFAULT_THRESHOLD == 262_144 - 2_048
    assert Settings.from_env({"SLUICE_POINTER_THRESHOLD": "0"}).pointer_threshold == 0
    with pytest.raises(Exception, match=r"must be from 0 to 260,096"):
        pointer_threshold(str(DEFAULT_THRESHOLD + 1), source="SLUICE_POINTER_THRESHOLD")


# -- the producer and the launcher, in memory ----------------------------------------------------------


class Sqs:
    """What ``enqueue`` needs of an SQS client: SendMessageBatch, remembered."""

    def __init__(self) -> None:
        self.entries: list[dict] = []

    def send_message_batch(self, QueueUrl: str, Entries: list[dict]) -> dict:
        self.entries.extend(Entries)
        return {"Successful": [{"Id": e["Id"], "MessageId": f"m-{len(self.entries)}"} for e in Entries]}


def test_enqueue_stores_only_what_is_over_the_threshold():
    objects, sqs = MemoryPayloadObjects(), Sqs()
    small = {"id": "small", "n": 1}
    items = [Item("line 1", json.dumps(BIG)), Item("line 2", json.dumps(small))]
    report = enqueue(sqs, "queue", items, payloads=objects)
    assert report.failed == [] and report.stored == {"line 1": f"s3://sluice-test-payloads/payloads/{SHA}"}
    big_entry, small_entry = sqs.entries
    assert json.loads(big_entry["MessageBody"]) == {
        "id": "scene-42",
        POINTER_FIELD: {"uri": report.stored["line 1"], "sha256": SHA, "size": len(BODY)},
    }
    # The payload's own key and deduplication id, as if it had been sent whole.
    assert big_entry["MessageAttributes"]["sluice-key"]["StringValue"] == "scene-42"
    assert (
        big_entry["MessageDeduplicationId"]
        == hashlib.sha256(json.dumps(BIG, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    )
    assert json.loads(small_entry["MessageBody"]) == small
    # Threshold 0: every payload goes by pointer.
    assert len(enqueue(Sqs(), "queue", items, payloads=objects, threshold=0).stored) == 2


def test_enqueue_without_a_bucket_refuses_what_is_too_big_for_a_message():
    report = enqueue(Sqs(), "queue", [Item("line 1", json.dumps(BIG))])
    [(where, reason)] = report.failed
    assert where == "line 1" and "Step Functions accepts at most 262,144 bytes" in reason
    assert "SLUICE_PAYLOAD_BUCKET" in reason


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.queue = MemoryQueue(clock=self.clock)
        self.sfn = MemoryExecutions(clock=self.clock)
        self.store = MemoryStore()
        self.objects = MemoryPayloadObjects()
        self.launcher = Launcher(
            queue=self.queue,
            executions=self.sfn,
            store=self.store,
            max_source=self,
            clock=self.clock,
            settings=Settings(receive_wait_seconds=0),
            payloads=self.objects,
        )

    def reading(self) -> MaxReading:
        return MaxReading(5, 1.0)


def test_the_launcher_starts_a_good_pointer_and_dead_letters_a_bad_one_without_a_claim():
    w = World()
    good = store(w.objects, BODY)
    w.queue.send(good.body("scene-42"), attributes={"sluice-key": "scene-42"})
    w.queue.send(json.dumps({POINTER_FIELD: spec(size=1)}), attributes={"sluice-key": "bad-size"})
    summary = w.launcher.tick()
    assert (summary.n(Outcome.STARTED), summary.n(Outcome.INVALID)) == (1, 1)
    [name] = w.sfn.running
    assert json.loads(w.sfn.inputs[name]) == json.loads(good.body("scene-42"))  # the pointer is the input
    [(message, reason)] = w.queue.dead
    assert message.attributes["sluice-key"] == "bad-size" and "the pointer says 1" in reason
    record = w.store.payload("bad-size")
    assert record.state is PayloadState.INVALID and record.reason == reason and record.holder is None
    assert len(w.queue) == 0


def test_validation_and_the_pointer_check_agree_on_the_key():
    body = store(MemoryPayloadObjects(), BODY).body("scene-42")
    message = Message("m-1", "r-1", body, "g", 1, {})
    assert validate_message(message).key == "scene-42"  # the pointer's id, with no attribute
