"""The store contract for the caps, on MemoryStore and DynamoStore (moto) alike: the external count
ordered by its listing, and an adoption that never leaves caps admitting past the limit.

A reconciliation numbers its listing on both sides (``listed_after`` before ListExecutions, ``count``
after it): a count replaces the one in force only when its listing began after that one was
numbered; two listings that overlap keep the larger count (``sluice.core.external``).
"""

from __future__ import annotations

from collections import Counter

import pytest

from sluice.adapters.dynamo.store import DynamoStore, create_table
from sluice.core.errors import SlotsFull
from sluice.core.limits import LimitSource
from sluice.core.model import Ending, PayloadState
from sluice.primitives.slots import plan_caps
from tests.contract.stores import NOW, claim
from tests.support.hooks import Crash

MAX_AT = 1000.0  # when MAX was last set: both sources read the same MAX


def listing(store) -> tuple[int, int]:
    """The two numbers a reconciliation takes around its listing."""
    return store.next_count(), store.next_count()


def source(external: int, numbers: tuple[int, int], max_value: int = 4) -> LimitSource:
    listed_after, count = numbers
    return LimitSource(max_value, MAX_AT, external, count, 0, listed_after)


def test_an_overlapping_listing_numbered_last_never_lowers_the_count_it_did_not_see(store):
    """Tick A lists (0 outside), X is started by hand, tick B lists (1) and saves; A saves last."""
    a_before = store.next_count()
    b = listing(store)
    a = (a_before, store.next_count())
    assert store.set_limit(source(1, b)) == 3
    assert store.save_reconciliation(external=1, drift=1, now=NOW, count=b[1], listed_after=b[0])
    assert store.set_limit(source(0, a)) == 3  # A's listing may be the older one: the larger count stands
    store.save_reconciliation(external=0, drift=0, now=NOW + 1, count=a[1], listed_after=a[0])
    ledger = store.ledger()
    assert (ledger.external, ledger.count) == (1, a[1])


def test_an_overlapping_listing_numbered_first_keeps_its_larger_count(store):
    """The other order: A numbers first and lists late (it sees X); B numbers after A, lists before X
    was started and saves last with the higher number."""
    a_before, b_before = store.next_count(), store.next_count()
    a = (a_before, store.next_count())  # A lists after X started: 1 outside
    b = (b_before, store.next_count())  # B listed before X started: 0
    assert store.set_limit(source(1, a)) == 3
    store.save_reconciliation(external=1, drift=0, now=NOW, count=a[1], listed_after=a[0])
    assert store.set_limit(source(0, b)) == 3
    assert store.save_reconciliation(external=0, drift=0, now=NOW + 1, count=b[1], listed_after=b[0])
    assert store.ledger().external == 1


def test_an_overlapping_listing_numbered_first_and_saved_last_keeps_its_larger_count(store):
    """A numbers first and saves last; B, numbered after A, listed before X was started and saved
    first. A's count is numbered below the one saved, but the listings overlap: its larger count
    must still be written (the merge keeps the larger), not dropped as the older one."""
    a_before, b_before = store.next_count(), store.next_count()
    a = (a_before, store.next_count())  # A lists after X started: 1 outside
    b = (b_before, store.next_count())  # B listed before X started: 0
    assert store.set_limit(source(0, b)) == 4
    assert store.save_reconciliation(external=0, drift=0, now=NOW, count=b[1], listed_after=b[0])
    assert store.set_limit(source(1, a)) == 3
    assert not store.save_reconciliation(external=1, drift=1, now=NOW + 1, count=a[1], listed_after=a[0])
    ledger = store.ledger()
    assert (ledger.external, ledger.count) == (1, b[1])


