"""Issue 27, items 3 and 4: the ``sluice`` an operator uses in the first week, against moto.

Item 3: ``status KEY`` for a payload with no record answers with what is known. Item 4: ``set-max``
and ``tick`` on a stack with lanes say what is in force per lane and why a tick stopped. Item 5 is
in test_cli_first_week_args_moto.py. Each runs ``sluice.cli.main`` with the test's session.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from handlers import _shared
from tests.support.aws import build_stack
from tests.support.cli import clear_sluice_env, deploy, parameter
from tests.support.cli import sluice as run_sluice

STACK = "sluice-week"


# -- item 3: status of a payload with no record ----------------------------------------------------------

LANES = "gpu:2:1,default:3"


@pytest.fixture
def laned(session, monkeypatch):
    """A stack with lanes (gpu: MAX 2, priority 1; default: MAX 3) under MAX 5, found from its outputs
    and its launcher's SLUICE_LANES."""
    clear_sluice_env(monkeypatch)
    _shared.reset()
    stack = build_stack(session, max_concurrency=5, lanes=LANES)
    deploy(stack, STACK, lanes=LANES)
    yield stack
    _shared.reset()


@pytest.fixture
def lcli(laned, capsys):
    return lambda *argv: run_sluice(capsys, "--stack", STACK, *argv, session=laned.session)


def fill(stack: Any, lane: str, n: int, prefix: str | None = None) -> None:
    for i in range(n):
        stack.send({"id": f"{prefix or lane}-{i}"}, group=f"{prefix or lane}-{i}", lane=lane)


def test_item3_status_of_a_payload_still_in_the_queue_says_what_holds_it(env, cli):
    cli("set-max", "2")
    fill(env, "default", 3, prefix="job")
    cli("tick")  # job-0 and job-1 start; job-2 waits in the queue
    assert len(env.running()) == 2 and env.queue_counts() == (1, 0)

    run = cli("status", "job-2")

    assert run.code == 1
    assert run.err == "sluice status: no record for payload 'job-2'\n"
    assert run.out.splitlines() == [
        "payload     job-2",
        "record      none yet: not received by the launcher yet (still in a queue, or in flight), never "
        "enqueued, or expired (records are kept retentionDays)",
        "MAX         2",
        "slots       2 running of 2 (0 free)",
        "queue       1 waiting, 0 in flight, 0 delayed",
        "holds       every slot is taken (2 running of 2)",
    ]

    data = cli("status", "job-2", "--json")
    assert data.code == 1
    doc = data.json  # a JSON document on stdout, as for every "not found"
    assert (doc["payload"], doc["payload_id"], doc["found"]) == (None, "job-2", False)
    room = doc["room"]
    assert (room["max"], room["limit"], room["running"], room["free"]) == (2, 2, 2, 0)
    assert [(q["lane"], q["waiting"], q["in_flight"]) for q in room["queues"]] == [("default", 1, 0)]
    assert room["holds"] == [{"hold": "full", "lane": None, "concurrency_key": None}]

    cli("pause")
    paused = cli("status", "job-2")
    assert paused.code == 1
    assert "MAX         0, PAUSED (sluice resume restores 2)" in paused.out
    assert (
        paused.out.splitlines()[-1] == "holds       MAX is 0 (paused): nothing starts until `sluice resume`"
    )

    cli("resume")
    cli("set-max", "3")
    free = cli("status", "never-sent")
    assert free.code == 1
    assert "slots       2 running of 3 (1 free)" in free.out
    assert free.out.splitlines()[-1].startswith("holds       nothing: slots are free")
    assert len(env.running()) == 2 and env.queue_counts() == (1, 0), "status changes nothing"


