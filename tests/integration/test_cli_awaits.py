"""``sluice enqueue --after``, its cycle check, and ``sluice status KEY [--tree]`` for waiters, on moto."""

from __future__ import annotations

import json

from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from tests.support.cli import sluice


def enqueue(env, capsys, tmp_path, body, *args):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(body))
    return sluice(capsys, "enqueue", path, *args, session=env.session)


def test_enqueue_after_parks_the_payload_until_the_key_has_succeeded(env, capsys, tmp_path):
    assert enqueue(env, capsys, tmp_path, {"id": "a"}).code == 0
    assert enqueue(env, capsys, tmp_path, {"id": "c"}, "--after", "a", "--after", "b").code == 0
    summary = env.launcher().tick()
    assert summary.n(Outcome.WAITING) == 1 and summary.n(Outcome.STARTED) == 1

    shown = sluice(capsys, "status", "c", session=env.session)
    assert shown.code == 0
    assert "awaits    a  CLAIMED  (missing)" in shown.out and "awaits    b  UNSEEN  (missing)" in shown.out
    tree = sluice(capsys, "status", "c", "--tree", session=env.session).out
    assert "c  WAITING" in tree and "awaits a  CLAIMED" in tree and "awaits b  UNSEEN" in tree
    as_json = json.loads(sluice(capsys, "status", "a", "--tree", "--json", session=env.session).out)
    assert as_json["awaits"]["awaited_by"] == ["c"]

    (name,) = [e["name"] for e in env.executions()]
    env.launcher().on_status_change(StatusChange.from_event(env.finish(name)))
    assert enqueue(env, capsys, tmp_path, {"id": "b"}).code == 0
    env.launcher().tick()
    (b,) = [e["name"] for e in env.executions("RUNNING")]
    env.launcher().on_status_change(StatusChange.from_event(env.finish(b)))
    assert {i["id"] for i in env.inputs()} == {"a", "b", "c"}


def test_a_cycle_through_a_parked_waiter_is_refused_with_a_clear_error(env, capsys, tmp_path):
    assert enqueue(env, capsys, tmp_path, {"id": "b"}, "--after", "a").code == 0
    env.launcher().tick()  # b is parked, awaiting a
    refused = enqueue(env, capsys, tmp_path, {"id": "a"}, "--after", "b")
    assert refused.code == 1
    assert "awaits cycle: a → b → a; it could never start" in refused.err
    assert env.queue_counts() == (0, 0)


def test_a_payload_awaiting_itself_is_refused(env, capsys, tmp_path):
    refused = enqueue(env, capsys, tmp_path, {"id": "a"}, "--after", "a")
    assert refused.code == 1 and "awaits itself" in refused.err


def test_on_await_failure_run_is_sent_as_the_attribute(env, capsys, tmp_path):
    assert enqueue(env, capsys, tmp_path, {"id": "a"}).code == 0
    env.launcher().tick()
    assert enqueue(env, capsys, tmp_path, {"id": "c"}, "--after", "a", "--on-await-failure", "run").code == 0
    env.launcher().tick()
    (name,) = [e["name"] for e in env.executions()]
    env.launcher().on_status_change(StatusChange.from_event(env.finish(name, "FAILED")))
    assert len(env.executions()) == 2 and env.dlq_messages() == []
