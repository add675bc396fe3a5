"""The slots suite catches what it exists to catch: broken variants of the slots primitive, each patched
in for the length of one test, must make the contract (tests/contract/test_slots_contract.py) or the
planning properties (tests/unit/test_slots_plan.py) fail.

Each variant is run against the test functions that pin it down, called directly: they pass on the
slots as they are and must each fail with the variant in place. A variant of the shared code
(``sluice.primitives.slots``) runs on both adapters; a variant of one adapter runs on that adapter. The memory
adapter plans and writes a change under one lock, so a variant that only shows while a change is half
written (the order of its writes, a condition against claims racing it) has no memory form.

A variant is caught only by a failed assertion, or by a refusal (``SlotsFull``) the contract expects
and does not get (``pytest.raises`` then fails): any other error fails the test, so a variant cannot
pass by crashing a scenario. Scenarios with claimers in threads are left out: a claim judged by the
wrong shard can keep a claimer retrying forever.

Two planning variants never reach DynamoDB: caps below a shard's holders outside a freeze (the freeze
dropped, or holders not counted while frozen) fail the cap write's ``size(holders) <= :new`` every
time, and the change gives up (``refused_by_the_cap_condition`` checks that, and that the table never
holds an unfrozen shard over its cap). The memory adapter has no such condition and the contract
catches them there.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import Phase, settings

import sluice.adapters.dynamo.slots as dynamo_slots
import sluice.adapters.memory.slots as memory_slots
import sluice.primitives.slots
import tests.contract.slots_fixtures as slots_fixtures
import tests.contract.test_slots_contract as contract
import tests.unit.test_slots_plan as properties
from sluice.adapters.dynamo.slots import HAS_HOLDERS, DynamoSlots, shard_pk
from sluice.adapters.dynamo.store import create_table
from sluice.adapters.memory.slots import MemorySlots
from sluice.core.errors import SlotsFull, TransientError
from sluice.primitives.slots import Move, Plan
from tests.contract.slots_fixtures import TABLE, Harness

CAUGHT = (AssertionError, pytest.fail.Exception)  # the second: an expected SlotsFull did not come
QUICK = {
    "database": None,
    "derandomize": True,
    "deadline": None,
    "report_multiple_bugs": False,
    "phases": (Phase.explicit, Phase.generate),
}
# Modules that bind a name of sluice.primitives.slots a variant replaces (the adapters and tests import by name).
BINDERS = (sluice.primitives.slots, dynamo_slots, memory_slots, contract, slots_fixtures, properties)
PATCHED = (
    *((module, "plan_caps") for module in (sluice.primitives.slots, dynamo_slots, memory_slots, properties)),
    (sluice.primitives.slots, "_raise"),
    (sluice.primitives.slots, "_lower"),
    (dynamo_slots, "claim_item"),
    (dynamo_slots, "release_item"),
    (dynamo_slots, "swap_item"),
    (DynamoSlots, "claim"),
    (DynamoSlots, "release"),
    (DynamoSlots, "_cap_item"),
    (MemorySlots, "claim"),
    (MemorySlots, "release"),
    (MemorySlots, "swap"),
)
ORIGINALS = {(owner, name): getattr(owner, name) for owner, name in PATCHED}
SHARDS_PER_TRANSACTION = dynamo_slots.SHARDS_PER_TRANSACTION  # lowered by one contract test
PROPERTY_SETTINGS = {
    test: test._hypothesis_internal_use_settings
    for test in vars(properties).values()
    if getattr(test, "is_hypothesis_test", False)
}
plan_caps = sluice.primitives.slots.plan_caps
BOTH = pytest.mark.parametrize("kind", ["memory", "dynamodb"])


def everywhere(monkeypatch: pytest.MonkeyPatch, name: str, variant: Callable[..., Any]) -> None:
    """``variant`` in place of ``sluice.primitives.slots.<name>`` wherever that is bound."""
    original = getattr(sluice.primitives.slots, name)
    for module in BINDERS:
        if getattr(module, name, None) is original:
            monkeypatch.setattr(module, name, variant)


def caught(scenario: Callable[..., None], *args: Any) -> BaseException:
    """``scenario`` fails on an assertion. A property runs derandomised, unshrunk, without the example database."""
    with pytest.MonkeyPatch.context() as m:
        if getattr(scenario, "is_hypothesis_test", False):
            own = scenario._hypothesis_internal_use_settings  # type: ignore[attr-defined]
            m.setattr(scenario, "_hypothesis_internal_use_settings", settings(own, **QUICK))
        with pytest.raises(CAUGHT) as failure:
            scenario(*args)
    print(f"{scenario.__name__}: {type(failure.value).__name__}: {failure.value}")
    return failure.value


@pytest.fixture
def fresh(session) -> Callable[[str], Harness]:
    """A new store per call: a MemorySlots of its own, or the contract's table made anew in moto."""
    client = session.client("dynamodb")

    def make(kind: str) -> Harness:
        if kind == "memory":
            return Harness("memory")
        with contextlib.suppress(client.exceptions.ResourceNotFoundException):
            client.delete_table(TableName=TABLE)
        create_table(client, TABLE)
        return Harness("dynamodb", client)

    return make


