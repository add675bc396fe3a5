"""The slots contract, run against MemorySlots and DynamoSlots (moto), with shards of 1 to 3 slots so
that cross-shard choices and races happen. DynamoDB-only checks (write units, transaction items,
conflicts, racing planners at exact points) are at the end."""

from __future__ import annotations

import contextlib
import random
import threading
from decimal import Decimal
from typing import Any

import pytest

import sluice.adapters.dynamo.slots
from sluice.adapters.dynamo.slots import DynamoSlots, claim_item, release_item, shard_pk, swap_item
from sluice.adapters.dynamo.store import create_table
from sluice.core.errors import SlotsFull, TransientError
from sluice.primitives.slots import LOOK_SHARDS, Capacity, claim_any
from tests.contract.slots_fixtures import (
    NOW,
    TABLE,
    assert_at_rest,
    claim_until_full,
    in_threads,
    open_harness,
)
from tests.support.hooks import error_answer

P = "executions"


@pytest.fixture(params=["memory", "dynamodb"])
def harness(request):
    return open_harness(request)


def fill(slots, pool: str, count: int, prefix: str = "h") -> list[tuple[int, str]]:
    rng = random.Random(count)
    return [(claim_any(slots, pool, f"{prefix}{i}", NOW, rng), f"{prefix}{i}") for i in range(count)]


def test_an_unknown_pool_admits_nothing(harness):
    slots = harness.open()
    assert slots.look(P).free == 0 and slots.occupancy(P).version == 0
    with pytest.raises(SlotsFull):
        slots.claim(P, 0, "n1", NOW)
    assert not slots.release(P, 0, "n1")
    assert slots.rebalance(P) is None


def test_set_limit_lays_out_caps_that_add_up_to_the_limit(harness):
    slots = harness.open(per_shard=2)
    plan = slots.set_limit(Capacity(P, 5))
    assert plan.caps == (2, 2, 1) and not plan.frozen
    view = slots.occupancy(P)
    assert (view.limit, view.shard_count, view.per_shard, view.running, view.complete) == (5, 3, 2, 0, True)
    assert [(s.index, s.cap, s.size) for s in view.shards] == [(0, 2, 0), (1, 2, 0), (2, 1, 0)]
    assert slots.look(P).free == 5 and view.capacity == Capacity(P, 5)


def test_sixteen_claimers_take_exactly_the_limit(harness):
    slots = harness.open(per_shard=3)
    slots.set_limit(Capacity(P, 11))  # caps 3, 3, 3, 2
    claimers = [harness.beside(slots, seed=i) for i in range(16)]
    won = in_threads(16, lambda i: claim_until_full(claimers[i], P, f"n{i}", seed=i))
    assert sum(won) == 11
    view = harness.snapshot(slots, P)
    assert view.running == 11 and view.free == 0
    assert_at_rest(view)
    assert {h for s in view.shards for h in s.holders} == {f"n{i}" for i, w in enumerate(won) if w}


def test_a_claim_is_judged_by_its_own_shard(harness):
    slots = harness.open(per_shard=1)
    slots.set_limit(Capacity(P, 2))
    slots.claim(P, 0, "a", NOW)
    with pytest.raises(SlotsFull):
        slots.claim(P, 0, "b", NOW)  # shard 1 has room, but this claim asked shard 0
    with pytest.raises(SlotsFull):
        slots.claim(P, 7, "b", NOW)  # no such shard
    assert not slots.release(P, 1, "a")  # held on shard 0, not 1
    slots.claim(P, 1, "b", NOW)
    assert slots.occupancy(P).running == 2


def test_claiming_again_on_the_same_shard_takes_no_second_slot(harness):
    slots = harness.open(per_shard=2)
    slots.set_limit(Capacity(P, 2))
    slots.claim(P, 0, "a", NOW)
    slots.claim(P, 0, "a", NOW + 1)  # an answer lost, asked again: it holds the slot
    view = slots.occupancy(P)
    assert view.running == 1 and dict(view.shards[0].holders) == {"a": NOW}


