"""``sluice`` commands against a moto stack: enqueue, status, set-max, pause, resume, tick.

Resources are named by SLUICE_* variables here; test_cli_stack.py covers stack outputs.
"""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import pytest

from handlers import completion as completion_handler
from sluice.core.validation import content_hash
from sluice.ops import PAUSED_AT_TAG, RESUME_TAG
from tests.support.aws import LambdaContext
from tests.support.cli import parameter, parameter_tags, receive_all
from tests.support.hooks import error_answer


def payloads(n: int, prefix: str = "p") -> str:
    return "\n".join(json.dumps({"id": f"{prefix}-{i}", "n": i}) for i in range(n))


# -- enqueue -------------------------------------------------------------------------------------------


def test_enqueue_json_lines_sends_valid_lines_and_names_the_bad_ones(env, cli, tmp_path):
    lines = [
        json.dumps({"id": "scene-1", "tile": "T31"}),  # key from id
        json.dumps({"name": "by-field", "tile": "T32"}),  # key from --key-field
        "{not json",
        json.dumps({"tile": "T31", "n": 3}),  # no key: content hash
        json.dumps([1, 2]),
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")

    run = cli("enqueue", path, "--key-field", "name", "--group-by", "tile")

    assert run.code == 1  # some failed
    assert "line 3: not JSON" in run.err
    assert "line 5: payload must be a JSON object, got an array" in run.err
    assert run.out.strip() == "sent 3 of 5 payloads; 2 refused (see above)"
    sent = {m["Body"]: m for m in receive_all(env)}
    assert set(sent) == {lines[0], lines[1], lines[3]}
    first, second, third = sent[lines[0]], sent[lines[1]], sent[lines[3]]
    assert first["Body"] == lines[0]  # the body exactly as the producer wrote it
    assert first["MessageAttributes"]["sluice-key"]["StringValue"] == "scene-1"
    assert first["Attributes"]["MessageGroupId"] == "T31"
    assert first["Attributes"]["MessageDeduplicationId"] == content_hash(json.loads(lines[0]))
    assert second["MessageAttributes"]["sluice-key"]["StringValue"] == "by-field"
    assert second["Attributes"]["MessageGroupId"] == "T32"
    assert third["MessageAttributes"]["sluice-key"]["StringValue"] == content_hash(json.loads(lines[3]))


def test_enqueue_a_json_array_from_stdin_with_json_output(env, cli, monkeypatch):
    items = [{"id": f"a-{i}"} for i in range(25)] + [{"id": "a-0"}]  # the last repeats the first
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(items)))

    run = cli("enqueue", "-", "--json")

    assert run.code == 0
    data = run.json
    assert data["total"] == 26 and len(data["sent"]) == 26 and data["failed"] == []
    assert data["repeats"] == 1
    assert data["sent"][0] == {"where": "item 1", "key": "a-0", "message_id": data["sent"][0]["message_id"]}
    assert env.queue_counts() == (25, 0)  # SQS dropped the repeat: same deduplication id
    # The group defaults to the key: every payload its own group.
    assert {m["Attributes"]["MessageGroupId"] for m in receive_all(env)} == {f"a-{i}" for i in range(25)}


