"""Attacks on the adoption's redrive date (commit a5dbcab, ``ExecutionRecord.redriven_at``), on moto
with the real adapters, launcher and completion.

Step Functions is played on moto: an operator's RedriveExecution is
``tests.integration.test_breaker_findings.redrive``, and the dates Step Functions stamps (stop dates,
``redriveDate``) are written by ``World`` on moto's records and in the events, by the fake clock, so
one clock gives them all. moto reports no ``redriveCount``/``redriveDate``: a DescribeExecution hook
adds them (fresh), or gives a stale answer from a queue of answers (each as Step Functions saw the
run at a moment no more than the consistency window, 60 s, before the call). Every stale answer
asserts it was given. Events go through the launcher's ``on_status_change`` (the completion
function's path, with its DescribeExecution confirmations).

Five broke (promise 2; the fourth promise 1 too), and hold since their fixes:
- reconciliation adopted on a stale RUNNING answer whose redriveDate is the older redrive r1
  (``redriven_at`` r1); the unrecorded end s2 (r1 < s2 < r2) then read as the adopted run's end in
  the duplicate check of the key's next message: released, run beside it;
- the same stale adoption, then a late repeat of s2's event confirmed by a stale DescribeExecution;
- a key marked UNSURE adopted by ``_take_redriven`` on a stale ended answer (``redriven_at`` None);
  the duplicate check then read s2;
- ``ran_again`` took a stale answer with the unrecorded end s2 for "the listing is behind that end"
  although the listing was past the window of s2: nothing adopted or marked, the key's next
  message started beside the run (2 running, MAX 1);
- a terminal event without stopDate (EventBridge always sends one) confirmed by a stale answer.
The fixes: while an adoption is younger than the consistency window, no end but a success is
proof, an event's or DescribeExecution's (``completion.young_adoption``, ``_holder_ended``);
reconciliation judges it past the window. A new end the window old means the run ran again
(``ran_again``: AGAIN), within it UNSURE; a marked key's run may run on any end but a success
within the mark's windows (``_still_runs``); the completion's confirmation refuses an end before
``redriven_at``. The cost: a redriven run that ends within a window of its adoption keeps its slot
until the first reconciliation past it.
Held as written: a fresh adoption (redriveDate r2) ignores a late repeat of s2's event (not even
asked) and a stale answer with s2 in the duplicate check; with its end's event lost, reconciliation
past the window releases it; a re-adoption whose answer reports no redriveDate keeps the older one
(r2), and the later real end (s4 > r3 > r2) is still released; Step Functions' dates ten minutes
ahead of or behind Sluice's clock give the same outcome (``redriven_at`` is compared only with
Step Functions' stop dates); the DynamoDB round trip of ``redriven_at``, and a record without it.
Timelines keep every stale answer within 60 s of its call and each runtime's answers in time order.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from moto.core import DEFAULT_ACCOUNT_ID
from moto.stepfunctions.models import stepfunctions_backends

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import PayloadState
from tests.integration.test_breaker_findings import redrive, running_of_key
from tests.support.aws import REGION, build_stack

# -- Step Functions played on moto, by the fake clock -------------------------------------------


def _dt(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class World:
    """moto's Step Functions with dates by ``clock``: ends, redrives, and DescribeExecution answers
    carrying ``redriveCount``/``redriveDate`` (fresh), or the next queued stale answer."""

    def __init__(self, stack: Any, rt: Any) -> None:
        self.stack, self.rt, self.clock = stack, rt, stack.clock
        self.redrives: dict[str, list[float]] = {}
        self.stale: list[tuple[str, dict[str, Any]]] = []
        self.seen: Counter = Counter()
        self.hide_redrive_date = 0
        self.skew = 0.0  # Step Functions' dates run this far ahead of Sluice's clock
        rt.client("stepfunctions").meta.events.register("after-call.sfn.DescribeExecution", self._describe)

    def _describe(self, parsed: dict[str, Any], **_: Any) -> None:
        name = parsed.get("name")
        dates = self.redrives.get(name, [])
        if dates:
            parsed["redriveCount"] = len(dates)
            parsed["redriveDate"] = _dt(dates[-1])
            if self.hide_redrive_date:
                self.hide_redrive_date -= 1
                self.seen["no redrive date"] += 1
                del parsed["redriveDate"]
        if self.stale and self.stale[0][0] == name:
            _, answer = self.stale.pop(0)
            self.seen["stale"] += 1
            for field, value in answer.items():
                if value is None:
                    parsed.pop(field, None)
                else:
                    parsed[field] = _dt(value) if field.endswith("Date") else value

    def stale_answer(self, name: str, status: str, *, stop: float | None, redrives: list[float]) -> None:
        """The next DescribeExecution of ``name`` answers as Step Functions saw it then."""
        self.stale.append(
            (
                name,
                {
                    "status": status,
                    "stopDate": stop,
                    "redriveCount": len(redrives),
                    "redriveDate": redrives[-1] if redrives else None,
                },
            )
        )

    def end(self, name: str, status: str = "FAILED") -> tuple[float, dict[str, Any]]:
        """``name`` ends now; its stop date and the event Step Functions sends."""
        at = self.clock.now() + self.skew
        event = self.stack.finish(name, status, error="Boom" if status != "SUCCEEDED" else None)
        ms = round(at * 1000)
        self._moto(name).stop_date = _dt(ms / 1000)
        event["detail"]["stopDate"] = ms
        return ms / 1000, event

    def redrive(self, name: str) -> float:
        redrive(self.stack, name)
        at = round((self.clock.now() + self.skew) * 1000) / 1000
        self.redrives.setdefault(name, []).append(at)
        return at

    def _moto(self, name: str) -> Any:
        arn = self.rt.store().execution(name).arn
        return stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION].describe_execution(arn)

    def event(self, event: dict[str, Any]) -> bool:
        released, _, _ = self.rt.launcher().on_status_change(StatusChange.from_event(event))
        return released


def _setup(session: Any, max_concurrency: int = 3, skew: float = 0.0) -> tuple[Any, Any, World, str]:
    clock = FakeClock(time.time())
    stack = build_stack(session, max_concurrency=max_concurrency, clock=clock)
    rt = stack.runtime()
    world = World(stack, rt)
    world.skew = skew
    stack.send({"id": "k", "n": 1}, group="a")
    rt.launcher().tick()
    (e1,) = stack.running()
    return stack, rt, world, e1


def _unrecorded_end_between_redrives(stack: Any, rt: Any, world: World, e1: str) -> dict[str, float]:
    """e1 FAILED at s1 (released); redriven at r1; FAILED at s2 (its event frees nothing: s2 never
    recorded); redriven at r2. No tick in between."""
    store = rt.store()
    stack.clock.advance(5)
    s1, ev1 = world.end(e1)
    assert world.event(ev1)
    stack.clock.advance(10)
    r1 = world.redrive(e1)
    stack.clock.advance(10)
    s2, ev2 = world.end(e1)
    assert not world.event(ev2)  # e1 held nothing
    assert store.execution(e1).ended_at == pytest.approx(s1, abs=0.002)  # s2 unrecorded
    assert store.payload("k").holder is None
    return {"s1": s1, "r1": r1, "s2": s2, "ev2": ev2}  # type: ignore[dict-item]


# -- attacks ---------------------------------------------------------------------------------------


def test_adoption_on_a_stale_running_answer_then_the_unrecorded_end_in_the_duplicate_check(session):
    stack, rt, world, e1 = _setup(session)
    store = rt.store()
    d = _unrecorded_end_between_redrives(stack, rt, world, e1)
    stack.clock.advance(10)
    r2 = world.redrive(e1)
    stack.clock.advance(10)  # now r2 + 10; s2 = r2 - 10, r1 = r2 - 20
    # reconciliation's answer, as of just before s2 (≤ 60 s old): RUNNING after r1
    world.stale_answer(e1, "RUNNING", stop=None, redrives=[d["r1"]])
    # the duplicate check's answer, as of between s2 and r2: FAILED at s2
    world.stale_answer(e1, "FAILED", stop=d["s2"], redrives=[d["r1"]])
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick()

    assert world.seen["stale"] == 2
    record = store.execution(e1)
    assert record.adopted_at is not None
    assert record.redriven_at == pytest.approx(d["r1"], abs=0.002)  # the stale answer's redrive, not r2
    assert r2 > d["s2"]
    assert running_of_key(stack, "k") == [e1], f"k runs {running_of_key(stack, 'k')}"
    assert store.payload("k").holder == e1


def test_adoption_on_a_stale_running_answer_then_a_late_event_of_the_unrecorded_end(session):
    stack, rt, world, e1 = _setup(session)
    store = rt.store()
    d = _unrecorded_end_between_redrives(stack, rt, world, e1)
    stack.clock.advance(10)
    world.redrive(e1)
    stack.clock.advance(10)
    world.stale_answer(e1, "RUNNING", stop=None, redrives=[d["r1"]])
    rt.launcher().tick()
    assert store.payload("k").holder == e1  # adopted, redriven_at r1
    stack.clock.advance(5)
    # the late repeat of s2's event; the completion's DescribeExecution answers as of before r2
    world.stale_answer(e1, "FAILED", stop=d["s2"], redrives=[d["r1"]])
    assert not world.event(d["ev2"])  # type: ignore[arg-type]
    assert world.seen["stale"] == 1  # not asked: the adoption is younger than the window
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick(reconcile_first=False)

    assert world.seen["stale"] == 2  # the duplicate check was given FAILED at s2
    assert running_of_key(stack, "k") == [e1], f"k runs {running_of_key(stack, 'k')}"
    assert store.payload("k").holder == e1


def test_a_stale_answer_with_the_unrecorded_end_hides_the_second_redrive_from_reconciliation(session):
    stack, rt, world, e1 = _setup(session, max_concurrency=1)
    store = rt.store()
    d = _unrecorded_end_between_redrives(stack, rt, world, e1)
    stack.clock.advance(100)
    world.redrive(e1)
    stack.clock.advance(10)  # now r2 + 10 = s2 + 110: a RUNNING listing cannot be behind s2
    # answer as of r2 - 45 (≤ 60 s old): FAILED at s2, one redrive (r1)
    world.stale_answer(e1, "FAILED", stop=d["s2"], redrives=[d["r1"]])
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick()

    assert world.seen["stale"] == 1
    assert len(stack.running()) <= 1, f"running {stack.running()} with MAX 1"
    assert running_of_key(stack, "k") == [e1], f"k runs {running_of_key(stack, 'k')}"
    assert store.payload("k").holder == e1 or store.payload("k").redriven == e1


def test_fresh_adoption_ignores_the_unrecorded_end_and_is_released_by_its_real_end(session):
    """Fresh adoption on r2: a late repeat of s2's event with a stale answer (s2) releases nothing,
    a new message of k is not run beside e1; e1's real end s3 comes within the window of the
    adoption, so its event is refused (``completion.young_adoption``), and reconciliation past the
    window releases e1: a window's delay, no leak."""
    stack, rt, world, e1 = _setup(session)
    store = rt.store()
    d = _unrecorded_end_between_redrives(stack, rt, world, e1)
    stack.clock.advance(10)
    r2 = world.redrive(e1)
    stack.clock.advance(10)
    rt.launcher().tick()
    record = store.execution(e1)
    assert store.payload("k").holder == e1 and record.redriven_at == pytest.approx(r2, abs=0.002)

    stack.clock.advance(5)
    assert not world.event(d["ev2"])  # type: ignore[arg-type]  # s2 < r2: not even asked
    world.stale_answer(e1, "FAILED", stop=d["s2"], redrives=[d["r1"]])
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick(reconcile_first=False)
    assert world.seen["stale"] == 1 and not world.stale
    assert running_of_key(stack, "k") == [e1] and store.payload("k").holder == e1

    stack.clock.advance(20)
    s3, ev3 = world.end(e1)
    assert not world.event(ev3)  # within the adoption's window: refused, DescribeExecution not asked
    assert store.payload("k").holder == e1
    stack.clock.advance(121)  # reconciliation past the adoption's window: fresh answer, s3
    rt.launcher().tick()
    rt.launcher().tick()
    assert e1 not in store.ledger().holders
    stack.clock.advance(1)
    rt.launcher().tick()
    assert [n for n in running_of_key(stack, "k") if n != e1]  # the parked message ran after e1
    assert store.execution(e1).ended_at == pytest.approx(s3, abs=0.002)