def test_item3_status_narrowed_to_a_lane_on_a_stack_with_lanes(laned, lcli):
    fill(laned, "gpu", 4)
    fill(laned, "default", 1)
    lcli("tick")
    assert sorted(e["name"].split("-")[0] for e in laned.executions("RUNNING")) == ["default", "gpu", "gpu"]

    run = lcli("status", "gpu-3", "--lane", "gpu")

    assert run.code == 1
    lines = run.out.splitlines()
    assert [line for line in lines if line.startswith("lane ")] == [
        "lane        gpu  MAX 2 (configured): 2 running of 2 (0 free); queue 2 waiting, 0 in flight, 0 delayed"
    ]
    assert lines[-1] == "holds       lane gpu is full (2 running of 2, 2 waiting)"

    every = lcli("status", "gpu-3", "--json").json
    assert [q["lane"] for q in every["room"]["queues"]] == ["gpu", "default"]
    assert every["room"]["holds"] == [{"hold": "lane full", "lane": "gpu", "concurrency_key": None}]

    running = lcli("status", "gpu-0", "--lane", "gpu")  # a record: the lane's room after it
    assert running.code == 0 and running.out.startswith("payload     gpu-0\nstate       CLAIMED")
    assert running.out.splitlines()[-1] == "holds       lane gpu is full (2 running of 2, 2 waiting)"

    unknown = lcli("status", "gpu-3", "--lane", "cpu")
    assert unknown.code == 2 and "no lane 'cpu'" in unknown.err and unknown.out == ""

    overview = lcli("status", "--lane", "default", "--json").json
    assert [lane["lane"] for lane in overview["lanes"]] == ["default"]


def test_item3_status_narrowed_to_a_concurrency_key(env, cli, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"k-{i}"}) for i in range(3)))
    assert cli("enqueue", path, "--concurrency-key", "tenant-a").code == 0
    assert cli("set-max", "1", "--key", "tenant-a").code == 0
    cli("tick")  # k-0 starts, k-1 and k-2 wait in the key's line
    assert len(env.running()) == 1

    run = cli("status", "k-9", "--concurrency-key", "tenant-a")

    assert run.code == 1
    assert "key         tenant-a: 1 of 1 running, 2 waiting in its line" in run.out
    assert run.out.splitlines()[-1] == "holds       concurrency key tenant-a is at its cap (1 of 1 running)"
    assert "queue       0 waiting, 0 in flight, 0 delayed, 2 in concurrency keys' lines" in run.out

    parked = cli("status", "k-2", "--concurrency-key", "tenant-a", "--json")
    assert parked.code == 0 and parked.json["line"]["waiting"] is True
    assert parked.json["room"]["key"]["waiting"] == 2

    overview = cli("status", "--concurrency-key", "tenant-b", "--json").json
    assert [(k["key"], k["running"], k["waiting"]) for k in overview["keys"]] == [("tenant-b", 0, 0)]


def test_item3_every_not_found_prints_json_with_json(env, cli):
    status = cli("status", "nobody", "--json")
    assert status.code == 1 and status.json["found"] is False

    semaphore = cli("semaphore", "status", "nothing-here", "--json")
    assert semaphore.code == 1
    assert semaphore.json == {"semaphore": "nothing-here", "found": False}
    assert "no semaphore named 'nothing-here'" in semaphore.err

    deleted = cli("dlq", "delete", "--id", "no-such-id", "--json")
    assert deleted.code == 1 and deleted.json["not_found"] == ["no-such-id"]


# -- item 4: set-max and tick on a stack with lanes --------------------------------------------------------


def test_item4_set_max_says_what_each_lane_allows(laned, lcli):
    run = lcli("set-max", "8")

    assert run.code == 0, run.err
    assert parameter(laned) == "8"
    assert run.out.splitlines()[1:] == [
        "In force now: the next start obeys it (8 slots for Sluice). Nothing running is stopped.",
        "With lanes, each lane's own limit holds too: at most 5 run at once (the lanes' limits add up to 5; "
        "raise one with `sluice set-max N --lane NAME`):",
        "  gpu  MAX 2 (configured): limit 2 from the next tick, 0 running",
        "  default  MAX 3 (configured): limit 3 from the next tick, 0 running",
    ]
    fill(laned, "default", 7)
    assert lcli("tick").code == 0
    assert len(laned.running()) == 3, "lane default's 3, not MAX's 8"

    lowered = lcli("set-max", "2", "--json").json
    assert lowered["at_most"] == 2
    assert [(x["lane"], x["next_limit"], x["limit"]) for x in lowered["lanes"]] == [
        ("gpu", 2, 2),
        ("default", 3, 3),
    ]


