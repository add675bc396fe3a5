"""``sluice`` on a stack with lanes, on moto: the lanes found from the stack (the launcher's
SLUICE_LANES, the output LaneQueueUrls) or SLUICE_* variables; enqueue to a lane; a lane's MAX,
pause and resume in force at once; lanes in status; a lane's dead letters redriven to its queue."""

from __future__ import annotations

import json

import pytest

from handlers import _shared
from sluice.adapters.aws.sqs_dead_letters import DlqMessage, dlq_message_of
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.features.lanes import LANE_ATTRIBUTE
from sluice.launch.settings import DuplicatePolicy
from sluice.ops.dlq import redrive_lane
from tests.support.aws import build_stack
from tests.support.cli import clear_sluice_env, lane_queues, receive_all, sluice, use_env
from tests.support.cli import deploy as shared_deploy

LANES = "gpu:2:1,backfill:8:0:3,default:10"
NAMES = ["gpu", "backfill", "default"]
STACK = "sluice-qa"


@pytest.fixture
def stack(session):
    return build_stack(session, max_concurrency=5, lanes=LANES)


def deploy(stack, *, lanes: bool = True) -> None:
    """The stack deployed with its lanes (LaneQueueUrls among its outputs, SLUICE_LANES in its
    launcher's environment), or without."""
    shared_deploy(stack, STACK, lanes=LANES if lanes else "", variables={"SLUICE_MAX_CONCURRENCY": "5"})


@pytest.fixture
def deployed(stack, monkeypatch):
    clear_sluice_env(monkeypatch)
    _shared.reset()
    deploy(stack)
    yield stack
    _shared.reset()


@pytest.fixture
def cli(deployed, capsys):
    return lambda *argv: sluice(capsys, "--stage", "qa", *argv, session=deployed.session)


def url(stack, lane: str) -> str:
    return stack.settings.lane_queue_url(lane)


def counts(stack) -> dict[str, tuple[int, int]]:
    return {lane: stack.queue_counts(url(stack, lane)) for lane in NAMES}


def lane_of(stack, name: str) -> str | None:
    return stack.runtime().store().execution(name).lane


def running_by_lane(stack) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in stack.running():
        lane = lane_of(stack, name) or "?"
        out[lane] = out.get(lane, 0) + 1
    return out


def limits(stack) -> dict[str, int]:
    rooms = stack.runtime().store().lane_rooms(NAMES)
    return {lane: room.limit for lane, room in rooms.items()}


def fill(stack, **per_lane: int) -> None:
    for lane, n in per_lane.items():
        for i in range(n):
            stack.send({"id": f"{lane}-{i}"}, group=f"{lane}-{i}", lane=lane)


def end(stack, launcher, name: str):
    return launcher.on_status_change(StatusChange.from_event(stack.finish(name)))


def jsonl(tmp_path, *ids: str, name: str = "in.jsonl"):
    path = tmp_path / name
    path.write_text("\n".join(json.dumps({"id": i}) for i in ids))
    return path


# -- enqueue --lane ---------------------------------------------------------------------------------


def test_enqueue_to_a_fair_lane_sends_each_tenant_in_its_group(session, monkeypatch, capsys, tmp_path):
    """The lanes read from the deployed launcher: to fair lane ``shared``, each tenant's messages go
    in the tenant's group (its concurrency key; without one, ``lane:shared``); to an ordinary lane,
    each payload in its own group, keyed or not."""
    lanes = "shared:4:0:1:fair,default:4"
    stack = build_stack(session, max_concurrency=5, lanes=lanes)
    clear_sluice_env(monkeypatch)
    _shared.reset()
    shared_deploy(stack, STACK, lanes=lanes, variables={"SLUICE_MAX_CONCURRENCY": "5"})
    try:
        for ids, lane, key in (
            (("a1", "a2"), "shared", "acme"),
            (("u1",), "shared", None),
            (("d1",), "default", "acme"),
        ):
            extra = ("--concurrency-key", key) if key else ()
            run = sluice(
                capsys,
                "--stage",
                "qa",
                "enqueue",
                jsonl(tmp_path, *ids),
                "--lane",
                lane,
                *extra,
                session=stack.session,
            )
            assert run.code == 0, run.err
        shared = receive_all(stack, url(stack, "shared"))
        assert sorted(m["Attributes"]["MessageGroupId"] for m in shared) == ["acme", "acme", "lane:shared"]
        (default,) = receive_all(stack, stack.settings.queue_url)
        assert default["Attributes"]["MessageGroupId"] == "d1"
    finally:
        _shared.reset()