def test_enqueue_refuses_one_dedup_id_for_many_payloads(env, cli, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(payloads(3))

    run = cli("enqueue", path, "--dedup-id", "batch-7")

    assert run.code == 2
    assert "SQS would keep only the first" in run.err
    assert env.queue_counts() == (0, 0)

    path.write_text(payloads(1))
    assert cli("enqueue", path, "--dedup-id", "batch-7").code == 0
    assert receive_all(env)[0]["Attributes"]["MessageDeduplicationId"] == "batch-7"


def test_enqueue_stopped_by_aws_names_the_first_item_not_sent(env, cli, tmp_path):
    calls = []

    def throttle_after_ten(**_):
        calls.append(1)
        return error_answer("ThrottlingException", 400) if len(calls) > 10 else None

    env.session.events.register("before-call.sqs.SendMessageBatch", throttle_after_ten)
    path = tmp_path / "in.jsonl"
    path.write_text(payloads(130))

    run = cli("enqueue", path)

    assert run.code == 3
    assert "line 101 and after were not sent" in run.err and "ThrottlingException" in run.err
    assert run.out.strip() == "sent 100 of 130 payloads"
    assert env.queue_counts() == (100, 0)


@pytest.mark.parametrize("rich", [True, False], ids=["with-rich", "without-rich"])
def test_enqueue_on_a_terminal_works_with_or_without_the_progress_extra(
    env, cli, tmp_path, monkeypatch, rich
):
    """rich is the optional ``progress`` extra: without it a long enqueue on a terminal shows no bar."""
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    if not rich:
        monkeypatch.setitem(sys.modules, "rich.console", None)  # import fails as if not installed
        monkeypatch.setitem(sys.modules, "rich.progress", None)
    path = tmp_path / "in.jsonl"
    path.write_text(payloads(60))

    run = cli("enqueue", path)

    assert run.code == 0, run.err
    assert run.out.strip() == "sent 60 of 60 payloads"
    assert "Traceback" not in run.err
    assert env.queue_counts() == (60, 0)


def test_enqueue_of_a_missing_file_is_a_usage_error(env, cli, tmp_path):
    run = cli("enqueue", tmp_path / "nope.jsonl")
    assert run.code == 2
    assert "nope.jsonl" in run.err


# -- tick and status -----------------------------------------------------------------------------------


def test_tick_starts_executions_and_prints_the_summary(env, cli, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(payloads(7))
    cli("enqueue", path)

    run = cli("tick", "--json")

    assert run.code == 0
    summary = run.json
    assert summary["started"] == 5 and summary["max"] == 5 and summary["running"] == 5
    assert summary["stopped"] == "full" and summary["reconciled"] is True
    assert summary["settings_source"].startswith("no stack") and summary["time_limit"] == 120
    assert len(env.running()) == 5
    assert env.queue_counts() == (2, 0)

    human = cli("tick")
    assert human.code == 0
    assert "running 5 → 5, 0 free" in human.out
    assert "every slot is taken" in human.out
    assert len(env.running()) == 5  # a second tick starts nothing past MAX


def test_status_overview(env, cli, tmp_path):
    env.send("{broken")  # dead-lettered by the first tick, with its reason
    path = tmp_path / "in.jsonl"
    path.write_text(payloads(4))
    cli("enqueue", path)
    cli("set-max", 3)
    cli("tick")  # 3 start, 1 waits
    env.finish(env.running()[0])  # ended, but its event is lost: the ledger still holds it
    cli("tick")  # reconciliation sees the difference, but the holder is too young to judge: drift 0
    now = datetime.now(UTC)
    queue_name = env.settings.queue_url.rsplit("/", 1)[-1]
    env.client("cloudwatch").put_metric_data(
        Namespace="AWS/SQS",
        MetricData=[
            {
                "MetricName": "ApproximateAgeOfOldestMessage",
                "Dimensions": [{"Name": "QueueName", "Value": queue_name}],
                "Value": 754,
                "Timestamp": now,
            }
        ],
    )

    run = cli("status", "--json")

    assert run.code == 0
    data = run.json
    assert data["max"] == 3 and data["max_source"] == "parameter" and data["paused"] is False
    assert data["running"] == 3 and data["limit"] == 3 and data["free"] == 0
    assert data["sfn_running"] == 2 and data["ledger_not_running"] == 1 and data["running_not_in_ledger"] == 0
    assert data["queue_visible"] == 1 and data["queue_in_flight"] == 0
    assert data["dlq"] == 1
    assert data["oldest_message_age"] == 754
    assert data["oldest_message_age_source"].startswith("CloudWatch ApproximateAgeOfOldestMessage")
    # Drift counts only holders old enough for reconciliation to settle; status still shows the gap.
    assert data["drift"] == 0 and data["reconciled_at"] is not None

    human = cli("status")
    assert human.code == 0
    lines = dict(line.split(None, 1) for line in human.out.strip().splitlines())
    assert lines["MAX"].startswith("3  (parameter /sluice-test/max-concurrency)")
    assert lines["running"].startswith("3 holding slots of 3 (0 free); Step Functions lists 2 RUNNING")
    assert lines["queue"] == "1 waiting, 0 in flight, 0 delayed"
    assert lines["oldest"].startswith("12m34s")
    assert lines["DLQ"] == "1 message  → sluice dlq list"
    assert lines["drift"].startswith("0 at the last reconciliation, ")


def test_status_without_cloudwatch_data_says_the_age_is_unknown(env, cli):
    env.send({"id": "x"})
    data = cli("status", "--json").json
    assert data["oldest_message_age"] is None
    assert "no CloudWatch ApproximateAgeOfOldestMessage datapoint" in data["oldest_message_age_source"]
    env.client("sqs").purge_queue(QueueUrl=env.settings.queue_url)
    data = cli("status", "--json").json
    assert (data["oldest_message_age"], data["oldest_message_age_source"]) == (0, "queue empty")


def test_status_of_one_payload_shows_its_record_and_history(env, cli, monkeypatch):
    env.send({"id": "scene-9"}, group="g")
    cli("tick")
    (name,) = env.running()
    event = env.finish(name, "FAILED", error="States.TaskFailed")
    completion_handler.handler(event, LambdaContext())  # releases the slot as EventBridge would
    env.send({"id": "scene-9", "again": True}, group="g")  # a re-submission runs again
    cli("tick")

    run = cli("status", "scene-9", "--json")

    assert run.code == 0
    payload, runs = run.json["payload"], run.json["executions"]
    assert payload["key"] == "scene-9" and payload["state"] == "CLAIMED" and payload["attempts"] == 2
    assert [r["state"] for r in runs] == ["FAILED", "CLAIMED"]
    assert run.json["holder_status"] == "RUNNING"  # Step Functions' word on the run holding the lease
    assert "; Step Functions: RUNNING" in cli("status", "scene-9").out
    assert runs[0]["name"] == name and runs[0]["error"] == "States.TaskFailed"
    assert all(r["arn"].endswith(r["name"]) for r in runs)

    human = cli("status", "scene-9").out
    assert "state       CLAIMED  (lease held by" in human and "; Step Functions: RUNNING" in human
    assert f"  FAILED     {name}" in human
    assert "error: States.TaskFailed: States.TaskFailed cause" in human


def test_status_of_an_unknown_payload_exits_1(env, cli):
    run = cli("status", "never-sent")
    assert run.code == 1
    assert "no record for payload 'never-sent'" in run.err


# -- MAX: set-max, pause, resume ----------------------------------------------------------------------


def test_set_max_changes_the_parameter_and_the_next_tick_obeys(env, cli, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(payloads(6))
    cli("enqueue", path)

    run = cli("set-max", 2)

    assert run.code == 0
    assert parameter(env) == "2"
    assert run.out.splitlines()[0] == "MAX 5 → 2 on /sluice-test/max-concurrency."
    assert "In force now: the next start obeys it (2 slots for Sluice)." in run.out
    assert cli("tick", "--json").json["started"] == 2
    assert len(env.running()) == 2

    lowered = cli("set-max", 1)
    assert "2 are running, more than 1: no new start until none runs." in lowered.out
    assert cli("tick", "--json").json["started"] == 0


def test_set_max_is_in_force_for_a_completions_refill_before_any_tick(env, cli, tmp_path, monkeypatch):
    """The caps carry MAX: a lowered MAX binds the very next claim, also one made by a completion
    whose container would cache the old value for ten minutes."""
    monkeypatch.setenv("SLUICE_MAX_CACHE_SECONDS", "600")
    path = tmp_path / "in.jsonl"
    path.write_text(payloads(6))
    cli("enqueue", path)
    cli("set-max", 3)
    cli("tick")
    completion_handler.handler(env.finish(env.running()[0]), LambdaContext())  # warm, refills one
    assert len(env.running()) == 3

    run = cli("set-max", 2, "--json")
    assert (run.json["limit"], run.json["running"]) == (2, 3)
    for name in env.running()[:2]:
        completion_handler.handler(env.finish(name), LambdaContext())
    assert len(env.running()) == 2  # 3 → 1 running, refilled only up to 2
    assert cli("status", "--json").json["limit"] == 2


@pytest.mark.parametrize("bad", ["-1", "two", "1.5"])
def test_set_max_refuses_what_is_not_a_whole_number(env, cli, bad):
    run = cli("set-max", bad)
    assert run.code == 2
    assert "MAX must be" in run.err
    assert parameter(env) == "5"


def test_pause_remembers_max_and_resume_restores_it(env, cli, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(payloads(4))
    cli("enqueue", path)
    cli("set-max", 3)
    cli("tick")

    run = cli("pause")

    assert run.code == 0
    assert parameter(env) == "0"
    tags = parameter_tags(env)
    assert tags[RESUME_TAG] == "3" and PAUSED_AT_TAG in tags
    assert "paused: MAX 3 → 0" in run.out and "3 running executions finish normally" in run.out
    # Paused: a completion frees a slot but nothing refills it, and a tick starts nothing.
    event = env.finish(env.running()[0])
    completion_handler.handler(event, LambdaContext())
    assert cli("tick", "--json").json["stopped"] == "paused"
    assert len(env.running()) == 2 and env.queue_counts() == (1, 0)

    again = cli("pause", "--json")
    assert again.code == 0 and again.json["changed"] is False and again.json["remembered"] == 3
    assert parameter_tags(env)[RESUME_TAG] == "3"  # a second pause does not remember 0

    assert cli("status", "--json").json["resume_max"] == 3
    status = cli("status").out
    assert "0, PAUSED (sluice resume restores 3)" in status
    assert "2 holding slots (paused: a freed slot is not refilled)" in status

    resumed = cli("resume")
    assert resumed.code == 0
    assert parameter(env) == "3" and parameter_tags(env) == {}
    assert "resumed: MAX 0 → 3" in resumed.out and "remembered by `sluice pause`" in resumed.out
    assert cli("tick", "--json").json["started"] == 1


def test_resume_without_a_remembered_value_uses_the_deployed_default(env, cli):
    cli("set-max", 0)  # paused by other means: nothing remembered

    run = cli("resume", "--json")

    assert run.code == 0
    assert run.json["source"] == "deployed default" and run.json["max"] == 5
    assert parameter(env) == "5"


def test_resume_with_nothing_remembered_and_no_known_default_is_a_configuration_error(env, cli, monkeypatch):
    monkeypatch.delenv("SLUICE_MAX_CONCURRENCY")
    cli("set-max", 0)

    run = cli("resume")

    assert run.code == 2
    assert "nothing to resume to" in run.err and "sluice set-max N" in run.err
    assert parameter(env) == "0"


def test_resume_when_not_paused_changes_nothing(env, cli):
    run = cli("resume")
    assert run.code == 0 and run.out.strip() == "not paused: MAX is 5; nothing changed"
    assert parameter(env) == "5"


def test_set_max_above_zero_ends_a_pause(env, cli):
    cli("pause")
    run = cli("set-max", 8)
    assert parameter(env) == "8" and parameter_tags(env) == {}
    assert "ends the pause: the value it remembered (5) is dropped" in run.out
    assert cli("resume", "--json").json["changed"] is False


def test_pause_when_the_parameter_is_missing_creates_it_and_remembers_the_default(env, cli):
    env.client("ssm").delete_parameter(Name=env.settings.max_parameter)
    assert cli("status", "--json").json["max_source"] == "deployed default (parameter missing)"

    run = cli("pause", "--json")

    assert run.code == 0 and run.json["remembered"] == 5
    assert parameter(env) == "0" and parameter_tags(env)[RESUME_TAG] == "5"
    cli("resume")
    assert parameter(env) == "5"


def test_a_broken_max_parameter_shows_in_status_and_set_max_repairs_it(env, cli):
    env.client("ssm").put_parameter(Name=env.settings.max_parameter, Value="ten", Overwrite=True)

    status = cli("status")
    assert status.code == 0
    assert "INVALID" in status.out and "sluice set-max N" in status.out
    assert cli("tick").code == 2  # the launcher refuses to guess

    run = cli("set-max", 4)
    assert run.code == 0 and run.out.startswith("MAX ten → 4")
    assert cli("tick").code == 0


def test_the_json_flag_goes_before_or_after_the_command(env, cli):
    assert cli("--json", "status").json["max"] == 5
    assert cli("status", "--json").json["max"] == 5


def test_usage_errors_exit_2_and_help_exits_0(env, cli):
    assert cli().code == 2
    assert cli("frobnicate").code == 2
    assert cli("--help").code == 0
