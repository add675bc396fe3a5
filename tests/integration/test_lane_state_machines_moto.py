"""A lane with its own state machine (``laneStateMachines``), on moto with the real adapters: its
payloads start there, its ends (events, or reconciliation when an event is lost) free its slots, and
the other lanes keep the stack's workflow."""

from __future__ import annotations

import json

import pytest

from sluice.core.clock import FakeClock
from sluice.core.errors import ConfigurationError
from sluice.core.events import StatusChange
from sluice.core.model import Outcome, PayloadState
from sluice.features.lanes import parse_lane_state_machines, parse_lanes
from sluice.launch.settings import Settings
from tests.support.aws import build_stack
from tests.support.hooks import count_calls

LANES = "gpu:2:1,default:4"
ARN = "arn:aws:states:us-east-1:123456789012:stateMachine:other"


@pytest.fixture
def stack(session):
    return build_stack(session, clock=FakeClock(), max_concurrency=5, lanes=LANES, lane_machines=("gpu",))


def machine_of(stack, name: str) -> str:
    arn = stack.runtime().store().execution(name).arn
    return arn.split(":")[6]


def fill(stack, gpu: int, default: int) -> None:
    for lane, n in (("gpu", gpu), ("default", default)):
        for i in range(n):
            stack.send({"id": f"{lane}-{i}"}, group=f"{lane}-{i}", lane=lane)


def test_a_lanes_payloads_start_on_its_own_state_machine_the_others_on_the_stacks(stack):
    fill(stack, gpu=3, default=2)
    stack.launcher().tick()
    machines = sorted(machine_of(stack, name) for name in stack.running())
    assert machines == ["sluice-test-gpu-workflow"] * 2 + ["sluice-test-workflow"] * 2
    gpu_arn = stack.settings.lane_state_machines["gpu"]
    listed = stack.client("stepfunctions").list_executions(stateMachineArn=gpu_arn)["executions"]
    assert len(listed) == 2


def test_an_end_on_the_lanes_machine_frees_its_slots_and_refills(stack):
    fill(stack, gpu=3, default=0)
    launcher = stack.launcher()
    launcher.tick()
    first = sorted(stack.running())[0]
    released, refill, _ = launcher.on_status_change(StatusChange.from_event(stack.finish(first)))
    assert released and refill.lanes["gpu"]["started"] == 1
    assert stack.runtime().store().lane_rooms(["gpu"])["gpu"].running == 2


def test_reconciliation_lists_and_describes_every_machine(stack):
    fill(stack, gpu=2, default=1)
    launcher = stack.launcher()
    launcher.tick()
    gpu_run = next(n for n in stack.running() if machine_of(stack, n) == "sluice-test-gpu-workflow")
    stack.finish(gpu_run)  # its event is lost
    stack.clock.advance(120)  # past the consistency window
    rt = stack.runtime()
    calls = count_calls(rt.client("stepfunctions"))
    summary = rt.launcher().tick()
    assert summary.released_by_reconcile == 1 and summary.drift == 1
    assert gpu_run not in stack.runtime().store().ledger().holders
    assert calls["ListExecutions"] == 4  # per state machine: the RUNNING ones, the redriven ones
    assert calls["DescribeStateMachine"] == 2  # a new container checks every machine once


def described(rt) -> list[str]:
    """The execution ARNs DescribeExecution is asked about on ``rt``'s client, as sent."""
    asked: list[str] = []
    rt.client("stepfunctions").meta.events.register(
        "before-call.sfn.DescribeExecution",
        lambda params, **_: asked.append(json.loads(params.get("body") or b"{}").get("executionArn", "")),
    )
    return asked


@pytest.mark.parametrize("again", ["default", "gpu"])
def test_a_re_submission_in_any_lane_asks_about_its_holder_on_the_holders_machine(stack, again):
    """x ran on the gpu lane's machine and ended, its event late. x sent again, on either lane:
    the duplicate check asks Step Functions about the holder where it ran, finds it ended, settles
    it and starts the re-submission. Asked on the default lane's machine, it would find no such
    execution, take it as running, and drop the re-submission as a duplicate."""
    stack.send({"id": "x"}, group="g1", lane="gpu")
    stack.launcher().tick()
    (old,) = stack.running()
    stack.finish(old)  # its status event not delivered yet
    stack.clock.advance(5)
    stack.send({"id": "x", "v": 2}, group="g2", lane=again)
    rt = stack.runtime()
    asked = described(rt)
    summary = rt.launcher().tick()
    assert asked and all(":execution:sluice-test-gpu-workflow:" in arn for arn in asked), asked
    assert summary.n(Outcome.DUPLICATE) == 0 and summary.n(Outcome.STARTED) == 1
    (new,) = stack.running()
    assert new != old and stack.queue_counts() == (0, 0)
    assert rt.store().execution(old).state is PayloadState.SUCCEEDED


def test_the_setting_names_configured_lanes_and_state_machine_arns():
    lanes = parse_lanes(LANES, 5)
    assert parse_lane_state_machines(f"gpu={ARN}", lanes) == {"gpu": ARN}
    assert parse_lane_state_machines("", lanes) == {}
    for text, words in (
        (f"cpu={ARN}", "'cpu' is not a lane; the lanes are default, gpu"),
        ("gpu=arn:aws:sqs:us-east-1:123456789012:q", "is not a state machine ARN"),
        ("gpu", "use lane=state-machine-arn"),
        (f"gpu={ARN},gpu={ARN}", "lane 'gpu' is given twice"),
    ):
        with pytest.raises(ConfigurationError, match=words):
            parse_lane_state_machines(text, lanes)


def test_settings_read_the_lanes_state_machines(monkeypatch):
    monkeypatch.setenv("SLUICE_LANES", LANES)
    monkeypatch.setenv("SLUICE_LANE_QUEUES", "gpu=https://q/gpu")
    monkeypatch.setenv("SLUICE_LANE_STATE_MACHINES", f"gpu={ARN}")
    assert Settings.from_env().lane_state_machines == {"gpu": ARN}