# -- 1. caps adding up to more than the limit --------------------------------------------------------


def spare_to_every_lowest_shard(base: list[int], old: list[int], limit: int, per_shard: int) -> list[int]:
    """A raise that hands the last slots to every lowest shard, not to as many as the limit leaves."""
    caps = ORIGINALS[sluice.primitives.slots, "_raise"](base, old, limit, per_shard)
    low = min(caps)
    return [c + 1 if c == low and c < per_shard else c for c in caps]


@BOTH
def test_a_raise_past_the_limit_is_caught(fresh, monkeypatch, kind):
    everywhere(monkeypatch, "_raise", spare_to_every_lowest_shard)
    caught(contract.test_set_limit_lays_out_caps_that_add_up_to_the_limit, fresh(kind))
    caught(contract.test_raising_and_lowering_keep_the_sum_and_evict_nobody, fresh(kind))


def test_a_raise_past_the_limit_breaks_the_planning_properties(monkeypatch):
    everywhere(monkeypatch, "_raise", spare_to_every_lowest_shard)
    caught(properties.test_caps_cover_holders_and_add_up_to_the_limit_unless_frozen)
    caught(properties.test_a_raise_fills_the_lowest_shards_and_grows_the_count)


def lower_keeping_the_excess(base: list[int], old: list[int], held: list[int], limit: int) -> list[int]:
    """A lowering that cuts the highest shards to the level and keeps what the level holds too much."""

    def cut(level: int) -> int:
        return sum(max(h, min(b, level)) for b, h in zip(base, held, strict=True))

    level = min(lv for lv in range(max(base) + 1) if cut(lv) >= limit)
    return [max(h, min(b, level)) for b, h in zip(base, held, strict=True)]


@BOTH
def test_a_lowering_that_stays_above_the_limit_is_caught(fresh, monkeypatch, kind):
    everywhere(monkeypatch, "_lower", lower_keeping_the_excess)
    caught(contract.test_raising_and_lowering_keep_the_sum_and_evict_nobody, fresh(kind))


def test_a_lowering_that_stays_above_the_limit_breaks_the_planning_properties(monkeypatch):
    everywhere(monkeypatch, "_lower", lower_keeping_the_excess)
    caught(properties.test_caps_cover_holders_and_add_up_to_the_limit_unless_frozen)
    caught(properties.test_a_change_writes_as_few_shards_as_it_can)


def increases_first(limit: int, per_shard: int, loads: Any) -> Plan:
    """Moves ordered increases first: written one transaction after another, the caps pass the limit."""
    plan = plan_caps(limit, per_shard, loads)
    return dataclasses.replace(plan, moves=tuple(sorted(plan.moves, key=lambda m: m.decrease)))


def in_shard_order(limit: int, per_shard: int, loads: Any) -> Plan:
    """The DynamoDB adapter writing the moves by shard index, whichever way each goes."""
    plan = plan_caps(limit, per_shard, loads)
    return dataclasses.replace(plan, moves=tuple(sorted(plan.moves, key=lambda m: m.shard)))


def test_increases_written_before_decreases_are_caught(fresh, session, monkeypatch):
    everywhere(monkeypatch, "plan_caps", increases_first)
    caught(properties.test_moves_are_the_changed_shards_decreases_first)
    caught(properties.test_writing_the_moves_in_order_never_lifts_the_sum_above_old_or_new)
    caught(
        contract.test_a_change_in_several_transactions_writes_decreases_first,
        fresh("dynamodb").client,
        session,
        monkeypatch,
    )


def test_the_dynamodb_adapter_writing_moves_in_shard_order_is_caught(fresh, session, monkeypatch):
    monkeypatch.setattr(dynamo_slots, "plan_caps", in_shard_order)
    caught(
        contract.test_a_change_in_several_transactions_writes_decreases_first,
        fresh("dynamodb").client,
        session,
        monkeypatch,
    )


