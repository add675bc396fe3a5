"""The adapters behind the operator's commands (``sluice.ops``), each on moto with its real client:
what each call leaves in AWS, how many calls it makes, and the domain error a refusal becomes."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sluice.adapters.aws.cloudwatch import QueueMetrics, Window
from sluice.adapters.aws.deployment import Functions, StackNotFound, Stacks
from sluice.adapters.aws.sfn_tokens import SfnTokens
from sluice.adapters.aws.sqs_dead_letters import (
    MOVED_BY_SQS,
    NO_ROOM,
    DeadLetterQueue,
    Resend,
    dlq_message_of,
    redrive_dedup_id,
)
from sluice.adapters.aws.ssm import MaxParameter
from sluice.adapters.dynamo.codec import create_table
from sluice.adapters.dynamo.semaphore import DynamoSemaphoreStore
from sluice.adapters.dynamo.semaphore_catalogue import SemaphoreCatalogue
from sluice.core.clock import FakeClock
from sluice.core.errors import ConfigurationError, NotFound, TransientError
from sluice.features.lanes import LANE_ATTRIBUTE
from sluice.semaphore.step import Semaphores
from tests.support.aws import NO_RETRY, build_stack
from tests.support.cli import deploy
from tests.support.hooks import error_answer


def counted(session: Any, service: str) -> tuple[Any, Counter]:
    """A client of ``service`` and a count of the calls it makes, by operation."""
    client = session.client(service, config=NO_RETRY)
    calls: Counter = Counter()

    def hook(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    client.meta.events.register("before-call.*.*", hook)
    return client, calls


def refuse(client: Any, operation: str, code: str, status: int) -> None:
    client.meta.events.register(f"before-call.*.{operation}", lambda **_: error_answer(code, status))


# -- the dead-letter queue ------------------------------------------------------------------------------


@pytest.fixture
def queues(session):
    sqs = session.client("sqs")
    fifo = {"FifoQueue": "true", "ContentBasedDeduplication": "false"}
    dlq = sqs.create_queue(QueueName="dead.fifo", Attributes=fifo)["QueueUrl"]
    main = sqs.create_queue(QueueName="main.fifo", Attributes=fifo)["QueueUrl"]
    return sqs, dlq, main


def dead_letter(sqs: Any, url: str, i: int, **attributes: str) -> str:
    return sqs.send_message(
        QueueUrl=url,
        MessageBody=f'{{"id": "p-{i}"}}',
        MessageGroupId=f"g-{i}",
        MessageDeduplicationId=f"d-{i}",
        MessageAttributes={k: {"DataType": "String", "StringValue": v} for k, v in attributes.items()},
    )["MessageId"]


def receive_all(sqs: Any, url: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while got := sqs.receive_message(
        QueueUrl=url,
        MaxNumberOfMessages=10,
        VisibilityTimeout=600,
        MessageAttributeNames=["All"],
        MessageSystemAttributeNames=["All"],
    ).get("Messages", []):
        out.extend(got)
    return out


def test_a_redrive_of_25_messages_sends_and_deletes_in_batches_of_10(session, queues):
    sqs, dlq_url, main = queues
    ids = [
        dead_letter(sqs, dlq_url, i, **{"sluice-error": "boom", "sluice-key": f"p-{i}"}) for i in range(25)
    ]
    client, calls = counted(session, "sqs")
    dlq = DeadLetterQueue(client, dlq_url)
    looked = []
    while got := dlq.peek(10):
        looked.extend(got)
    assert sorted(m.message_id for m in looked) == sorted(ids)
    sent, refused = dlq.send_back(main, [Resend(m, "default") for m in looked])
    assert refused == [] and len(sent) == 25
    assert dlq.delete([r.message for r in sent]) == set(ids)
    assert calls["SendMessageBatch"] == 3 and calls["DeleteMessageBatch"] == 3
    back = receive_all(sqs, main)
    assert sorted(m["Body"] for m in back) == sorted(f'{{"id": "p-{i}"}}' for i in range(25))
    first = next(m for m in back if m["Body"] == '{"id": "p-0"}')
    assert first["Attributes"]["MessageDeduplicationId"] == redrive_dedup_id(ids[0])
    attributes = {k: v["StringValue"] for k, v in first["MessageAttributes"].items()}
    # The DLQ annotations are left behind; its origin names the message it came from.
    assert attributes == {"sluice-key": "p-0", "sluice-origin-message-id": ids[0]}
    assert receive_all(sqs, dlq_url) == []


def test_a_copy_sent_back_names_the_message_it_came_from(session, queues):
    """Its origin as it is (a bad one too: dead-lettered again), else the message Sluice
    dead-lettered, else its own id; a source SQS would refuse in a deduplication id is passed over;
    ``new_name`` sends none."""
    sqs, dlq_url, main = queues
    dead_letter(sqs, dlq_url, 0, **{"sluice-error": "boom", "sluice-source-message-id": "m-0"})
    dead_letter(sqs, dlq_url, 1, **{"sluice-origin-message-id": "o-1", "sluice-source-message-id": "m-1"})
    moved = dead_letter(sqs, dlq_url, 2, **{"sluice-source-message-id": "not ascii: é"})
    dead_letter(sqs, dlq_url, 3, **{"sluice-origin-message-id": "o-3"})
    dead_letter(sqs, dlq_url, 4, **{"sluice-origin-message-id": "not a valid dedup id"})  # kept: bad input
    dlq = DeadLetterQueue(session.client("sqs"), dlq_url)
    looked = sorted(dlq.peek(10), key=lambda m: m.body)
    sent, refused = dlq.send_back(
        main, [Resend(m, "default", new_name=m.body.endswith('3"}')) for m in looked]
    )
    assert refused == [] and len(sent) == 5
    origins = {
        m["Body"]: m.get("MessageAttributes", {}).get("sluice-origin-message-id", {}).get("StringValue")
        for m in receive_all(sqs, main)
    }
    assert origins == {
        '{"id": "p-0"}': "m-0",
        '{"id": "p-1"}': "o-1",
        '{"id": "p-2"}': moved,
        '{"id": "p-3"}': None,
        '{"id": "p-4"}': "not a valid dedup id",
    }


def test_a_copy_with_no_room_for_its_origin_stays_in_the_dlq_with_the_reason(session, queues):
    sqs, dlq_url, main = queues
    dead_letter(sqs, dlq_url, 0, **{f"a{j}": "x" for j in range(10)})
    dlq = DeadLetterQueue(session.client("sqs"), dlq_url)
    (m,) = dlq.peek(10)
    sent, refused = dlq.send_back(main, [Resend(m, "default")])
    assert sent == [] and [r.reason for r in refused] == [NO_ROOM]
    assert "--new-name" in NO_ROOM and receive_all(sqs, main) == []
    sent, refused = dlq.send_back(main, [Resend(m, "default", new_name=True)])
    assert refused == [] and len(sent) == 1 and len(receive_all(sqs, main)) == 1


def test_a_message_sent_back_to_a_lane_says_its_lane_again(session, queues):
    sqs, dlq_url, main = queues
    dead_letter(sqs, dlq_url, 0, **{LANE_ATTRIBUTE: "old"})
    dlq = DeadLetterQueue(session.client("sqs"), dlq_url)
    (m,) = dlq.peek(10)
    assert m.lane == "old" and m.reason == MOVED_BY_SQS
    sent, _ = dlq.send_back(main, [Resend(m, "gpu")])
    assert [r.lane for r in sent] == ["gpu"]
    (back,) = receive_all(sqs, main)
    assert back["MessageAttributes"][LANE_ATTRIBUTE]["StringValue"] == "gpu"


def test_counts_and_a_look_that_leaves_every_message_in_place(session, queues):
    sqs, dlq_url, _ = queues
    for i in range(12):
        dead_letter(sqs, dlq_url, i)
    client, calls = counted(session, "sqs")
    dlq = DeadLetterQueue(client, dlq_url)
    assert (dlq.counts().visible, dlq.counts().in_flight) == (12, 0)
    looked = dlq.peek(10) + dlq.peek(10)
    assert len(looked) == 12 and (dlq.counts().visible, dlq.counts().in_flight) == (0, 12)
    dlq.show_again(looked)
    assert calls["ChangeMessageVisibilityBatch"] == 2
    assert (dlq.counts().visible, dlq.counts().in_flight) == (12, 0)


def test_show_again_is_best_effort_and_refusals_become_domain_errors(session, queues):
    sqs, dlq_url, main = queues
    dead_letter(sqs, dlq_url, 0)
    client = session.client("sqs", config=NO_RETRY)
    dlq = DeadLetterQueue(client, dlq_url)
    looked = dlq.peek(10)
    refuse(client, "ChangeMessageVisibilityBatch", "ThrottlingException", 400)
    dlq.show_again(looked)  # no error: the message reappears after its visibility timeout anyway
    refuse(client, "SendMessageBatch", "ThrottlingException", 400)
    with pytest.raises(TransientError):
        dlq.send_back(main, [Resend(looked[0], "default")])
    refuse(client, "GetQueueAttributes", "AWS.SimpleQueueService.NonExistentQueue", 400)
    with pytest.raises(ConfigurationError):
        dlq.counts()


def test_a_dead_letter_names_the_queue_sqs_moved_it_from():
    raw = {
        "MessageId": "m",
        "ReceiptHandle": "r",
        "Body": "{}",
        "Attributes": {"DeadLetterQueueSourceArn": "arn:aws:sqs:us-east-1:123456789012:gpu.fifo"},
        "MessageAttributes": {"sluice-receive-count": {"DataType": "Number", "StringValue": "6"}},
    }
    m = dlq_message_of(raw)
    assert (m.source_queue, m.receive_count, m.reason) == ("gpu.fifo", 6, MOVED_BY_SQS)


# -- the MAX parameter -----------------------------------------------------------------------------------


def test_the_max_parameter_created_tagged_written_read_and_untagged(session):
    client, calls = counted(session, "ssm")
    parameter = MaxParameter(client, "/sluice/max")
    assert parameter.raw() is None, "missing: no value, no error"
    with pytest.raises(NotFound):
        parameter.reading()
    parameter.create(0, {"sluice:resume-max": "7", "sluice:paused-at": "2026-01-01T00:00:00Z"})
    assert parameter.raw() == "0" and parameter.reading().value == 0
    assert parameter.tags() == {"sluice:resume-max": "7", "sluice:paused-at": "2026-01-01T00:00:00Z"}
    parameter.write(7)
    parameter.untag(["sluice:resume-max", "sluice:paused-at"])
    reading = parameter.reading()
    assert (reading.value, reading.version) == (7, 2) and reading.changed_at > 0
    assert parameter.tags() == {}
    parameter.tag({"team": "ops"})
    assert parameter.tags() == {"team": "ops"}
    assert calls["PutParameter"] == 2 and calls["GetParameter"] == 5


def test_an_unusable_max_and_a_refusal_are_domain_errors(session):
    client = session.client("ssm", config=NO_RETRY)
    client.put_parameter(Name="/sluice/max", Value="lots", Type="String")
    parameter = MaxParameter(client, "/sluice/max")
    assert parameter.raw() == "lots"
    with pytest.raises(ConfigurationError, match="whole number"):
        parameter.reading()
    refuse(client, "ListTagsForResource", "ThrottlingException", 400)
    with pytest.raises(TransientError):
        parameter.tags()
    refuse(client, "PutParameter", "AccessDeniedException", 400)
    with pytest.raises(ConfigurationError):
        parameter.write(3)


# -- CloudWatch ------------------------------------------------------------------------------------------


def test_queue_metrics_are_the_maxima_of_the_window_oldest_first(session):
    client, calls = counted(session, "cloudwatch")
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    for minutes, value in ((3, 40.0), (3, 55.0), (1, 12.0)):
        client.put_metric_data(
            Namespace="AWS/SQS",
            MetricData=[
                {
                    "MetricName": "ApproximateAgeOfOldestMessage",
                    "Dimensions": [{"Name": "QueueName", "Value": "main.fifo"}],
                    "Timestamp": now - timedelta(minutes=minutes),
                    "Value": value,
                }
            ],
        )
    metrics = QueueMetrics(client)
    window = Window(now - timedelta(minutes=15), now + timedelta(minutes=1))
    points = metrics.maxima("main.fifo", "ApproximateAgeOfOldestMessage", window)
    assert [p.value for p in points] == [55.0, 12.0]
    assert points[0].at < points[1].at
    assert metrics.maxima("other.fifo", "ApproximateAgeOfOldestMessage", window) == []
    assert calls["GetMetricStatistics"] == 2
    refuse(client, "GetMetricStatistics", "AccessDenied", 403)
    with pytest.raises(ConfigurationError):
        metrics.maxima("main.fifo", "ApproximateAgeOfOldestMessage", window)


# -- the semaphores of the table -------------------------------------------------------------------------


@pytest.fixture
def catalogue(session):
    ddb = session.client("dynamodb", config=NO_RETRY)
    create_table(ddb, "sluice")
    store = DynamoSemaphoreStore(ddb, "sluice", sleep=lambda _: None)
    sems = Semaphores(store, SfnTokens(session.client("stepfunctions")), FakeClock())
    client, calls = counted(session, "dynamodb")
    return sems, SemaphoreCatalogue(client, "sluice"), calls


def test_the_catalogue_finds_every_semaphore_with_its_permits_and_line(catalogue):
    sems, found, calls = catalogue
    for name, limit in (("db", 2), ("api", 20), ("zero", 0)):
        sems.set_limit(name, limit)
    scan = found.scan(limit=100, max_pages=10)
    assert [(s.name, s.occupancy.limit, s.occupancy.running, s.line) for s in scan.semaphores] == [
        ("api", 20, 0, 0),
        ("db", 2, 0, 0),
        ("zero", 0, 0, 0),
    ]
    assert scan.pages == 1 and not scan.truncated
    assert scan.scanned_items >= 3
    assert calls["Scan"] == 1 and calls["BatchGetItem"] == 1


def test_the_catalogue_stops_at_its_bound_and_says_so(catalogue):
    sems, found, _ = catalogue
    for i in range(5):
        sems.set_limit(f"s{i}", 1)
    cut = found.scan(limit=2, max_pages=10)
    assert [s.name for s in cut.semaphores] == ["s0", "s1"] and cut.truncated
    assert found.scan(limit=0, max_pages=10).semaphores == ()


# -- the deployed stack ----------------------------------------------------------------------------------


def test_the_stacks_outputs_its_launchers_resource_and_configuration(session):
    stack = build_stack(session)
    deploy(stack, "sluice-qa", variables={"SLUICE_MAX_CONCURRENCY": "7"})
    stacks = Stacks(session.client("cloudformation"))
    outputs = stacks.outputs("sluice-qa")
    assert outputs["QueueUrl"] == stack.settings.queue_url
    assert stacks.physical_id("sluice-qa", "Marker") == "/sluice-qa/marker"
    assert stacks.physical_id("sluice-qa", "LauncherLambdaFunction") is None
    with pytest.raises(StackNotFound, match="sluice-nowhere"):
        stacks.outputs("sluice-nowhere")
    config = Functions(session.client("lambda")).configuration(outputs["LauncherLambdaFunctionQualifiedArn"])
    assert (config.name, config.timeout) == ("sluice-qa-launcher", 90)
    assert config.environment["SLUICE_MAX_CONCURRENCY"] == "7"


def test_a_missing_function_and_a_throttled_stack_are_domain_errors(session):
    functions = Functions(session.client("lambda", config=NO_RETRY))
    with pytest.raises(ConfigurationError, match="ResourceNotFoundException"):
        functions.configuration("sluice-nowhere-launcher")
    client = session.client("cloudformation", config=NO_RETRY)
    refuse(client, "DescribeStackResources", "Throttling", 400)
    with pytest.raises(TransientError):
        Stacks(client).physical_id("sluice-qa", "LauncherLambdaFunction")