def test_enqueue_to_a_lane_lands_in_its_queue_and_the_tick_starts_it_there(deployed, cli, tmp_path):
    run = cli("enqueue", jsonl(tmp_path, "render-1", "render-2"), "--lane", "gpu")

    assert run.code == 0, run.err
    assert run.out.strip() == "sent 2 of 2 payloads to lane gpu"
    assert counts(deployed) == {"gpu": (2, 0), "backfill": (0, 0), "default": (0, 0)}
    sent = receive_all(deployed, url(deployed, "gpu"))
    assert {m["MessageAttributes"][LANE_ATTRIBUTE]["StringValue"] for m in sent} == {"gpu"}
    for m in sent:  # back on the queue for the tick
        deployed.client("sqs").change_message_visibility(
            QueueUrl=url(deployed, "gpu"), ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
        )

    tick = cli("tick", "--json")  # with the launcher's SLUICE_LANES, as the deployed launcher runs

    assert tick.code == 0, tick.err
    assert tick.json["started"] == 2
    assert tick.json["lanes"]["gpu"] == {"received": 2, "started": 2, "running": 2, "limit": 2}
    assert running_by_lane(deployed) == {"gpu": 2}


def test_enqueue_to_the_default_lane_is_the_stacks_queue_as_before(deployed, cli, tmp_path):
    run = cli("enqueue", jsonl(tmp_path, "a"), "--json")
    assert run.code == 0 and "lane" not in run.json
    assert counts(deployed) == {"gpu": (0, 0), "backfill": (0, 0), "default": (1, 0)}
    (m,) = receive_all(deployed)
    assert LANE_ATTRIBUTE not in m.get("MessageAttributes", {})


def test_enqueue_to_a_lane_keeps_every_other_option(deployed, cli, tmp_path, monkeypatch):
    bucket = "sluice-qa-payloads"
    deployed.client("s3").create_bucket(Bucket=bucket)
    monkeypatch.setenv("SLUICE_PAYLOAD_BUCKET", bucket)
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"t-{i}", "tenant": "acme"}) for i in range(3)))

    run = cli(
        "enqueue",
        path,
        "--lane",
        "backfill",
        "--after",
        "extract-1",
        "--concurrency-key-field",
        "tenant",
        "--once",
        "--pointer-threshold",
        "0",
        "--json",
    )

    assert run.code == 0, run.err
    assert run.json["lane"] == "backfill" and len(run.json["sent"]) == 3
    assert all(s["stored"].startswith(f"s3://{bucket}/") for s in run.json["sent"])
    sent = receive_all(deployed, url(deployed, "backfill"))
    assert len(sent) == 3 and counts(deployed)["default"] == (0, 0)
    attributes = {k: v["StringValue"] for k, v in sent[0]["MessageAttributes"].items()}
    assert attributes[LANE_ATTRIBUTE] == "backfill"
    assert attributes["sluice-awaits"] == '["extract-1"]'
    assert attributes["sluice-concurrency-key"] == "acme"
    assert attributes["sluice-once"] == "true"


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("enqueue", "IN", "--lane", "gpux"), "no lane 'gpux': the lanes are gpu, backfill, default"),
        (("set-max", "3", "--lane", "gpux"), "no lane 'gpux': the lanes are gpu, backfill, default"),
        (("pause", "--lane", "gpux"), "no lane 'gpux': the lanes are gpu, backfill, default"),
        (("resume", "--lane", "gpux"), "no lane 'gpux': the lanes are gpu, backfill, default"),
        (("set-max", "3", "--lane", "gpu", "--key", "acme"), "not allowed with argument"),
        (
            ("dlq", "redrive", "--all", "--lane", "gpux"),
            "no lane 'gpux': the lanes are gpu, backfill, default",
        ),
    ],
)
def test_an_unknown_lane_is_a_configuration_error_and_changes_nothing(deployed, cli, tmp_path, argv, words):
    path = jsonl(tmp_path, "a")
    run = cli(*(str(path) if a == "IN" else a for a in argv))

    assert run.code == 2
    assert words in run.err
    assert counts(deployed) == {"gpu": (0, 0), "backfill": (0, 0), "default": (0, 0)}
    assert deployed.runtime().store().lane_settings(NAMES) == {}
    assert not any(room.exists for room in deployed.runtime().store().lane_rooms(NAMES).values())


