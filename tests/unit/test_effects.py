"""Effects with memory adapters (sluice.features.effects): what one release sends, and what it never sends."""

from __future__ import annotations

import json

from sluice.adapters.memory.aws import MemoryQueue
from sluice.adapters.memory.payloads import MemoryPayloadObjects
from sluice.adapters.memory.store import MemoryStore
from sluice.core.clock import FakeClock
from sluice.core.model import Ending, PayloadState
from sluice.core.names import ORIGIN_ATTRIBUTE
from sluice.features.effects import EFFECTS_FIELD, Effects, effect_id
from sluice.features.receipts import Outputs
from sluice.launch.completion import complete, output_from
from tests.contract.stores import NOW, claim


def setup():
    store, queue = MemoryStore(), MemoryQueue(FakeClock(NOW))
    claim(store, "parent", "p1")
    return store, queue


def end(store, queue, state=PayloadState.SUCCEEDED, text=None, effects=None, name="p1"):
    return complete(
        store=store,
        queue=queue,
        name=name,
        ending=Ending(state, NOW + 5),
        output=output_from(text, Outputs()),
        effects=effects,
    )


def fx(*effects):
    return json.dumps({EFFECTS_FIELD: list(effects)})


def test_effect_ids_are_deterministic_and_distinct():
    assert effect_id("p1", 0) == effect_id("p1", 0)
    assert len({effect_id("p1", 0), effect_id("p1", 1), effect_id("p2", 0)}) == 3
    assert len(effect_id("p1", 0)) <= 128


def test_a_success_sends_each_effect_with_its_key_and_origin_and_marks_them():
    store, queue = setup()
    end(store, queue, text=fx({"payload": {"id": "a"}}, {"payload": {"x": 1}, "key": "b", "once": True}))
    sent = [(q.message.body, q.message.attributes) for q in queue.messages]
    assert sent == [
        ('{"id":"a"}', {"sluice-key": "a", ORIGIN_ATTRIBUTE: effect_id("p1", 0)}),
        ('{"x":1}', {"sluice-key": "b", "sluice-once": "true", ORIGIN_ATTRIBUTE: effect_id("p1", 1)}),
    ]
    assert store.effects("p1").sent == ("a", "b")


def test_a_second_release_sends_nothing():
    store, queue = setup()
    text = fx({"payload": {"id": "a"}})
    end(store, queue, text=text)
    end(store, queue, text=text)
    assert len(queue.messages) == 1


def test_no_effects_no_failure_no_record():
    store, queue = setup()
    end(store, queue, text='{"result": 1}')
    assert store.effects("p1") is None and not queue.messages
    claim(store, "other", "o1")
    end(store, queue, state=PayloadState.FAILED, text=fx({"payload": {"id": "a"}}), name="o1")
    assert store.effects("o1") is None and not queue.messages and not queue.dead


def test_an_effect_over_the_threshold_is_stored_and_sent_as_a_pointer():
    store, queue = setup()
    objects = MemoryPayloadObjects()
    end(
        store,
        queue,
        text=fx({"payload": {"id": "a", "blob": "z" * 500}}),
        effects=Effects(objects, threshold=100),
    )
    [queued] = queue.messages
    body = json.loads(queued.message.body)
    assert body["id"] == "a" and body["sluicePayload"]["uri"].startswith(
        "s3://sluice-test-payloads/payloads/"
    )
    assert len(objects.objects) == 1


def test_bad_effects_are_dead_lettered_with_their_reason():
    store, queue = setup()
    end(
        store,
        queue,
        text=fx({"payload": {"id": "a"}, "awaits": "b"}, {"payload": {"id": "c"}, "once": "yes"}),
    )
    assert [reason for _, reason in queue.dead] == [
        "effect 0: 'awaits' must be a JSON array of keys (non-empty strings)",
        "effect 1: 'once' must be true or false, got a string",
    ]
    assert [m.message_id for m, _ in queue.dead] == [effect_id("p1", 0), effect_id("p1", 1)]
    assert store.effects("p1").sent == () and len(store.effects("p1").rejected) == 2


def test_an_effect_runs_under_its_concurrency_key_and_a_bad_one_is_refused():
    store, queue = setup()
    many = [f"k{i}" for i in range(99)]
    end(
        store,
        queue,
        text=fx(
            {"payload": {"id": "a"}, "concurrency_key": "acme"},
            {"payload": {"id": "b"}, "concurrency_key": 7},
            {"payload": {"id": "c"}, "awaits": many},  # over the launcher's own limit of 98
        ),
    )
    [queued] = queue.messages
    assert queued.message.attributes["sluice-concurrency-key"] == "acme"
    assert [reason for _, reason in queue.dead] == [
        "effect 1: 'concurrency_key' must be a non-empty string, got a number",
        "effect 2: 'awaits' names 99 keys; at most 98",
    ]