def test_a_release_frees_once(harness):
    slots = harness.open(per_shard=2)
    slots.set_limit(Capacity(P, 2))
    slots.claim(P, 0, "a", NOW)
    slots.claim(P, 0, "b", NOW)
    assert slots.release(P, 0, "a")
    assert not slots.release(P, 0, "a")  # a second release frees nothing
    slots.claim(P, 0, "c", NOW)
    with pytest.raises(SlotsFull):
        slots.claim(P, 0, "d", NOW)
    assert slots.occupancy(P).running == 2


def test_swap_hands_the_slot_over_and_keeps_the_count(harness):
    slots = harness.open(per_shard=2)
    slots.set_limit(Capacity(P, 2))
    slots.claim(P, 0, "a", NOW)
    slots.claim(P, 0, "b", NOW)  # full: a swap needs no free slot
    assert slots.swap(P, 0, "a", "c", NOW + 5)
    assert dict(slots.occupancy(P).shards[0].holders) == {"b": NOW, "c": NOW + 5}
    assert slots.swap(P, 0, "a", "c", NOW + 6)  # asked again: done already
    assert not slots.swap(P, 0, "x", "y", NOW)  # x holds nothing: nothing changes
    assert not slots.swap(P, 1, "b", "y", NOW)  # b holds on shard 0, not 1
    assert slots.occupancy(P).running == 2


def test_swap_admits_nothing_while_frozen(harness):
    slots = harness.open(per_shard=2)
    slots.set_limit(Capacity(P, 2))
    slots.claim(P, 0, "a", NOW)
    slots.claim(P, 0, "b", NOW)
    assert slots.set_limit(Capacity(P, 1)).frozen
    with pytest.raises(SlotsFull):
        slots.swap(P, 0, "a", "c", NOW)
    assert set(slots.occupancy(P).shards[0].holders) == {"a", "b"}  # a keeps its slot


def test_raising_and_lowering_keep_the_sum_and_evict_nobody(harness):
    slots = harness.open(per_shard=3)
    slots.set_limit(Capacity(P, 9))
    held = fill(slots, P, 5)
    for limit in (12, 7, 5, 6, 20, 5):
        plan = slots.set_limit(Capacity(P, limit))
        assert not plan.frozen
        view = slots.occupancy(P)
        assert view.limit == limit and view.running == 5
        assert_at_rest(view)
        assert {(s.index, h) for s in view.shards for h in s.holders} == set(held)  # nobody moved or left
    with pytest.raises(SlotsFull):
        claim_any(slots, P, "late", NOW, random.Random(0))  # 5 of 5


def refused_everywhere(slots, name: str) -> bool:
    view = slots.occupancy(P)
    for i in range(view.shard_count):
        with pytest.raises(SlotsFull):
            slots.claim(P, i, name, NOW)
    return True


def test_lowering_below_the_holders_freezes_until_rebalance(harness):
    slots = harness.open(per_shard=2)
    slots.set_limit(Capacity(P, 6))
    held = fill(slots, P, 5)
    plan = slots.set_limit(Capacity(P, 3))
    assert plan.frozen and set(plan.caps) == {0}
    view = slots.occupancy(P)
    assert view.frozen and view.limit == 3 and view.running == 5 and view.caps == 0
    assert refused_everywhere(slots, "n1")
    assert slots.release(P, *held[0])
    assert slots.rebalance(P).frozen  # 4 still run
    assert refused_everywhere(slots, "n2")
    assert slots.release(P, *held[1])
    assert refused_everywhere(slots, "n3")  # 3 run: they fit, but nothing is admitted before rebalance
    assert not slots.rebalance(P).frozen
    view = slots.occupancy(P)
    assert view.running == 3 and {(s.index, h) for s in view.shards for h in s.holders} == set(held[2:])
    assert_at_rest(view)  # the caps cover the holders: 3 of 3
    with pytest.raises(SlotsFull):
        claim_any(slots, P, "n4", NOW, random.Random(3))
    assert slots.release(P, *held[2])
    claim_any(slots, P, "n5", NOW, random.Random(4))
    with pytest.raises(SlotsFull):
        claim_any(slots, P, "n6", NOW, random.Random(5))
    assert slots.occupancy(P).running == 3