def test_a_count_numbered_below_the_saved_one_dropped_whole_is_caught(session, monkeypatch):
    """The variant ``overtaken_count_dropped`` (tests/explorer/broken.py): nothing written whenever a
    count numbered higher was saved. The scenario above then loses A's larger count."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["overtaken_count_dropped"][1]:
        monkeypatch.setattr(owner, attr, value)
    client = session.client("dynamodb")
    create_table(client, "dropped")
    store = DynamoStore(client, "dropped", retention_seconds=3600)
    with pytest.raises(AssertionError):
        test_an_overlapping_listing_numbered_first_and_saved_last_keeps_its_larger_count(store)


def test_a_listing_begun_after_the_count_in_force_was_numbered_lowers_it(store):
    first = listing(store)
    assert store.set_limit(source(2, first)) == 2
    store.save_reconciliation(external=2, drift=0, now=NOW, count=first[1], listed_after=first[0])
    later = listing(store)  # the executions outside ended before this listing
    assert store.set_limit(source(0, later)) == 4
    assert store.save_reconciliation(external=0, drift=0, now=NOW + 1, count=later[1], listed_after=later[0])
    ledger = store.ledger()
    assert (ledger.external, ledger.count, ledger.listed_after) == (0, later[1], later[0])


def test_a_launcher_holding_the_ledger_of_an_overlapping_listing_keeps_the_larger_count(store):
    """The launcher puts MAX − LEDGER's count in force: LEDGER keeps the merged count, so a launcher
    that read it after both saves puts the larger count in force, not the last saved."""
    a_before = store.next_count()
    b = listing(store)
    a = (a_before, store.next_count())
    store.save_reconciliation(external=1, drift=0, now=NOW, count=b[1], listed_after=b[0])
    store.save_reconciliation(external=0, drift=0, now=NOW + 1, count=a[1], listed_after=a[0])
    ledger = store.ledger()
    assert store.set_limit(LimitSource(4, MAX_AT, ledger.external, ledger.count, 0, ledger.listed_after)) == 3


def test_a_listing_older_than_the_count_in_force_changes_nothing(store):
    old = listing(store)
    new = listing(store)
    assert store.set_limit(source(1, new)) == 3
    store.save_reconciliation(external=1, drift=0, now=NOW, count=new[1], listed_after=new[0])
    assert store.set_limit(source(0, old)) == 3
    assert not store.save_reconciliation(external=3, drift=0, now=NOW + 1, count=old[1], listed_after=old[0])
    ledger = store.ledger()
    assert (ledger.external, ledger.count, ledger.reconciled_at) == (1, new[1], NOW)


def test_a_slow_reconciler_overtaken_by_every_newer_save_writes_nothing_and_raises_nothing(session):
    """Found by the explorer with a slow container (swarm seed 2115900058): tick A's listing, then a
    newer listing saved before each of A's writes of the figures, five times over; A raised
    "LEDGER's external count kept changing" with no fault. A newer listing's count stands whatever
    A saw, so A has nothing to write: it returns (not the latest) without a write."""
    client = session.client("dynamodb")
    create_table(client, "slow")
    slow = DynamoStore(client, "slow", retention_seconds=3600)
    fast = DynamoStore(session.client("dynamodb"), "slow", retention_seconds=3600)
    mine = listing(slow)
    overtaken: list[tuple[int, int]] = []

    def newer_save_first(params, **_):
        if params["Key"]["pk"]["S"] == "LEDGER" and "ConditionExpression" in params:
            numbers = listing(fast)
            fast.save_reconciliation(
                external=len(overtaken) % 2, drift=0, now=NOW, count=numbers[1], listed_after=numbers[0]
            )
            overtaken.append(numbers)

    client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", newer_save_first)
    assert (
        slow.save_reconciliation(external=3, drift=3, now=NOW + 1, count=mine[1], listed_after=mine[0])
        is False
    )
    assert overtaken, "no newer save overtook the slow reconciler"
    ledger = fast.ledger()
    assert (ledger.external, ledger.count) == ((len(overtaken) - 1) % 2, overtaken[-1][1])


def test_two_first_reconciliations_that_overlap_keep_the_larger_count_when_both_create_the_pool(session):
    """Found by the explorer (swarm seed 1857508604): right after a deploy, no pool yet; tick A and
    tick C both read the ledger (no pool), A lists an execution started by hand (1 outside), C's
    listing, numbered after A's but begun before it was numbered, shows none. A creates the pool at
    MAX − 1; C's create loses, and its write must merge with A's count (the listings overlap: the
    larger stands), not replace it as a newer one because its number is higher."""
    client = session.client("dynamodb")
    create_table(client, "first")
    a = DynamoStore(client, "first", retention_seconds=3600)
    c = DynamoStore(session.client("dynamodb"), "first", retention_seconds=3600)
    a.ledger(), c.ledger()  # both read: no pool yet
    c_before, a_before = c.next_count(), a.next_count()
    a_numbers = (a_before, a.next_count())  # A lists after X started: 1 outside
    c_numbers = (c_before, c.next_count())  # C listed before X started: 0, numbered last
    assert a.set_limit(source(1, a_numbers)) == 3
    assert c.set_limit(source(0, c_numbers)) == 3
    assert DynamoStore(session.client("dynamodb"), "first").ledger().in_force == 3


# -- an adoption never leaves caps that admit past the limit -------------------------------------------


def full_with_a_redriven_run(store, limit: int = 4) -> str:
    """``limit`` holders (the pool full) and ``z``, released earlier, now running again."""
    claim(store, "kz", "z", limit=limit)
    store.release("z", Ending(PayloadState.FAILED, NOW))
    for i in range(limit):
        claim(store, f"k{i}", f"n{i}", limit=limit)
    return "z"


def admitted(store, tries: int, limit: int = 4, prefix: str = "new") -> int:
    count = 0
    for i in range(tries):
        try:
            claim(store, f"{prefix}{i}", f"{prefix}{i}", limit=limit)
            count += 1
        except SlotsFull:
            pass
    return count


def test_an_adoption_into_a_full_pool_admits_nothing_until_the_holders_are_under_the_limit(store):
    z = full_with_a_redriven_run(store)
    assert store.adopt(name=z, now=NOW + 1)  # 5 run under 4
    for i in range(4):  # whichever shard each end frees
        store.release(f"n{i}", Ending(PayloadState.SUCCEEDED, NOW + 2 + i))
        running = len(store.ledger().holders)
        assert admitted(store, 3, prefix=f"after{i}-") == max(0, 4 - running)
        assert len(store.ledger().holders) == max(4, running)


def test_an_adoption_with_room_takes_a_free_slot_and_moves_no_cap(store):
    claim(store, "kz", "z", limit=4)
    store.release("z", Ending(PayloadState.FAILED, NOW))
    for i in range(3):
        claim(store, f"k{i}", f"n{i}", limit=4)
    assert store.adopt(name="z", now=NOW + 1)  # 4 of 4
    assert admitted(store, 3) == 0
    store.release("n0", Ending(PayloadState.SUCCEEDED, NOW + 2))
    assert admitted(store, 3, prefix="later") == 1


def thaw_as_admission_does(store, lane: str, limit: int) -> None:
    """Lane admission re-plans a frozen lane whose runs fit under its limit again (and only then)."""
    room = store.lane_rooms([lane])[lane]
    if room.frozen and room.running < limit:
        store.thaw_lane(lane)


def test_an_adoption_into_a_full_lane_admits_nothing_in_it_until_under_its_limit(store):
    """The same in a lane's pool (``sluice.features.lanes``): the lane's caps bound its holders too."""
    store.set_lane_limit("gpu", 4, 0.0)
    claim(store, "kz", "z", limit=10, lane="gpu")
    store.release("z", Ending(PayloadState.FAILED, NOW))
    for i in range(4):
        claim(store, f"k{i}", f"n{i}", limit=10, lane="gpu")
    assert store.adopt(name="z", now=NOW + 1)  # 5 run in a lane of 4
    for i in range(4):
        store.release(f"n{i}", Ending(PayloadState.SUCCEEDED, NOW + 2 + i))
        running = store.lane_rooms(["gpu"])["gpu"].running
        thaw_as_admission_does(store, "gpu", 4)
        got = 0
        for j in range(3):
            try:
                claim(store, f"l{i}-{j}", f"l{i}-{j}", limit=10, lane="gpu")
                got += 1
            except SlotsFull:
                pass
        assert got == max(0, 4 - running)
        assert store.lane_rooms(["gpu"])["gpu"].running == max(4, running)


# -- DynamoDB: the adopter dies right after the adoption's transaction -----------------------------------


def crash_after_the_adoption(client) -> Counter:
    """Die right after the transaction that adopts (its record gets ``adopted_at``) took effect."""
    seen: Counter = Counter()

    def before(params, context, **_):
        # The update that stamps it (a release's condition names ``adopted_at`` too: as read).
        context["adoption"] = "adopted_at = :now" in str(params.get("body", ""))

    def after(http_response, context, **_):
        if context.get("adoption") and http_response.status_code < 300:
            seen["crashed"] += 1
            raise Crash("stopped after the adoption's transaction")

    client.meta.events.register("before-call.dynamodb.TransactWriteItems", before)
    client.meta.events.register("after-call.dynamodb.TransactWriteItems", after)
    return seen


@pytest.mark.parametrize("lane", [None, "gpu"])
def test_an_adopter_that_dies_before_it_plans_again_leaves_caps_that_admit_nothing_past_the_limit(
    session, lane
):
    client = session.client("dynamodb")
    create_table(client, "adoption")
    store = DynamoStore(client, "adoption", slots_per_shard=2)
    limit = 4 if lane is None else 10
    extra = {} if lane is None else {"lane": lane}
    if lane is not None:
        store.set_lane_limit(lane, 4, 0.0)
    claim(store, "kz", "z", limit=limit, **extra)
    store.release("z", Ending(PayloadState.FAILED, NOW))
    for i in range(4):
        claim(store, f"k{i}", f"n{i}", limit=limit, **extra)
    died = crash_after_the_adoption(client)
    with pytest.raises(Crash):
        store.adopt(name="z", now=NOW + 1)
    assert died["crashed"] == 1
    fresh = DynamoStore(client, "adoption", slots_per_shard=2)  # the next container
    assert "z" in fresh.ledger().holders

    def shard(name: str) -> int | None:
        record = fresh.execution(name)
        return record.shard if lane is None else record.lane_shard

    # The other shards' ends first: the adopted run's shard stays past its cap.
    ending = sorted((f"n{i}" for i in range(4)), key=lambda n: (shard(n) == shard("z"), n))
    for i, name in enumerate(ending):
        fresh.release(name, Ending(PayloadState.SUCCEEDED, NOW + 2 + i))
        running = 4 - i  # z and the n's left
        if lane is not None:
            thaw_as_admission_does(fresh, lane, 4)
        got = 0
        for j in range(3):
            try:
                claim(fresh, f"m{i}-{j}", f"m{i}-{j}", limit=limit, **extra)
                got += 1
            except SlotsFull:
                pass
        assert got == max(0, 4 - running), f"{got} admitted beside {running} running under 4"
        for j in range(got):
            fresh.release(f"m{i}-{j}", Ending(PayloadState.SUCCEEDED, NOW + 2 + i))


def test_a_limit_above_ten_thousand_is_refused_before_any_plan():
    """``set-max 5000000000000`` once made the planner build a list of caps per shard until memory
    ran out; the planner refuses a limit above maxConcurrency's ceiling with a clear error instead."""
    with pytest.raises(ValueError, match="10000"):
        plan_caps(5_000_000_000_000, 8, [(4, 2)])
    assert plan_caps(10_000, 8, []).shard_count == 1250