def test_item4_set_max_shows_the_implied_default_lane_following_max(session, monkeypatch, capsys):
    clear_sluice_env(monkeypatch)
    stack = build_stack(session, max_concurrency=5, lanes="gpu:2:1")
    deploy(stack, STACK, lanes="gpu:2:1")
    cli = lambda *argv: run_sluice(capsys, "--stack", STACK, *argv, session=session)  # noqa: E731
    fill(stack, "default", 6)
    cli("tick")
    assert len(stack.running()) == 5

    run = cli("set-max", "6")

    assert run.code == 0, run.err
    assert "With lanes, each lane's own limit holds too: at most 6 run at once:" in run.out
    assert "  default  follows MAX: limit 6 from the next tick (5 in force now), 5 running" in run.out
    cli("tick")
    assert len(stack.running()) == 6


def test_item4_tick_says_why_it_stopped_in_each_lane(laned, lcli):
    lcli("set-max", "8")
    fill(laned, "default", 7)

    first = lcli("tick")

    assert first.code == 0, first.err
    rows = dict(line.split(None, 1) for line in first.out.splitlines() if not line.startswith("lane "))
    assert rows["slots"] == "MAX 8 (limit 8): running 0 → 3, 5 free"
    assert rows["stopped"] == "lane default is full (3 running of 3, 4 waiting); lane gpu's queue is empty"
    assert [line.split(None, 1)[1] for line in first.out.splitlines() if line.startswith("lane ")] == [
        "gpu  MAX 2 (configured): 0 running of 2 (2 free), 0 waiting; started 0 this tick",
        "default  MAX 3 (configured): 3 running of 3 (0 free), 4 waiting; started 3 this tick",
    ]
    again = lcli("tick", "--json").json
    assert again["stopped"] == "lane full"
    assert again["stop_reasons"] == [
        {"hold": "lane full", "lane": "default", "concurrency_key": None},
        {"hold": "empty", "lane": "gpu", "concurrency_key": None},
    ]
    assert len(laned.running()) == 3 and laned.queue_counts() == (4, 0)

    fill(laned, "gpu", 3)
    lcli("pause", "--lane", "gpu")
    held = lcli("tick")
    assert "lane gpu is paused, 3 waiting (sluice resume --lane gpu)" in held.out
    assert len(laned.running()) == 3

    lcli("resume", "--lane", "gpu")
    lcli("set-max", "4")
    full = lcli("tick")
    assert "stopped     every slot is taken (4 running of 4)" in full.out
    assert len(laned.running()) == 4


def test_item4_tick_paused_says_max_0_not_none(laned, lcli):
    fill(laned, "gpu", 3)
    lcli("tick")
    lcli("pause")

    run = lcli("tick")

    assert run.code == 0, run.err
    assert "None" not in run.out
    rows = dict(line.split(None, 1) for line in run.out.splitlines() if not line.startswith("lane "))
    assert rows["slots"] == "MAX 0, PAUSED (limit 0): running 2 → 2, 0 free"
    assert rows["stopped"] == "MAX is 0 (paused): nothing starts until `sluice resume`"
    data = lcli("tick", "--json").json
    assert (data["stopped"], data["room"]["max"]) == ("paused", 0)
    assert len(laned.running()) == 2 and laned.queue_counts(laned.settings.lane_queue_url("gpu")) == (1, 0)


def test_item4_tick_names_payloads_waiting_in_key_lines(env, cli, tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"k-{i}"}) for i in range(3)))
    cli("enqueue", path, "--concurrency-key", "tenant-a")
    cli("set-max", "1", "--key", "tenant-a")

    run = cli("tick")

    assert run.code == 0, run.err
    assert "stopped     the queue is empty; 2 wait in concurrency keys' lines (keys at their caps)" in run.out
    assert cli("tick", "--json").json["stopped"] == "key lines"
    assert len(env.running()) == 1 and env.queue_counts() == (0, 0)


def test_item3_status_with_the_table_alone_says_the_queues_are_unknown(stack, monkeypatch, capsys):
    clear_sluice_env(monkeypatch)
    monkeypatch.setenv("SLUICE_TABLE_NAME", stack.settings.table_name)
    stack.send({"id": "job-1"}, group="job-1")

    run = run_sluice(capsys, "status", "job-1", session=stack.session)

    assert run.code == 1
    assert run.out.splitlines()[-1] == (
        "room        unknown: SLUICE_TABLE_NAME alone names no queue: set SLUICE_QUEUE_URL, or let the stack be read"
    )
    doc = run_sluice(capsys, "status", "job-1", "--json", session=stack.session).json
    assert (doc["found"], doc["room"]) == (False, None)
    assert stack.queue_counts() == (1, 0)