def test_the_shard_count_grows_and_never_shrinks(harness):
    slots = harness.open(per_shard=2)
    slots.set_limit(Capacity(P, 3))
    assert slots.occupancy(P).shard_count == 2
    fill(slots, P, 3)
    slots.set_limit(Capacity(P, 7))
    view = slots.occupancy(P)
    assert view.shard_count == 4 and view.running == 3
    assert_at_rest(view)
    slots.set_limit(Capacity(P, 3))
    view = slots.occupancy(P)
    assert view.shard_count == 4 and view.caps == 3 and slots.look(P).shard_count == 4
    assert_at_rest(view)


def test_setting_the_same_limit_again_changes_nothing(harness):
    slots = harness.open(per_shard=2)
    slots.set_limit(Capacity(P, 5))
    fill(slots, P, 2)
    version = slots.occupancy(P).version
    assert slots.set_limit(Capacity(P, 5)).moves == ()
    assert slots.rebalance(P).moves == ()
    assert slots.occupancy(P).version == version


def test_a_limit_from_an_older_reading_never_replaces_a_newer_one(harness):
    slots = harness.open(per_shard=2)
    assert slots.set_limit(Capacity(P, 5, stamp=(7, 100.0))).limit == 5
    assert slots.set_limit(Capacity(P, 2, stamp=(8, 100.0))).limit == 2
    version = slots.occupancy(P).version
    # A launcher still holding MAX version 7 (and a later running count) must not undo version 8.
    assert slots.set_limit(Capacity(P, 5, stamp=(7, 900.0))) is None
    view = slots.occupancy(P)
    assert (view.limit, view.caps, view.version, view.stamp) == (2, 2, version, (8, 100.0))
    # The same MAX with a newer running count applies, and so does an unfenced change.
    assert slots.set_limit(Capacity(P, 3, stamp=(8, 200.0))).limit == 3
    assert slots.occupancy(P).stamp == (8, 200.0)
    assert slots.set_limit(Capacity(P, 4)).limit == 4
    view = slots.occupancy(P)
    assert (view.limit, view.caps, view.stamp) == (4, 4, ())
    assert slots.rebalance(P).limit == 4


def test_a_change_that_replaces_a_stamp_is_written_only_while_that_stamp_is_in_force(harness):
    """Compare-and-set: a writer that merged its reading with the pool's source writes only if
    nobody changed the pool since; else it reads and merges again."""
    slots = harness.open(per_shard=2)
    slots.set_limit(Capacity(P, 3, stamp=(1.0,)))
    assert slots.set_limit(Capacity(P, 4, stamp=(3.0,), replaces=(1.0,))).limit == 4
    assert slots.set_limit(Capacity(P, 5, stamp=(4.0,), replaces=(1.0,))) is None  # moved on since
    assert (slots.occupancy(P).limit, slots.occupancy(P).stamp) == (4, (3.0,))


def test_restamp_records_a_newer_source_while_the_stamp_is_the_one_replaced(harness):
    slots = harness.open(per_shard=2)
    assert not slots.restamp(P, (1.0,), ())  # no pool yet
    slots.set_limit(Capacity(P, 3, stamp=(1.0,)))
    version = slots.occupancy(P).version
    assert slots.restamp(P, (2.0,), (1.0,))
    assert not slots.restamp(P, (3.0,), (1.0,))  # moved on since
    view = slots.occupancy(P)
    assert (view.limit, view.caps, view.stamp, view.version) == (3, 3, (2.0,), version + 1)
    # A planner that read before the restamp is fenced by the version it moved.
    assert slots.set_limit(Capacity(P, 5, stamp=(4.0,), replaces=(1.0,))) is None