def test_a_lane_on_a_stack_without_lanes_is_refused(session, monkeypatch, capsys, tmp_path):
    clear_sluice_env(monkeypatch)
    plain = build_stack(session, name="plain")
    deploy(plain, lanes=False)

    def cli(*argv):
        return sluice(capsys, "--stage", "qa", *argv, session=session)

    run = cli("set-max", "3", "--lane", "gpu")
    assert run.code == 2
    assert (
        "no lane 'gpu': this stack has no lanes (no SLUICE_LANES in launcher function sluice-qa-launcher)"
        in run.err
    )
    run = cli("enqueue", jsonl(tmp_path, "a"), "--lane", "gpu")
    assert run.code == 2 and "no lane 'gpu': this stack has no lanes, only 'default'" in run.err
    assert plain.queue_counts() == (0, 0)
    run = cli("set-max", "default")
    assert run.code == 2 and "N 'default' is for a concurrency key (--key KEY) or a lane" in run.err


# -- set-max, pause, resume --lane ------------------------------------------------------------------


def test_set_max_on_a_lane_moves_its_caps_at_once_and_the_next_tick_obeys(deployed, cli):
    fill(deployed, gpu=6)

    run = cli("set-max", "1", "--lane", "gpu")

    assert run.code == 0, run.err
    assert run.out.splitlines()[0] == "lane gpu: MAX 2 (configured) → MAX 1 (set at run time; configured 2)."
    assert limits(deployed)["gpu"] == 1, "in force before any tick"
    deployed.launcher().tick()
    assert running_by_lane(deployed) == {"gpu": 1}

    raised = cli("set-max", "4", "--lane", "gpu", "--json")
    assert raised.json["after"]["limit"] == 4 and raised.json["after"]["max"] == 4
    deployed.launcher().tick()
    assert running_by_lane(deployed) == {"gpu": 4}

    back = cli("set-max", "default", "--lane", "gpu")
    assert back.out.splitlines()[0] == "lane gpu: MAX 4 (set at run time; configured 2) → MAX 2 (configured)."
    assert "4 are running in lane gpu, more than 2: no new start there until fewer than 2 run." in back.out
    assert limits(deployed)["gpu"] == 2
    deployed.launcher().tick()
    assert running_by_lane(deployed) == {"gpu": 4}, "nothing running is stopped, nothing more starts"


def test_a_raised_lane_max_is_in_force_for_a_completions_refill_before_any_tick(deployed, cli):
    fill(deployed, gpu=5, backfill=5)
    launcher = deployed.launcher()
    launcher.tick()
    assert running_by_lane(deployed) == {"gpu": 2, "backfill": 3}

    assert cli("set-max", "3", "--lane", "gpu").code == 0
    backfill_run = next(n for n in deployed.running() if lane_of(deployed, n) == "backfill")
    _, refill, _ = end(deployed, launcher, backfill_run)

    # gpu has priority, and room now: the freed slot goes there, not back to backfill.
    assert refill.lanes["gpu"]["started"] == 1
    assert running_by_lane(deployed) == {"gpu": 3, "backfill": 2}


