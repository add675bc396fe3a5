"""A run Sluice released on its FAILED end, redriven by the operator, SUCCEEDED before any
reconciliation adopted it: its event frees no slot (it ran without one), but its success is the
key's (run once, awaits) and its effects are enqueued. Before, that event found nothing to release
and the success was lost: a later run-once message of the key ran again, and the effects were never
sent. The reliability world: the real handlers on moto, the model checking every promise."""

from __future__ import annotations

from tests.integration.test_key_breaks_moto import body, failed, runs_of


def item(world, pk: str) -> dict:
    return world.table().get(pk, {})


def test_a_redriven_success_after_its_release_is_the_keys_success(make_world):
    world = make_world(max_concurrency=3)
    e1 = failed(world)
    world.redrive(e1)
    world.end(e1, "SUCCEEDED", effects=[{"payload": {"id": "fx"}}])
    assert world.deliver(0) == "ok"
    world.check()
    payload = item(world, "PAYLOAD#j")
    assert payload["succeeded_by"] == {"S": e1}
    assert payload["receipt_state"] == {"S": "SUCCEEDED"}
    assert "EFFECTS#" + e1 in world.table(), "the effects' mark"
    assert world.holders(world.table()) == set(), "it ran without a slot: none is held or freed"
    world.send(body("j"), group="g2", attributes={"sluice-once": "true"})
    world.tick("A")
    world.check()
    assert runs_of(world, "j") == [e1], "a run-once message of a key that SUCCEEDED ran"
    assert "fx" in {s.key for s in world.model.starts}, "the effect was enqueued and started"
    world.settle()


def test_a_repeated_event_of_that_success_sends_and_writes_nothing_more(make_world):
    world = make_world(max_concurrency=3)
    e1 = failed(world)
    world.redrive(e1)
    event = world.end(e1, "SUCCEEDED", effects=[{"payload": {"id": "fx"}}])
    assert world.deliver(0) == "ok"
    before = item(world, "EXEC#" + e1)
    world.advance(600)  # past SQS's 5 minutes of deduplication: a second send would enqueue again
    world.pending.append(event)
    assert world.deliver(0) == "ok"
    world.check()  # the model: no effect sent again after its mark
    assert item(world, "EXEC#" + e1) == before
    world.settle()


def test_a_late_event_of_the_earlier_end_released_it_first(make_world):
    """The run still held when it ended ABORTED (that event late); redriven, it SUCCEEDED; the
    ABORTED event arrives first and releases it, then the SUCCEEDED one records the success."""
    world = make_world(max_concurrency=3)
    world.send(body("j"), group="g0")
    world.tick("A")
    (e1,) = world.model.running
    world.end(e1, "ABORTED")  # its event waits
    world.redrive(e1)
    world.end(e1, "SUCCEEDED", effects=[{"payload": {"id": "fx"}}])
    assert world.deliver(0) == "ok"  # ABORTED: the release, on the earlier end
    assert item(world, "EXEC#" + e1)["state"] == {"S": "ABORTED"}
    assert world.deliver(0) == "ok"  # SUCCEEDED: nothing to release, the success recorded
    world.check()
    assert item(world, "PAYLOAD#j")["succeeded_by"] == {"S": e1}
    assert item(world, "EXEC#" + e1)["state"] == {"S": "SUCCEEDED"}
    world.tick("A")
    assert "fx" in {s.key for s in world.model.starts}, "the effect was enqueued and started"
    world.settle()