def static_caps_below_the_holders(limit: int, per_shard: int, loads: Any) -> Plan:
    """No freeze: lowering below the holders splits the limit as if nobody ran (a shard over its cap,
    another that drains admits while the pool still runs more than the limit)."""
    plan = plan_caps(limit, per_shard, loads)
    return plan_caps(limit, per_shard, [(c, 0) for c, _ in loads]) if plan.frozen else plan


def frozen_to_static_caps(limit: int, per_shard: int, loads: Any) -> Plan:
    """The pool marked frozen, but its caps split the limit instead of going to 0. The DynamoDB adapter
    writes a freeze without the holders condition, so these caps reach the table."""
    plan = plan_caps(limit, per_shard, loads)
    if not plan.frozen:
        return plan
    static = plan_caps(limit, per_shard, [(c, 0) for c, _ in loads])
    return dataclasses.replace(static, frozen=True)


def test_dropping_the_freeze_is_caught(fresh, monkeypatch):
    everywhere(monkeypatch, "plan_caps", static_caps_below_the_holders)
    caught(properties.test_caps_cover_holders_and_add_up_to_the_limit_unless_frozen)
    caught(properties.test_lowering_below_the_holders_freezes_and_holders_fitting_again_unfreeze)
    caught(contract.test_lowering_below_the_holders_freezes_until_rebalance, fresh("memory"))
    caught(contract.test_swap_admits_nothing_while_frozen, fresh("memory"))
    # DynamoDB: each cap below its shard's holders fails the write's condition, so the change is never
    # written and set_limit gives up; the scenario fails on that, not on an assertion.
    refused_by_the_cap_condition(
        contract.test_lowering_below_the_holders_freezes_until_rebalance, fresh("dynamodb")
    )


@BOTH
def test_freezing_to_static_caps_is_caught(fresh, monkeypatch, kind):
    everywhere(monkeypatch, "plan_caps", frozen_to_static_caps)
    caught(contract.test_lowering_below_the_holders_freezes_until_rebalance, fresh(kind))


def test_freezing_to_static_caps_breaks_the_planning_properties(monkeypatch):
    everywhere(monkeypatch, "plan_caps", frozen_to_static_caps)
    caught(properties.test_caps_cover_holders_and_add_up_to_the_limit_unless_frozen)
    caught(properties.test_lowering_below_the_holders_freezes_and_holders_fitting_again_unfreeze)


def refused_by_the_cap_condition(scenario: Callable[..., None], harness: Harness) -> None:
    """On DynamoDB a cap is written only ``IF size(holders) <= :new`` (a freeze aside): a variant that
    plans a cap below a shard's holders is refused round after round, set_limit or rebalance gives up
    (TransientError), and the table never shows an unfrozen shard over its cap."""
    with pytest.raises(TransientError, match="kept changing"):
        scenario(harness)
    view = harness.snapshot(None, contract.P)
    assert (view.frozen and view.caps == 0) or all(s.size <= s.cap for s in view.shards), view


# -- 2. a claim checked against the wrong shard ------------------------------------------------------


def claim_item_on_the_neighbour(table: str, pool: str, shard: int, name: str, now: float) -> dict[str, Any]:
    """The claim's write (and so its condition) goes to the shard next to the one picked."""
    return ORIGINALS[dynamo_slots, "claim_item"](table, pool, shard ^ 1, name, now)


def test_a_dynamodb_claim_written_to_another_shard_is_caught(fresh, monkeypatch):
    monkeypatch.setattr(dynamo_slots, "claim_item", claim_item_on_the_neighbour)
    caught(contract.test_a_claim_is_judged_by_its_own_shard, fresh("dynamodb"))


def dynamo_claim_judged_by_the_neighbour(
    self: DynamoSlots, pool: str, shard: int, name: str, now: float
) -> None:
    """The room is checked on the neighbouring shard (a ConditionCheck beside the write)."""
    judge = {
        "ConditionCheck": {
            "TableName": self.table,
            "Key": {"pk": {"S": shard_pk(pool, shard ^ 1)}},
            "ConditionExpression": HAS_HOLDERS + "size(holders) < cap",
        }
    }
    take = ORIGINALS[dynamo_slots, "claim_item"](self.table, pool, shard, name, now)
    take["Update"]["ConditionExpression"] = "attribute_not_exists(holders.#n)"
    if self._transact([judge, take]) is not None:
        raise SlotsFull(0)


