"""The Lambda entry points, called with the event shapes AWS documents."""

from __future__ import annotations

import json
import logging

import pytest

from handlers import _shared
from handlers import completion as completion_handler
from handlers import launcher as launcher_handler
from tests.support.aws import (
    LambdaContext,
    build_stack,
    functions_environment,
    scheduled_event,
    status_change_event,
)
from tests.support.hooks import count_calls


def functions_env(stack, monkeypatch, **extra: str) -> None:
    """The environment the deployed functions have, pointing at the moto stack."""
    for name, value in functions_environment(stack, **extra).items():
        monkeypatch.setenv(name, value)
    _shared.reset()


@pytest.fixture
def deployed(stack, monkeypatch):
    functions_env(stack, monkeypatch)
    yield stack
    _shared.reset()


def emf_metrics(output: str) -> dict[str, float]:
    """The metrics Powertools printed as CloudWatch embedded metric format."""
    values: dict[str, float] = {}
    for line in output.splitlines():
        if '"_aws"' not in line:
            continue
        blob = json.loads(line)
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            assert directive["Dimensions"] == [["service"]]
            for metric in directive["Metrics"]:
                value = blob[metric["Name"]]
                values[metric["Name"]] = sum(value) if isinstance(value, list) else value
    return values


def test_scheduled_tick_starts_payloads_and_emits_metrics(deployed, capsys):
    deployed.send("[]", group="bad")
    for i in range(7):
        deployed.send({"id": f"p{i}"}, group=f"p{i}")
    result = launcher_handler.handler(scheduled_event(), LambdaContext())
    assert (result["started"], result["invalid"], result["running"], result["max"]) == (5, 1, 5, 5)
    assert len(deployed.running()) == 5
    metrics = emf_metrics(capsys.readouterr().out)
    assert metrics["Started"] == 5 and metrics["Invalid"] == 1 and metrics["FreeSlots"] == 0
    assert metrics["Running"] == 5 and metrics["Max"] == 5 and metrics["LedgerDrift"] == 0


def test_completion_releases_and_refills_at_once(deployed, capsys):
    for i in range(6):
        deployed.send({"id": f"p{i}"}, group=f"p{i}")
    launcher_handler.handler(scheduled_event(), LambdaContext())
    ssm = count_calls(_shared.runtime().client("ssm"))
    name = deployed.running()[0]
    event = deployed.finish(name, "FAILED", error="States.TaskFailed")
    result = completion_handler.handler(event, LambdaContext(function_name="sluice-dev-completion"))
    assert result["released"] is True and result["admission"]["started"] == 1
    assert sum(ssm.values()) == 0  # the refill obeys the caps: no MAX read on the completion path
    assert emf_metrics(capsys.readouterr().out)["Released"] == 1
    assert len(deployed.running()) == 5 and deployed.queue_counts() == (0, 0)
    store = deployed.runtime().store()
    record = store.execution(name)
    assert (record.state.value, record.error) == ("FAILED", "States.TaskFailed")
    assert store.payload(record.key).holder is None
    # The same event again: nothing more is freed, nothing more starts.
    again = completion_handler.handler(event, LambdaContext())
    assert again == {"execution": name, "status": "FAILED", "released": False}
    assert len(store.ledger().holders) == 5


def test_a_completion_that_reads_no_count_emits_none(deployed, capsys):
    """The hand-over reads the ended run's record and the pool item, not the slots: with nothing to
    hand over (an empty queue) the completion knows no running count, and says so rather than 0."""
    for i in range(3):
        deployed.send({"id": f"p{i}"}, group=f"p{i}")
    launcher_handler.handler(scheduled_event(), LambdaContext())
    capsys.readouterr()
    event = deployed.finish(deployed.running()[0], "SUCCEEDED")
    result = completion_handler.handler(event, LambdaContext(function_name="sluice-dev-completion"))
    assert result["released"] is True and result["admission"]["received"] == 0
    assert (result["admission"]["running"], result["admission"]["free_slots"]) == (None, None)
    metrics = emf_metrics(capsys.readouterr().out)
    assert metrics["Released"] == 1 and "Running" not in metrics and "FreeSlots" not in metrics
    assert len(deployed.running()) == 2 and len(deployed.runtime().store().ledger().holders) == 2


def shipped(caplog) -> list[logging.LogRecord]:
    """The lines the functions logged at INFO or above (what CloudWatch Logs ingests and bills), and
    forgets them."""
    records = [r for r in caplog.records if r.levelno >= logging.INFO]
    caplog.clear()
    return records