def test_a_newer_stamp_alone_is_written_even_when_the_caps_stay(harness):
    slots = harness.open(per_shard=2)
    slots.set_limit(Capacity(P, 3, stamp=(1, 0.0)))
    assert slots.set_limit(Capacity(P, 3, stamp=(2, 0.0))).limit == 3
    assert slots.occupancy(P).stamp == (2, 0.0)
    assert slots.set_limit(Capacity(P, 6, stamp=(1, 5.0))) is None  # older than (2, 0)
    assert slots.occupancy(P).limit == 3


@pytest.mark.parametrize(("old", "new"), [(6, 3), (6, 1), (6, 9), (3, 6)])
def test_claims_racing_a_change_stay_under_the_larger_limit(harness, old, new):
    slots = harness.open(per_shard=2)
    slots.set_limit(Capacity(P, old))
    fill(slots, P, old - 2)
    bound = max(old, new)
    busy, finished, peak = threading.Event(), threading.Semaphore(0), [0]

    def work(i: int) -> Any:
        if i == 0:  # the planner, once the claimers are under way
            busy.wait(30)
            return slots.set_limit(Capacity(P, new))
        if i == 1:  # the observer: one instant at a time, until every claimer is done
            done = 0
            while done < 6:
                view = harness.snapshot(slots, P)
                peak[0] = max(peak[0], view.running)
                assert view.running <= bound and view.caps <= bound
                done += finished.acquire(blocking=False)
            return None
        me, rng = harness.beside(slots, seed=i), random.Random(i)
        mine: list[tuple[int, str]] = []
        for j in range(12):
            with contextlib.suppress(SlotsFull):
                mine.append((claim_any(me, P, f"w{i}-{j}", NOW, rng), f"w{i}-{j}"))
            if mine and rng.random() < 0.4:
                assert me.release(P, *mine.pop(rng.randrange(len(mine))))
            busy.set()
        finished.release()
        return None

    in_threads(8, work)
    view = harness.snapshot(slots, P)
    assert view.limit == new and view.running <= bound and 0 < peak[0] <= bound
    while view.frozen or view.running > new:  # drain what the lowering left above the limit
        shard = next(s for s in view.shards if s.holders)
        slots.release(P, shard.index, next(iter(shard.holders)))
        slots.rebalance(P)
        view = harness.snapshot(slots, P)
    assert_at_rest(view)
    in_threads(6, lambda i: claim_until_full(harness.beside(slots, seed=50 + i), P, f"end{i}", seed=i))
    assert harness.snapshot(slots, P).running == min(new, view.running + 6)


def test_racing_planners_leave_the_caps_of_the_limit_in_force(harness):
    slots = harness.open(per_shard=2)
    slots.set_limit(Capacity(P, 6))
    fill(slots, P, 3)
    limits = (2, 8, 4, 5)
    finished = threading.Semaphore(0)

    def work(i: int) -> Any:
        me, rng = harness.beside(slots, seed=i), random.Random(i)
        if i == 0:  # the observer, until the planners and claimers are done
            done = 0
            while done < 7:
                view = harness.snapshot(slots, P)
                assert view.running <= max(limits) + 1 and view.caps <= max(limits) + 1
                done += finished.acquire(blocking=False)
            return None
        if i < 4:  # planners, each with its own order of limits
            for limit in limits[i:] + limits[:i]:
                me.set_limit(Capacity(P, limit))
                me.rebalance(P)
        else:
            for j in range(10):
                try:
                    shard = claim_any(me, P, f"w{i}-{j}", NOW, rng)
                except SlotsFull:
                    continue
                if rng.random() < 0.5:
                    me.release(P, shard, f"w{i}-{j}")
        finished.release()
        return None

    in_threads(8, work)
    slots.rebalance(P)
    view = harness.snapshot(slots, P)
    assert view.limit in limits
    if view.frozen:
        assert view.running > view.limit and view.caps == 0
    else:
        assert_at_rest(view)