def test_a_dynamodb_claim_judged_by_another_shard_is_caught(fresh, monkeypatch):
    monkeypatch.setattr(DynamoSlots, "claim", dynamo_claim_judged_by_the_neighbour)
    caught(contract.test_a_claim_is_judged_by_its_own_shard, fresh("dynamodb"))


def memory_claim_judged_by_the_neighbour(
    self: MemorySlots, pool: str, shard: int, name: str, now: float
) -> None:
    with self._lock:
        item, judge = self._shard(pool, shard), self._shard(pool, shard ^ 1)
        if item is not None and name in item.holders:
            return
        if item is None or judge is None or len(judge.holders) >= judge.cap:
            raise SlotsFull(0)
        item.holders[name] = now


def test_a_memory_claim_judged_by_another_shard_is_caught(fresh, monkeypatch):
    monkeypatch.setattr(MemorySlots, "claim", memory_claim_judged_by_the_neighbour)
    caught(contract.test_a_claim_is_judged_by_its_own_shard, fresh("memory"))


# -- 3. a cap written without checking the holders ---------------------------------------------------


def cap_item_without_the_holders(self: DynamoSlots, pool: str, move: Move, exists: bool, freeze: bool) -> Any:
    """``SET cap = :new IF cap = :old``: a claim between the planner's read and write goes unseen."""
    item = ORIGINALS[DynamoSlots, "_cap_item"](self, pool, move, exists, freeze)
    if exists and not freeze:
        item["Update"]["ConditionExpression"] = "cap = :old"
    return item


@pytest.mark.parametrize(("late", "caps", "frozen"), [(1, (2, 1, 0), False), (2, (0, 0, 0), True)])
def test_a_cap_written_without_the_holders_condition_is_caught(
    fresh, session, monkeypatch, late, caps, frozen
):
    monkeypatch.setattr(DynamoSlots, "_cap_item", cap_item_without_the_holders)
    scenario = contract.test_a_claim_landing_between_the_planners_read_and_write_makes_it_plan_again
    caught(scenario, fresh("dynamodb").client, session, late, caps, frozen)


# -- 4. releases not fenced by the holder's name -----------------------------------------------------


def by_count(release: Callable[..., bool]) -> Callable[..., bool]:
    """A release that frees a slot on the shard whoever holds it: a count, not a name."""

    def release_any(self: Any, pool: str, shard: int, name: str) -> bool:
        if release(self, pool, shard, name):
            return True
        others = sorted(h for s in self.occupancy(pool).shards if s.index == shard for h in s.holders)
        return bool(others) and release(self, pool, shard, others[0])

    return release_any


@BOTH
def test_a_release_of_someone_elses_slot_is_caught(fresh, monkeypatch, kind):
    adapter = MemorySlots if kind == "memory" else DynamoSlots
    monkeypatch.setattr(adapter, "release", by_count(ORIGINALS[adapter, "release"]))
    caught(contract.test_a_release_frees_once, fresh(kind))


def release_item_unfenced(table: str, pool: str, shard: int, name: str) -> dict[str, Any]:
    item = ORIGINALS[dynamo_slots, "release_item"](table, pool, shard, name)
    del item["Update"]["ConditionExpression"]
    return item


def memory_release_unfenced(self: MemorySlots, pool: str, shard: int, name: str) -> bool:
    with self._lock:
        item = self._shard(pool, shard)
        if item is None:
            return False
        item.holders.pop(name, None)
        return True


@BOTH
def test_a_release_that_does_not_ask_who_holds_is_caught(fresh, monkeypatch, kind):
    """It frees nobody else's slot, but says it freed one: a caller counts a slot that was not there."""
    if kind == "memory":
        monkeypatch.setattr(MemorySlots, "release", memory_release_unfenced)
    else:
        monkeypatch.setattr(dynamo_slots, "release_item", release_item_unfenced)
    caught(contract.test_a_release_frees_once, fresh(kind))
    caught(contract.test_a_claim_is_judged_by_its_own_shard, fresh(kind))


def swap_item_unfenced(table: str, pool: str, shard: int, old: str, new: str, now: float) -> dict[str, Any]:
    item = ORIGINALS[dynamo_slots, "swap_item"](table, pool, shard, old, new, now)
    update = item["Update"]
    fenced = update["ConditionExpression"]
    update["ConditionExpression"] = fenced.replace("attribute_exists(holders.#old) AND ", "")
    assert update["ConditionExpression"] != fenced
    return item