def test_a_routine_hand_over_logs_its_release_and_its_start_and_no_summary(deployed, caplog):
    """Logs are billed per byte (docs/benchmarks.md): a completion that started every message it
    received logs the release and the start, each keyed by ``correlation_id``, and its summary only
    at DEBUG; one that received a message it did not start logs the summary too."""
    for i in range(6):
        deployed.send({"id": f"p{i}"}, group=f"p{i}")
    launcher_handler.handler(scheduled_event(), LambdaContext())
    assert [r.getMessage() for r in shipped(caplog)].count("admission finished") == 1  # a tick's
    ended = deployed.running()[0]
    completion_handler.handler(deployed.finish(ended, "SUCCEEDED"), LambdaContext())
    lines = shipped(caplog)
    assert [r.getMessage() for r in lines] == ["slot released", "execution started"]
    assert [r.correlation_id for r in lines] == [ended.split("-")[0], "p5"]  # the payload keys
    assert not any(hasattr(r, "payload_key") for r in lines)

    deployed.send("[]", group="bad")
    completion_handler.handler(deployed.finish(deployed.running()[0], "SUCCEEDED"), LambdaContext())
    (summary,) = [r.summary for r in shipped(caplog) if r.getMessage() == "admission finished"]
    assert (summary["received"], summary["invalid"]) == (1, 1)


def test_events_that_are_not_ours_change_nothing(deployed):
    deployed.send({"id": "p"})
    launcher_handler.handler(scheduled_event(), LambdaContext())
    (name,) = deployed.running()
    other = status_change_event(
        "arn:aws:states:us-east-1:123456789012:stateMachine:someone-else", name, "SUCCEEDED"
    )
    running = status_change_event(deployed.settings.state_machine_arn, name, "RUNNING")
    unknown = status_change_event(deployed.settings.state_machine_arn, "started-by-hand", "SUCCEEDED")
    for event in (other, running, unknown):
        assert completion_handler.handler(event, LambdaContext())["released"] is False
    assert deployed.runtime().store().ledger().holders == {name}


def test_missing_configuration_fails_before_touching_anything(deployed, monkeypatch):
    deployed.send({"id": "p"})
    monkeypatch.delenv("SLUICE_TABLE_NAME")
    monkeypatch.delenv("SLUICE_DLQ_URL")
    _shared.reset()
    with pytest.raises(Exception, match="missing setting\\(s\\): SLUICE_DLQ_URL, SLUICE_TABLE_NAME"):
        launcher_handler.handler(scheduled_event(), LambdaContext())
    assert deployed.queue_counts() == (1, 0)


@pytest.fixture
def lanes_deployed(session, monkeypatch):
    """The functions' environment on a stack with the lanes gpu (priority 1) and default."""
    stack = build_stack(session, name="sluice-lanes", max_concurrency=5, lanes="gpu:2:1,default:5")
    functions_env(
        stack,
        monkeypatch,
        SLUICE_LANES="gpu:2:1,default:5",
        SLUICE_LANE_QUEUES=f"gpu={stack.settings.lane_queue_urls['gpu']}",
    )
    yield stack
    _shared.reset()


def lane_metrics(output: str) -> dict[tuple[str, str], float]:
    """The metrics printed with the dimension ``lane``: (metric, lane) → value."""
    values: dict[tuple[str, str], float] = {}
    for line in output.splitlines():
        if '"_aws"' not in line or '"lane"' not in line:
            continue
        blob = json.loads(line)
        for directive in blob["_aws"]["CloudWatchMetrics"]:
            assert sorted(directive["Dimensions"][0]) == ["lane", "service"]
            for metric in directive["Metrics"]:
                value = blob[metric["Name"]]
                values[(metric["Name"], blob["lane"])] = sum(value) if isinstance(value, list) else value
    return values


def test_a_tick_with_lanes_emits_each_lanes_starts_running_and_max(lanes_deployed, capsys):
    for i in range(4):
        lanes_deployed.send({"id": f"g{i}"}, group=f"g{i}", lane="gpu")
        lanes_deployed.send({"id": f"d{i}"}, group=f"d{i}")
    result = launcher_handler.handler(scheduled_event(), LambdaContext())
    assert result["started"] == 5 and result["lanes"]["gpu"]["started"] == 2
    metrics = lane_metrics(capsys.readouterr().out)
    assert metrics[("LaneStarted", "gpu")] == 2 and metrics[("LaneStarted", "default")] == 3
    assert metrics[("LaneRunning", "gpu")] == 2 and metrics[("LaneMax", "gpu")] == 2
    assert metrics[("LaneMax", "default")] == 5


def test_a_completion_with_lanes_gives_the_slot_to_the_priority_lane(lanes_deployed, capsys):
    for i in range(3):
        lanes_deployed.send({"id": f"g{i}"}, group=f"g{i}", lane="gpu")
    for i in range(4):
        lanes_deployed.send({"id": f"d{i}"}, group=f"d{i}")
    launcher_handler.handler(scheduled_event(), LambdaContext())
    store = _shared.runtime().store()
    gpu_run = next(n for n in lanes_deployed.running() if store.execution(n).lane == "gpu")
    event = lanes_deployed.finish(gpu_run, "SUCCEEDED")
    result = completion_handler.handler(event, LambdaContext())
    assert result["released"] and result["admission"]["lanes"]["gpu"]["started"] == 1
    gpu = [n for n in lanes_deployed.running() if store.execution(n).lane == "gpu"]
    assert len(gpu) == 2 and len(lanes_deployed.running()) == 5