def test_pause_and_resume_a_lane_while_the_others_go_on(deployed, cli):
    fill(deployed, gpu=3, backfill=3, default=3)
    assert cli("set-max", "2", "--lane", "backfill").code == 0

    run = cli("pause", "--lane", "backfill")

    assert run.code == 0, run.err
    assert run.out.splitlines()[0] == (
        "lane backfill: paused: PAUSED (MAX 2 on resume; set at run time; configured 8)."
    )
    assert limits(deployed)["backfill"] == 0
    summary = deployed.launcher().tick()
    assert summary.n(Outcome.STARTED) == 5
    assert running_by_lane(deployed) == {"gpu": 2, "default": 3}, "the paused lane starts nothing"
    again = cli("pause", "--lane", "backfill")
    assert "already paused" in again.out and "nothing changed" in again.out

    for name in deployed.running():  # room for everyone
        end(deployed, deployed.launcher(), name)
    resumed = cli("resume", "--lane", "backfill", "--json")
    assert resumed.json["after"]["paused"] is False and resumed.json["after"]["max"] == 2, "MAX kept"
    assert limits(deployed)["backfill"] == 2
    deployed.launcher().tick()
    assert running_by_lane(deployed)["backfill"] == 2


def test_lanes_from_shell_variables_without_a_stack(stack, monkeypatch, capsys):
    use_env(monkeypatch, stack, SLUICE_LANES=LANES, SLUICE_LANE_QUEUES=lane_queues(stack))
    run = sluice(capsys, "set-max", "1", "--lane", "gpu", session=stack.session)
    assert run.code == 0, run.err
    assert limits(stack)["gpu"] == 1
    fill(stack, gpu=3)
    stack.launcher().tick()
    assert running_by_lane(stack) == {"gpu": 1}


# -- status ---------------------------------------------------------------------------------------------


def test_status_shows_each_lane(deployed, cli):
    fill(deployed, gpu=5, backfill=4)
    deployed.launcher().tick()  # gpu 2, backfill 3
    cli("set-max", "3", "--lane", "backfill")
    cli("pause", "--lane", "default")

    data = cli("status", "--json").json

    lanes = {lane["lane"]: lane for lane in data["lanes"]}
    assert [lane["lane"] for lane in data["lanes"]] == NAMES
    gpu, backfill, default = lanes["gpu"], lanes["backfill"], lanes["default"]
    assert (gpu["priority"], gpu["weight"], gpu["configured_max"], gpu["max"]) == (1, 1, 2, None)
    assert (gpu["limit"], gpu["running"], gpu["waiting"]) == (2, 2, 3)
    assert (backfill["weight"], backfill["max"], backfill["limit"], backfill["running"]) == (3, 3, 3, 3)
    assert backfill["waiting"] == 1
    assert default["paused"] is True and default["limit"] == 0

    human = cli("status").out
    rows = [line.split(None, 1)[1] for line in human.splitlines() if line.startswith("lane ")]
    assert rows == [
        "gpu  MAX 2 (configured), priority 1, weight 1: 2 running of 2 (0 free), 3 waiting, 0 in flight",
        "backfill  MAX 3 (set at run time; configured 8), priority 0, weight 3: 3 running of 3 (0 free), "
        "1 waiting, 0 in flight",
        "default  PAUSED (MAX 10 on resume; configured), priority 0, weight 1: 0 running of 0 (0 free), "
        "0 waiting, 0 in flight",
    ]
    assert "0 waiting, 0 in flight, 0 delayed  (lane default)" in human


def test_status_without_lanes_has_no_lane_rows(session, monkeypatch, capsys):
    plain = build_stack(session, name="plain")
    use_env(monkeypatch, plain)
    data = sluice(capsys, "status", "--json", session=session).json
    assert "lanes" not in data
    assert "lane " not in sluice(capsys, "status", session=session).out


def test_status_of_a_payload_names_its_executions_lane(deployed, cli):
    fill(deployed, gpu=1)
    deployed.launcher().tick()

    run = cli("status", "gpu-0", "--json")

    assert run.code == 0, run.err
    assert [r["lane"] for r in run.json["executions"]] == ["gpu"]
    assert ", lane gpu" in cli("status", "gpu-0").out