def memory_swap_unfenced(self: MemorySlots, pool: str, shard: int, old: str, new: str, now: float) -> bool:
    with self._lock:
        item = self._shard(pool, shard)
        if item is None:
            return False
        if new in item.holders:
            return old not in item.holders
        if len(item.holders) > item.cap:
            raise SlotsFull(item.cap)
        item.holders.pop(old, None)
        item.holders[new] = now
        return True


@BOTH
def test_a_swap_not_fenced_by_the_old_holder_is_caught(fresh, monkeypatch, kind):
    """Handing over a slot nobody held admits the new holder past the shard's cap."""
    if kind == "memory":
        monkeypatch.setattr(MemorySlots, "swap", memory_swap_unfenced)
    else:
        monkeypatch.setattr(dynamo_slots, "swap_item", swap_item_unfenced)
    caught(contract.test_swap_hands_the_slot_over_and_keeps_the_count, fresh(kind))


# -- 5. rebalance unfreezing before the holders fit --------------------------------------------------


def thaw_one_early(limit: int, per_shard: int, loads: Any) -> Plan:
    """Frozen only while the holders pass the limit by more than one."""
    plan = plan_caps(limit, per_shard, loads)
    if plan.frozen and sum(h for _, h in loads) == limit + 1:
        return dataclasses.replace(plan_caps(limit + 1, per_shard, loads), limit=limit)
    return plan


@BOTH
def test_unfreezing_one_holder_early_is_caught(fresh, monkeypatch, kind):
    everywhere(monkeypatch, "plan_caps", thaw_one_early)
    caught(contract.test_lowering_below_the_holders_freezes_until_rebalance, fresh(kind))


def test_unfreezing_one_holder_early_breaks_the_planning_properties(monkeypatch):
    everywhere(monkeypatch, "plan_caps", thaw_one_early)
    caught(properties.test_the_freeze_starts_exactly_when_the_holders_pass_the_limit)
    caught(properties.test_lowering_below_the_holders_freezes_and_holders_fitting_again_unfreeze)


def holders_within_their_caps(limit: int, per_shard: int, loads: Any) -> Plan:
    """An adapter counting a shard's holders only up to its cap: frozen shards (cap 0) look empty, so
    the first rebalance unfreezes whatever still runs."""
    return plan_caps(limit, per_shard, [(c, min(h, c)) for c, h in loads])


def test_a_rebalance_that_does_not_count_frozen_holders_is_caught(fresh, monkeypatch):
    monkeypatch.setattr(memory_slots, "plan_caps", holders_within_their_caps)
    caught(contract.test_lowering_below_the_holders_freezes_until_rebalance, fresh("memory"))
    # DynamoDB: the caps it plans are below the holders of some shard, so the unfreeze is never written
    # (unfreezing early there needs caps adding up to more than the limit: the variant above).
    monkeypatch.setattr(dynamo_slots, "plan_caps", holders_within_their_caps)
    refused_by_the_cap_condition(
        contract.test_lowering_below_the_holders_freezes_until_rebalance, fresh("dynamodb")
    )


# -- the catalogue itself ----------------------------------------------------------------------------


def test_every_variant_is_restored_after_its_test(fresh, session):
    """monkeypatch undoes each variant: everything patched above is the original, and passes."""
    for (owner, name), original in ORIGINALS.items():
        assert getattr(owner, name) is original, (owner, name)
    assert dynamo_slots.SHARDS_PER_TRANSACTION == SHARDS_PER_TRANSACTION
    for test, own in PROPERTY_SETTINGS.items():
        assert test._hypothesis_internal_use_settings is own, test.__name__
    for kind in ("memory", "dynamodb"):
        contract.test_lowering_below_the_holders_freezes_until_rebalance(fresh(kind))
        contract.test_a_claim_is_judged_by_its_own_shard(fresh(kind))
        contract.test_a_release_frees_once(fresh(kind))
        contract.test_swap_hands_the_slot_over_and_keeps_the_count(fresh(kind))
    with pytest.MonkeyPatch.context() as m:
        contract.test_a_change_in_several_transactions_writes_decreases_first(
            fresh("dynamodb").client, session, m
        )
    properties.test_lowering_below_the_holders_freezes_and_holders_fitting_again_unfreeze()
    properties.test_a_change_writes_as_few_shards_as_it_can()


def test_a_variant_that_crashes_the_scenario_is_not_counted_as_caught(fresh, monkeypatch):
    def broken(self: Any, *_: Any) -> None:
        raise RuntimeError("not a broken contract")

    monkeypatch.setattr(MemorySlots, "claim", broken)
    with pytest.raises(RuntimeError):
        caught(contract.test_a_claim_is_judged_by_its_own_shard, fresh("memory"))
