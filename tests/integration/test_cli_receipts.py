"""``sluice status KEY`` with the receipt, ``sluice wait KEY`` and ``sluice enqueue --once`` on moto.
``wait`` polls with an injected clock: its sleeps move the clock, nothing really waits."""

from __future__ import annotations

import json

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from tests.support.cli import sluice


class Polled(FakeClock):
    """A clock whose sleeps are recorded; ``then`` runs once the given number of sleeps have passed."""

    def __init__(self, then=None, after: int = 0) -> None:
        super().__init__()
        self.naps: list[float] = []
        self.then, self.after = then, after

    def sleep(self, seconds: float) -> None:
        self.naps.append(seconds)
        self.t += seconds
        if self.then is not None and len(self.naps) == self.after:
            self.then()


def run_one(stack, *, once: bool = False) -> str:
    attrs = {"sluice_once": "true"} if once else {}
    stack.send({"id": "k1"}, **attrs)
    stack.launcher().tick()
    return stack.executions()[-1]["name"]


def end(stack, name: str, status: str = "SUCCEEDED", **kw) -> None:
    stack.launcher().on_status_change(StatusChange.from_event(stack.finish(name, status, **kw)))


def test_status_shows_the_receipt(env, capsys):
    name = run_one(env)
    end(env, name, output='{"rows": 3}')
    run = sluice(capsys, "status", "k1", session=env.session)
    assert run.code == 0
    assert f"receipt     SUCCEEDED  {name}" in run.out and 'output: {"rows": 3}' in run.out
    data = sluice(capsys, "status", "k1", "--json", session=env.session).json
    assert data["receipt"]["outcome"] == "SUCCEEDED" and data["receipt"]["output"] == '{"rows": 3}'


def test_status_shows_the_effects_sent(env, capsys):
    name = run_one(env)
    effects = [{"payload": {"id": "c1"}}, {"payload": {"id": "c2"}}, {"payload": {"id": "c3"}, "lane": "gpu"}]
    end(env, name, output=json.dumps({"sluiceEffects": effects}))
    run = sluice(capsys, "status", "k1", session=env.session)
    assert "effects     2 sent of 3: c1, c2" in run.out and "refused: effect 2: lane" in run.out
    data = sluice(capsys, "status", "k1", "--json", session=env.session).json
    assert data["effects"]["sent"] == ["c1", "c2"] and data["effects"]["count"] == 3


def test_wait_exits_0_once_the_run_succeeds_polling_with_backoff(env, capsys):
    name = run_one(env)
    clock = Polled(then=lambda: end(env, name), after=3)
    run = sluice(capsys, "wait", "k1", "--timeout", "600", session=env.session, clock=clock)
    assert run.code == 0 and "SUCCEEDED" in run.out
    assert clock.naps == [1.0, 2.0, 4.0]  # doubling pauses; no real sleep


def test_wait_exits_1_when_the_run_failed(env, capsys):
    name = run_one(env)
    end(env, name, "FAILED", error="Work.Failed")
    run = sluice(capsys, "wait", "k1", session=env.session, clock=Polled())
    assert run.code == 1 and "error: Work.Failed" in run.out


def test_wait_exits_2_on_timeout_without_overshooting_it(env, capsys):
    run_one(env)
    clock = Polled()
    run = sluice(capsys, "wait", "k1", "--timeout", "10", session=env.session, clock=clock)
    assert run.code == 2 and "no receipt for 'k1' within 10 s" in run.err
    assert clock.naps == [1.0, 2.0, 4.0, 3.0] and sum(clock.naps) == 10


def test_enqueue_once_is_not_started_again_after_a_success(env, capsys, tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"id": "k1"}))
    assert sluice(capsys, "enqueue", path, "--once", session=env.session).code == 0
    env.launcher().tick()
    [first] = [e["name"] for e in env.executions()]
    end(env, first)
    assert sluice(capsys, "enqueue", path, "--once", "--dedup-id", "again", session=env.session).code == 0
    summary = env.launcher().tick()
    assert [e["name"] for e in env.executions()] == [first]
    assert summary.n(Outcome.ALREADY_DONE) == 1
    assert "1 run-once message acknowledged" in sluice(capsys, "status", "k1", session=env.session).out