def test_fresh_adoption_whose_end_event_is_lost_is_released_by_reconciliation(session):
    stack, rt, world, e1 = _setup(session, max_concurrency=1)
    store = rt.store()
    _unrecorded_end_between_redrives(stack, rt, world, e1)
    stack.clock.advance(10)
    world.redrive(e1)
    stack.clock.advance(10)
    rt.launcher().tick()
    assert store.payload("k").holder == e1
    stack.clock.advance(5)
    world.end(e1)  # event lost
    stack.clock.advance(121)
    rt.launcher().tick()
    assert store.payload("k").holder is None and store.ledger().holders == set()


def test_a_readoption_without_a_redrive_date_keeps_the_older_and_the_later_end_still_releases(session):
    """adopt on r2 (redriven_at r2); end s3 released; redrive r3; adopted on an answer without a
    redriveDate (kept: r2); its end s4 > r3 > r2, event lost: reconciliation releases it."""
    stack, rt, world, e1 = _setup(session, max_concurrency=1)
    store = rt.store()
    _unrecorded_end_between_redrives(stack, rt, world, e1)
    stack.clock.advance(10)
    r2 = world.redrive(e1)
    stack.clock.advance(10)
    rt.launcher().tick()
    assert store.execution(e1).redriven_at == pytest.approx(r2, abs=0.002)
    stack.clock.advance(5)
    _, ev3 = world.end(e1)
    world.event(ev3)  # releases today (else reconciliation past the window, below)
    stack.clock.advance(121)
    rt.launcher().tick()
    assert store.payload("k").holder is None
    stack.clock.advance(100)
    world.redrive(e1)
    stack.clock.advance(100)
    world.hide_redrive_date = 1
    rt.launcher().tick()
    assert world.seen["no redrive date"] == 1
    record = store.execution(e1)
    assert store.payload("k").holder == e1 and record.redriven_at == pytest.approx(r2, abs=0.002)
    stack.clock.advance(5)
    world.end(e1)  # event lost
    stack.clock.advance(121)
    rt.launcher().tick()
    assert store.payload("k").holder is None and store.ledger().holders == set()
    # and a late repeat of the s3 event on the released record releases nothing, leaks nothing
    assert not world.event(ev3)
    assert store.ledger().holders == set()