def test_a_pool_of_many_shards_is_looked_at_by_sample_and_changed_in_steps(harness):
    slots = harness.open(per_shard=1)
    slots.set_limit(Capacity(P, 110))  # 110 shards: more than one transaction can write
    look = slots.look(P)
    assert look.shard_count == 110 and look.read == LOOK_SHARDS and not look.complete
    held = [(i, f"h{i}") for i in range(100)]
    for shard, name in held:
        slots.claim(P, shard, name, NOW)
    assert slots.set_limit(Capacity(P, 90)).frozen
    assert slots.occupancy(P).caps == 0
    for shard, name in held[:15]:
        slots.release(P, shard, name)
    assert not slots.rebalance(P).frozen
    assert_at_rest(slots.occupancy(P))
    slots.set_limit(Capacity(P, 130))
    view = slots.occupancy(P)
    assert view.shard_count == 130 and view.running == 85 and view.complete
    assert_at_rest(view)


# -- DynamoDB only ---------------------------------------------------------------------------------


@pytest.fixture
def table(session):
    client = session.client("dynamodb")
    create_table(client, TABLE)
    return client


def item_bytes(raw: dict[str, Any]) -> int:
    """An item's size as DynamoDB bills it: names and strings in UTF-8 bytes; a number one byte per
    two significant digits plus one; a map 3 bytes plus, per entry, 1 byte, its name and its value."""

    def value(v: dict[str, Any]) -> int:
        ((kind, inner),) = v.items()
        if kind == "S":
            return len(inner.encode())
        if kind == "N":
            digits = Decimal(inner).normalize().as_tuple().digits
            return -(-len(digits) // 2) + 1
        if kind == "BOOL":
            return 1
        if kind == "M":
            return 3 + sum(1 + len(k.encode()) + value(x) for k, x in inner.items())
        raise AssertionError(kind)

    return sum(len(name.encode()) + value(v) for name, v in raw.items())


def test_a_claim_on_an_eight_holder_shard_is_one_write_unit(table):
    slots = DynamoSlots(table, TABLE, per_shard=8)
    pool = "p" * 64  # the longest pool name
    slots.set_limit(Capacity(pool, 8))
    names = [f"{i}-".ljust(80, "x") for i in range(8)]
    now = NOW + 0.123456  # 16 significant digits
    for name in names[:7]:
        slots.claim(pool, 0, name, now)
    answer = table.update_item(
        **claim_item(TABLE, pool, 0, names[7], now)["Update"], ReturnConsumedCapacity="TOTAL"
    )
    assert answer["ConsumedCapacity"]["CapacityUnits"] <= 1  # moto answers a flat 0.5: sized below
    full = table.get_item(TableName=TABLE, Key={"pk": {"S": shard_pk(pool, 0)}})["Item"]
    assert len(full["holders"]["M"]) == 8
    assert item_bytes(full) <= 1_024  # the larger image of a claim, release or swap on this shard
    # The arithmetic of dynamo_slots' docstring: pk, cap, 8 holders.
    assert item_bytes(full) == 2 + len(shard_pk(pool, 0)) + 5 + 730
    meta = table.get_item(TableName=TABLE, Key={"pk": {"S": f"SLOTS#{pool}"}})["Item"]
    assert item_bytes(meta) <= 1_024


def test_the_slot_writes_compose_into_one_transaction(table):
    slots = DynamoSlots(table, TABLE, per_shard=2)
    slots.set_limit(Capacity(P, 2))
    record = {"Put": {"TableName": TABLE, "Item": {"pk": {"S": "EXEC#a"}, "state": {"S": "CLAIMED"}}}}
    table.transact_write_items(TransactItems=[claim_item(TABLE, P, 0, "a", NOW), record])
    slots.claim(P, 0, "b", NOW)
    refused = {"Put": {"TableName": TABLE, "Item": {"pk": {"S": "EXEC#c"}}}}
    with pytest.raises(table.exceptions.TransactionCanceledException) as caught:
        table.transact_write_items(TransactItems=[claim_item(TABLE, P, 0, "c", NOW), refused])
    reason = caught.value.response["CancellationReasons"][0]
    assert reason["Code"] == "ConditionalCheckFailed" and set(reason["Item"]["holders"]["M"]) == {"a", "b"}
    assert "Item" not in table.get_item(TableName=TABLE, Key={"pk": {"S": "EXEC#c"}})  # nothing written
    table.transact_write_items(TransactItems=[swap_item(TABLE, P, 0, "a", "c", NOW + 1)])
    table.transact_write_items(TransactItems=[release_item(TABLE, P, 0, "b")])
    assert {h for s in slots.occupancy(P).shards for h in s.holders} == {"c"}


def test_a_look_is_one_eventually_consistent_batch_read(table):
    DynamoSlots(table, TABLE, per_shard=1).set_limit(Capacity(P, 3))
    slots = DynamoSlots(table, TABLE)  # a new container: it does not know the shard count yet
    sent: list[tuple[str, Any]] = []
    table.meta.events.register(
        "before-parameter-build.dynamodb.*", lambda model, params, **_: sent.append((model.name, params))
    )
    assert slots.look(P).free == 3
    assert [op for op, _ in sent] == ["BatchGetItem"]
    request = sent[0][1]["RequestItems"][TABLE]
    assert request["ConsistentRead"] is False and len(request["Keys"]) == 1 + LOOK_SHARDS
    sent.clear()
    slots.look(P)  # the shard count is known now: only the shards there are
    assert len(sent[0][1]["RequestItems"][TABLE]["Keys"]) == 1 + 3


def test_a_conflict_with_a_planner_is_asked_again_and_never_escapes_as_client_error(table):
    sleeps: list[float] = []
    slots = DynamoSlots(table, TABLE, per_shard=2, sleep=sleeps.append)
    slots.set_limit(Capacity(P, 2))
    conflicts = [2]

    def conflict(**_: Any) -> Any:
        if conflicts[0]:
            conflicts[0] -= 1
            return error_answer("TransactionConflictException", 400)
        return None

    table.meta.events.register("before-call.dynamodb.UpdateItem", conflict)
    slots.claim(P, 0, "a", NOW)
    assert len(sleeps) == 2 and slots.occupancy(P).running == 1
    conflicts[0] = 99
    with pytest.raises(TransientError):
        slots.release(P, 0, "a")


def run_once_before(client: Any, operation: str, action: Any, *, skip: int = 0) -> None:
    """Run ``action`` (another container's write) just before the ``skip``+1-th ``operation``."""
    seen = [0]

    def hook(**_: Any) -> None:
        seen[0] += 1
        if seen[0] == skip + 1:
            action()

    client.meta.events.register(f"before-call.dynamodb.{operation}", hook)


def test_a_planner_overtaken_before_it_wrote_plans_again_and_wins(table, session):
    slots = DynamoSlots(table, TABLE, per_shard=2)
    slots.set_limit(Capacity(P, 6))
    other = DynamoSlots(session.client("dynamodb"), TABLE, per_shard=2)
    run_once_before(table, "TransactWriteItems", lambda: other.set_limit(Capacity(P, 2)))
    assert slots.set_limit(Capacity(P, 9)).limit == 9  # its version was stale: read again
    view = slots.occupancy(P)
    assert (view.limit, view.version) == (9, 3)  # 6, then the other's 2, then 9
    assert_at_rest(view)


def test_a_planner_overtaken_between_its_steps_gives_way(table, session):
    slots = DynamoSlots(table, TABLE, per_shard=1)
    slots.set_limit(Capacity(P, 3))
    other = DynamoSlots(session.client("dynamodb"), TABLE, per_shard=1)
    # 3 → 150 takes several transactions; another set_limit lands after the first of them.
    run_once_before(table, "TransactWriteItems", lambda: other.set_limit(Capacity(P, 4)), skip=1)
    assert slots.set_limit(Capacity(P, 150)) is None
    view = slots.occupancy(P)
    assert view.limit == 4 and view.shard_count == 150
    assert_at_rest(view)


@pytest.mark.parametrize(("late", "caps", "frozen"), [(1, (2, 1, 0), False), (2, (0, 0, 0), True)])
def test_a_claim_landing_between_the_planners_read_and_write_makes_it_plan_again(
    table, session, late, caps, frozen
):
    slots = DynamoSlots(table, TABLE, per_shard=2)
    slots.set_limit(Capacity(P, 6))
    slots.claim(P, 0, "a", NOW)
    slots.claim(P, 1, "b", NOW)
    other = DynamoSlots(session.client("dynamodb"), TABLE)
    late_claims = [(0, "c"), (1, "d")][:late]
    # The planner reads holders 1, 1, 0 and plans caps 1, 1, 1; then shard 0 (and 1) gain a holder.
    run_once_before(table, "TransactWriteItems", lambda: [other.claim(P, i, n, NOW) for i, n in late_claims])
    plan = slots.set_limit(Capacity(P, 3))
    assert (plan.caps, plan.frozen) == (caps, frozen)
    view = slots.occupancy(P)
    assert view.version == 2 and view.running == 2 + late  # one change committed, nobody evicted
    if not frozen:
        assert_at_rest(view)


class PlannerDied(Exception):
    """The planner's Lambda timed out between two of its transactions."""


def test_a_change_in_several_transactions_writes_decreases_first(table, session, monkeypatch):
    """Completing a half-written freeze moves caps both ways; between its transactions the caps never
    add up to more than they did when it read them or than the new limit (decreases first)."""
    # Transactions of 4 shards instead of 99: a pool of 8 shards changes in two steps.
    monkeypatch.setattr(sluice.adapters.dynamo.slots, "SHARDS_PER_TRANSACTION", 4)
    slots = DynamoSlots(table, TABLE, per_shard=1)
    slots.set_limit(Capacity(P, 8))
    for i in range(4):
        slots.claim(P, i, f"h{i}", NOW)

    def die() -> None:
        raise PlannerDied

    # 8 → 2 with 4 running freezes, 8 caps to 0 in two steps; the planner dies after the first.
    run_once_before(table, "TransactWriteItems", die, skip=1)
    with pytest.raises(PlannerDied):
        slots.set_limit(Capacity(P, 2))
    view = slots.occupancy(P)
    # The pool item comes with the last decreases: the old limit stays in force, and admits less.
    assert (view.limit, view.frozen) == (8, False) and [s.cap for s in view.shards] == [
        0,
        0,
        0,
        0,
        1,
        1,
        1,
        1,
    ]
    found = view.caps
    # Another planner puts 4 in force: caps 1 on the four held shards, 0 on the four others.
    other = DynamoSlots(session.client("dynamodb"), TABLE, per_shard=1)
    sums: list[int] = []
    other.client.meta.events.register(
        "after-call.dynamodb.TransactWriteItems",
        lambda **_: sums.append(sum(s.cap for s in slots.occupancy(P).shards)),
    )
    plan = other.set_limit(Capacity(P, 4))
    assert plan.caps == (1, 1, 1, 1, 0, 0, 0, 0) and len(plan.moves) == 8
    assert len(sums) == 2 and all(total <= max(found, 4) for total in sums), (found, sums)
    assert_at_rest(slots.occupancy(P))