# -- dlq redrive ------------------------------------------------------------------------------------


def test_redrive_sends_a_lanes_dead_letters_back_to_its_queue(deployed, cli, tmp_path):
    sqs = deployed.client("sqs")
    # Sluice dead-letters an invalid gpu payload: the copy says its lane.
    deployed.send(json.dumps([1, 2, 3]), group="bad", lane="gpu")
    deployed.launcher().tick()
    # SQS moves a backfill message after maxReceiveCount receives: the attribute enqueue set says its lane.
    cli("enqueue", jsonl(tmp_path, "scene-7"), "--lane", "backfill")
    for _ in range(6):
        sqs.receive_message(QueueUrl=url(deployed, "backfill"), MaxNumberOfMessages=10, VisibilityTimeout=0)
    assert deployed.queue_counts(deployed.settings.dlq_url) == (2, 0)
    assert counts(deployed) == {"gpu": (0, 0), "backfill": (0, 0), "default": (0, 0)}
    listing = cli("dlq", "list", "--json").json
    assert sorted(m.get("lane") for m in listing["messages"]) == ["backfill", "gpu"]

    run = cli("dlq", "redrive", "--all")

    assert run.code == 0, run.err
    assert run.out.startswith("redrove 2 messages to their lanes' queues")
    assert "(lane gpu)" in run.out and "(lane backfill)" in run.out
    assert counts(deployed) == {"gpu": (1, 0), "backfill": (1, 0), "default": (0, 0)}
    assert deployed.queue_counts(deployed.settings.dlq_url) == (0, 0)
    (back,) = receive_all(deployed, url(deployed, "backfill"))
    assert json.loads(back["Body"]) == {"id": "scene-7"}


def test_redrive_leaves_a_message_whose_lane_is_unknown_here_unless_told(stack, monkeypatch, capsys):
    stack.send(json.dumps([1, 2, 3]), group="bad", lane="gpu")
    stack.launcher().tick()
    use_env(monkeypatch, stack)  # SLUICE_* variables without SLUICE_LANE_QUEUES

    run = sluice(capsys, "dlq", "redrive", "--all", session=stack.session)

    assert run.code == 1
    assert "its lane 'gpu' has no queue known here" in run.err
    assert stack.queue_counts(stack.settings.dlq_url) == (1, 0) and stack.queue_counts() == (0, 0)

    monkeypatch.setenv("SLUICE_LANE_QUEUES", lane_queues(stack))
    run = sluice(capsys, "dlq", "redrive", "--all", "--lane", "backfill", session=stack.session)
    assert run.code == 0, run.err
    assert run.out.startswith("redrove 1 message to lane backfill's queue")
    (m,) = receive_all(stack, url(stack, "backfill"))
    assert m["MessageAttributes"][LANE_ATTRIBUTE]["StringValue"] == "backfill"


def test_a_message_sqs_moved_goes_back_to_the_queue_it_came_from(stack):
    """SQS names the queue it moved a message from (DeadLetterQueueSourceArn; moto does not): that
    queue's lane wins over the attribute."""

    def dead(source_url: str | None, lane: str | None) -> DlqMessage:
        system = {"MessageGroupId": "g", "ApproximateReceiveCount": "6"}
        if source_url:
            system["DeadLetterQueueSourceArn"] = (
                "arn:aws:sqs:us-east-1:123456789012:" + source_url.rsplit("/", 1)[-1]
            )
        attributes = {LANE_ATTRIBUTE: {"DataType": "String", "StringValue": lane}} if lane else {}
        raw = {
            "MessageId": "m",
            "ReceiptHandle": "r",
            "Body": "{}",
            "Attributes": system,
            "MessageAttributes": attributes,
        }
        return dlq_message_of(raw)

    s = stack.settings
    assert redrive_lane(s, dead(url(stack, "backfill"), None)) == "backfill"
    assert redrive_lane(s, dead(s.queue_url, "gpu")) == "default", "the queue, not the attribute"
    assert redrive_lane(s, dead(None, "gpu")) == "gpu"
    assert redrive_lane(s, dead(None, None)) == "default"