def test_redriven_at_round_trips_and_a_record_without_it_reads_none(session):
    stack, rt, world, e1 = _setup(session)
    store = rt.store()
    stack.clock.advance(5)
    _, ev1 = world.end(e1)
    assert world.event(ev1)
    assert store.execution(e1).redriven_at is None
    stack.clock.advance(100)
    r1 = world.redrive(e1)
    stack.clock.advance(5)
    rt.launcher().tick()
    record = store.execution(e1)
    assert record.state is PayloadState.RUNNING and record.redriven_at == pytest.approx(r1, abs=0.002)
    # a record as written before the change: no attribute
    table = stack.settings.table_name
    ddb = stack.client("dynamodb")
    items = ddb.scan(TableName=table)["Items"]
    (item,) = [i for i in items if "redriven_at" in i]
    ddb.update_item(TableName=table, Key={"pk": item["pk"]}, UpdateExpression="REMOVE redriven_at")
    assert store.execution(e1).redriven_at is None


def test_the_harness_event_and_moto_agree_on_the_stop_date(session):
    """Sanity of the harness: an event's stop date is the one moto answers."""
    stack, rt, world, e1 = _setup(session)
    stack.clock.advance(3)
    s, ev = world.end(e1)
    info = rt.executions().describe(e1, rt.store().execution(e1).arn)
    assert info.stop_date == pytest.approx(s, abs=0.002)
    assert StatusChange.from_event(ev).stop_date == pytest.approx(s, abs=0.002)