def test_a_lost_create_that_replaces_the_count_is_caught(session, monkeypatch):
    """The variant ``pool_create_unmerged`` (tests/explorer/broken.py, the code before explorer seed
    1857508604's fix) fails the two first reconciliations above."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["pool_create_unmerged"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError):
        test_two_first_reconciliations_that_overlap_keep_the_larger_count_when_both_create_the_pool(session)


def test_a_take_between_a_thaws_read_and_its_write_is_seen_by_the_plan(session):
    """The pool frozen (limit 1, two shards of one holder). A planner thaws it: it reads the pool,
    then, before its write, an adopter takes a slot on the shard the plan leaves at cap 0. The
    planner's write must not land as planned: no shard may be left past its cap beside a free cap."""
    import zlib

    from sluice.adapters.dynamo.slots import DynamoSlots
    from sluice.primitives.slots import Capacity
    from tests.reliability.promises import pool_ceilings

    planner_client, adopter_client = session.client("dynamodb"), session.client("dynamodb")
    create_table(planner_client, "thaw")
    planner = DynamoSlots(planner_client, "thaw", per_shard=1)
    adopter = DynamoSlots(adopter_client, "thaw", per_shard=1)
    planner.set_limit(Capacity("launcher", 2))
    planner.set_limit(Capacity("launcher", 1))
    planner.freeze("launcher")
    took: list[str] = []

    def take_first(params: dict, **_: object) -> None:
        if took:
            return
        raised = {i["Update"]["Key"]["pk"]["S"] for i in params["TransactItems"] if "Update" in i}
        shard = next(s for s in range(2) if f"SLOTS#launcher#{s}" not in raised)
        name = next(f"r{i}" for i in range(100) if zlib.crc32(f"r{i}".encode()) % 2 == shard)
        _, items = adopter.adoption("launcher", name, NOW, adopter.occupancy("launcher"))
        adopter_client.transact_write_items(TransactItems=items)
        took.append(name)

    planner_client.meta.events.register("before-parameter-build.dynamodb.TransactWriteItems", take_first)
    planner.rebalance("launcher")
    assert took, "the adopter's take never ran between the thaw's read and its write"
    items = {
        item["pk"]["S"]: item for item in planner_client.scan(TableName="thaw", ConsistentRead=True)["Items"]
    }
    assert took[0] in items[f"SLOTS#launcher#{zlib.crc32(took[0].encode()) % 2}"]["holders"]["M"]
    assert pool_ceilings(items) == []


def test_a_take_that_leaves_the_version_is_caught(session, monkeypatch):
    """The variant ``take_unversioned`` (tests/explorer/broken.py, the code before explorer seed
    997296974's fix) fails the race above: the thaw lands beside the take."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["take_unversioned"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError, match="admits past its limit"):
        test_a_take_between_a_thaws_read_and_its_write_is_seen_by_the_plan(session)