# -- fair lanes (sluice.features.fair) -----------------------------------------------------------------------------


def test_status_shows_a_fair_lanes_tenants_and_what_waits_in_their_lines(session, monkeypatch, capsys):
    fair = "shared:4:0:1:fair"
    stack = build_stack(session, max_concurrency=4, lanes=fair)
    use_env(monkeypatch, stack, SLUICE_LANES=fair, SLUICE_LANE_QUEUES=lane_queues(stack))
    for tenant, n in (("heavy", 6), ("light", 3)):
        for i in range(n):
            stack.send(
                {"id": f"{tenant}-{i}"},
                group=f"{tenant}-{i}",
                lane="shared",
                sluice_concurrency_key=tenant,
            )
    stack.launcher().tick()  # 2 each: heavy 4 and light 1 wait in their lines

    data = sluice(capsys, "status", "--json", session=session).json
    shared = next(lane for lane in data["lanes"] if lane["lane"] == "shared")
    assert (shared["fair"], shared["running"], shared["tenants"], shared["in_lines"]) == (True, 4, 2, 5)
    assert shared["parked"] == {"in_key_lines": 5, "deferred": 0, "awaiting": 0, "total": 5}
    keys = {k["key"]: k for k in data["keys"]}
    assert keys["heavy"]["fair_lane"] == "shared" and keys["heavy"]["waiting"] == 4
    human = sluice(capsys, "status", session=session).out
    assert "shared  MAX 4 (configured), priority 0, weight 1, fair: 4 running of 4 (0 free), " in human
    assert "0 waiting, 0 in flight, 5 in the lines of its 2 tenants" in human
    assert "heavy: 2 running, 4 waiting (tenant of fair lane shared)" in human

    run = sluice(capsys, "set-max", "1", "--key", "heavy", session=session)
    assert run.code == 0, run.err
    assert "no cap but the lane's MAX" not in run.out and "its own cap" in run.out
    assert "Its waiters are woken by fair lane 'shared' at its next admission." in run.out


def test_status_counts_what_waits_parked_for_each_lane(session, monkeypatch, capsys):
    """An ordinary lane's parked payloads, from the three waiting rooms: a key's line, a deferred
    duplicate, an awaits waiter; each counted in the lane whose queue it goes back to."""
    lanes = "gpu:3:1,default:10"
    stack = build_stack(session, max_concurrency=10, lanes=lanes, duplicate_policy=DuplicatePolicy.DEFER)
    use_env(monkeypatch, stack, SLUICE_LANES=lanes, SLUICE_LANE_QUEUES=lane_queues(stack))
    for i in range(3):  # key cap 1: one runs, two wait in the key's line
        stack.send({"id": f"k-{i}"}, group=f"k{i}", lane="gpu", sluice_concurrency_key="tenant")
    stack.send({"id": "same", "v": 1}, group="s1", lane="gpu")
    stack.send({"id": "needs"}, group="w1", sluice_awaits=json.dumps(["not-yet"]))  # the default lane's
    stack.launcher().tick()
    stack.send({"id": "same", "v": 2}, group="s2", lane="gpu")  # its key runs: deferred
    stack.launcher().tick()

    data = sluice(capsys, "status", "--json", session=session).json
    parked = {lane["lane"]: lane["parked"] for lane in data["lanes"]}
    assert parked["gpu"] == {"in_key_lines": 2, "deferred": 1, "awaiting": 0, "total": 3}
    assert parked["default"] == {"in_key_lines": 0, "deferred": 0, "awaiting": 1, "total": 1}
    assert stack.queue_counts() == (0, 0) and stack.queue_counts(stack.settings.lane_queue_url("gpu")) == (
        0,
        0,
    )
    human = sluice(capsys, "status", session=session).out
    assert "3 parked (2 in key lines, 1 deferred duplicates)" in human
    assert "1 parked (1 awaiting keys)" in human