def test_an_event_without_stop_date_and_a_stale_answer_before_the_redrive(session):
    """Fresh adoption on r2; a FAILED event with no stopDate (EventBridge always sends one: only a
    malformed or hand-made event) and a stale DescribeExecution: FAILED at s2 < r2."""
    stack, rt, world, e1 = _setup(session)
    store = rt.store()
    d = _unrecorded_end_between_redrives(stack, rt, world, e1)
    stack.clock.advance(10)
    world.redrive(e1)
    stack.clock.advance(10)
    rt.launcher().tick()
    assert store.payload("k").holder == e1
    stack.clock.advance(5)
    event = dict(d["ev2"])  # type: ignore[call-overload]
    event["detail"] = {**event["detail"], "stopDate": None}
    world.stale_answer(e1, "FAILED", stop=d["s2"], redrives=[d["r1"]])
    assert not world.event(event)
    assert world.seen["stale"] == 0  # not asked: the adoption is younger than the window
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick(reconcile_first=False)
    assert world.seen["stale"] == 1  # the duplicate check was given FAILED at s2
    assert running_of_key(stack, "k") == [e1], f"k runs {running_of_key(stack, 'k')}"


def test_a_marked_key_adopted_on_a_stale_end_then_the_unrecorded_end_in_the_duplicate_check(session):
    """All within the window of s1: reconciliation is UNSURE and marks k for e1; k's message adopts
    e1 on a stale answer (its end s1, no redrive: redriven_at None), looks again and reads s2."""
    stack, rt, world, e1 = _setup(session)
    store = rt.store()
    d = _unrecorded_end_between_redrives(stack, rt, world, e1)
    stack.clock.advance(5)
    world.redrive(e1)
    stack.clock.advance(5)  # now s1 + 30: every answer below is from after s1 - 30
    world.stale_answer(e1, "FAILED", stop=d["s1"], redrives=[])  # reconciliation: UNSURE, marks k
    world.stale_answer(e1, "FAILED", stop=d["s1"], redrives=[])  # _still_runs: a young mark, adopt
    world.stale_answer(e1, "FAILED", stop=d["s2"], redrives=[d["r1"]])  # the duplicate check
    stack.send({"id": "k", "n": 2}, group="b")
    rt.launcher().tick()
    assert world.seen["stale"] == 3 and not world.stale
    assert store.execution(e1).adopted_at is not None and store.execution(e1).redriven_at is None
    assert running_of_key(stack, "k") == [e1], f"k runs {running_of_key(stack, 'k')}"


@pytest.mark.parametrize("skew", [-600.0, 600.0])
def test_a_skewed_clock_neither_holds_nor_frees_an_adopted_run_wrongly(session, skew):
    """Step Functions' dates ten minutes off Sluice's clock: the fresh adoption (r2) ignores a late
    s2 event, and its real end (event lost) is released by reconciliation past the window."""
    stack, rt, world, e1 = _setup(session, max_concurrency=1, skew=skew)
    store = rt.store()
    d = _unrecorded_end_between_redrives(stack, rt, world, e1)
    stack.clock.advance(100)  # past the window of s1 by either clock
    r2 = world.redrive(e1)
    stack.clock.advance(10)
    rt.launcher().tick()
    assert store.payload("k").holder == e1
    assert store.execution(e1).redriven_at == pytest.approx(r2, abs=0.002)
    stack.clock.advance(5)
    assert not world.event(d["ev2"])  # type: ignore[arg-type]
    stack.clock.advance(5)
    world.end(e1)  # event lost
    stack.clock.advance(121)
    rt.launcher().tick()
    assert store.payload("k").holder is None and store.ledger().holders == set()
