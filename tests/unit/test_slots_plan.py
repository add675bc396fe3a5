"""The slots' pure parts: cap planning (Hypothesis properties), shard choice and sampling."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.primitives.slots import (
    LOOK_SHARDS,
    Capacity,
    Occupancy,
    Shard,
    candidates,
    check_pool,
    pick,
    plan_caps,
    sample_shards,
    shards_needed,
)

per_shards = st.integers(min_value=1, max_value=10)
limits = st.integers(min_value=0, max_value=120)
# Any state a pool can be read in, also a half-written one: caps and holders unrelated.
loads = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12)), max_size=24)


@st.composite
def valid_pools(draw):
    """A pool at rest: caps cover holders, add up to the limit, none above per_shard."""
    per_shard = draw(per_shards)
    limit = draw(limits)
    count = shards_needed(limit, per_shard) + draw(st.integers(0, 3))
    caps = [0] * count
    for _ in range(limit):
        caps[draw(st.sampled_from([i for i in range(count) if caps[i] < per_shard]))] += 1
    held = [draw(st.integers(0, c)) for c in caps]
    return limit, per_shard, list(zip(caps, held, strict=True))


@given(limits, per_shards, loads)
def test_caps_cover_holders_and_add_up_to_the_limit_unless_frozen(limit, per_shard, shards):
    plan = plan_caps(limit, per_shard, shards)
    held = [h for _, h in shards]
    assert plan.shard_count == max(len(shards), shards_needed(limit, per_shard))
    assert plan.frozen == (sum(held) > limit)
    if plan.frozen:
        assert set(plan.caps) == {0}  # nothing admitted anywhere until the holders fit
    else:
        assert sum(plan.caps) == limit
        assert all(c >= h for c, h in zip(plan.caps, held, strict=False))  # no shard over its cap


@given(loads, per_shards, st.integers(-2, 2))
def test_the_freeze_starts_exactly_when_the_holders_pass_the_limit(shards, per_shard, delta):
    """At the boundary, where a random limit seldom lands: one holder above the limit freezes, the
    holders fitting exactly do not."""
    held = sum(h for _, h in shards)
    limit = max(0, held + delta)
    plan = plan_caps(limit, per_shard, shards)
    assert plan.frozen == (held > limit)
    if not plan.frozen:
        assert sum(plan.caps) == limit


@given(limits, per_shards, loads)
def test_moves_are_the_changed_shards_decreases_first(limit, per_shard, shards):
    plan = plan_caps(limit, per_shard, shards)
    old = [c for c, _ in shards] + [0] * (plan.shard_count - len(shards))
    assert {m.shard: (m.old, m.new) for m in plan.moves} == {
        i: (o, n) for i, (o, n) in enumerate(zip(old, plan.caps, strict=True)) if o != n
    }
    kinds = [m.decrease for m in plan.moves]
    assert kinds == sorted(kinds, reverse=True)
    assert len({m.shard for m in plan.moves}) == len(plan.moves)


@given(limits, per_shards, loads)
def test_writing_the_moves_in_order_never_lifts_the_sum_above_old_or_new(limit, per_shard, shards):
    plan = plan_caps(limit, per_shard, shards)
    total = start = sum(c for c, _ in shards)
    for move in plan.moves:
        total += move.new - move.old
        assert total <= max(start, sum(plan.caps))
    assert total == sum(plan.caps)


@given(limits, per_shards, loads)
def test_planning_again_moves_nothing(limit, per_shard, shards):
    plan = plan_caps(limit, per_shard, shards)
    held = [h for _, h in shards] + [0] * (plan.shard_count - len(shards))
    again = plan_caps(limit, per_shard, list(zip(plan.caps, held, strict=True)))
    assert again.moves == () and again.caps == plan.caps and again.frozen == plan.frozen


@given(valid_pools(), limits)
def test_from_rest_a_raise_only_increases_and_a_lowering_only_decreases(pool, new_limit):
    limit, per_shard, shards = pool
    plan = plan_caps(new_limit, per_shard, shards)
    if plan.frozen:
        assert sum(h for _, h in shards) > new_limit
        assert all(m.decrease for m in plan.moves)
        return
    if new_limit >= limit:
        assert not any(m.decrease for m in plan.moves)
    else:
        assert all(m.decrease for m in plan.moves)
    assert max(plan.caps) <= per_shard  # an item keeps at most per_shard holders


@given(limits, per_shards)
def test_a_new_pool_is_spread_evenly(limit, per_shard):
    plan = plan_caps(limit, per_shard, [])
    assert plan.shard_count == shards_needed(limit, per_shard)
    assert max(plan.caps) - min(plan.caps) <= 1 and max(plan.caps) <= per_shard
    assert [m.shard for m in plan.moves] == [i for i, c in enumerate(plan.caps) if c]


def test_a_raise_fills_the_lowest_shards_and_grows_the_count():
    plan = plan_caps(7, 3, [(3, 3), (3, 1)])
    assert plan.caps == (3, 3, 1) and not plan.frozen
    assert [(m.shard, m.old, m.new) for m in plan.moves] == [(2, 0, 1)]
    assert plan_caps(12, 3, [(3, 3), (3, 1)]).caps == (3, 3, 3, 3)


def test_a_lowering_cuts_the_highest_shards_and_keeps_the_count():
    plan = plan_caps(3, 2, [(2, 0), (2, 2), (2, 1), (0, 0)])
    assert plan.caps == (0, 2, 1, 0) and plan.shard_count == 4
    assert all(m.decrease for m in plan.moves)


def test_lowering_below_the_holders_freezes_and_holders_fitting_again_unfreeze():
    frozen = plan_caps(3, 3, [(3, 3), (2, 2)])
    assert frozen.frozen and frozen.caps == (0, 0)
    assert [(m.old, m.new) for m in frozen.moves] == [(3, 0), (2, 0)]
    still = plan_caps(3, 3, [(0, 3), (0, 1)])  # one left, four still run
    assert still.frozen and still.moves == ()
    thawed = plan_caps(3, 3, [(0, 3), (0, 0)])  # holders fit exactly: caps are the holders
    assert not thawed.frozen and thawed.caps == (3, 0)


def test_a_half_written_change_is_completed():
    # A change to 4 stopped after its decreases: caps sum to 2, shard 1 under its holders.
    plan = plan_caps(4, 2, [(0, 0), (1, 2), (1, 1)])
    assert not plan.frozen and sum(plan.caps) == 4
    assert plan.caps[1] >= 2 and plan.caps[2] >= 1


@settings(max_examples=200)
@given(valid_pools(), limits, st.randoms(use_true_random=False))
def test_claims_racing_a_change_never_pass_max_of_old_and_new(pool, new_limit, rng):
    """Moves written one at a time (the multi-transaction case) with claims and releases between
    them; a move whose condition fails stops the change (the adapter plans again)."""
    limit, per_shard, shards = pool
    caps = [c for c, _ in shards]
    held = [h for _, h in shards]
    plan = plan_caps(new_limit, per_shard, shards)
    caps += [0] * (plan.shard_count - len(caps))
    held += [0] * (plan.shard_count - len(held))
    bound = max(limit, new_limit)
    for move in plan.moves:
        for _ in range(rng.randint(0, 3)):
            i = rng.randrange(len(caps))
            if rng.random() < 0.5 and held[i] < caps[i]:
                held[i] += 1  # a claim: size(holders) < cap
            elif held[i]:
                held[i] -= 1  # a release
            assert sum(held) <= bound
        if not plan.frozen and held[move.shard] > move.new:
            break  # IF size(holders) <= :new failed: read again, plan again
        caps[move.shard] = move.new
        assert sum(caps) <= max(limit, sum(plan.caps))
    assert sum(held) <= bound


def occupancy(*shards: tuple[int, int]) -> Occupancy:
    found = tuple(
        Shard(i, cap, {f"h{i}-{j}": 0.0 for j in range(size)}) for i, (cap, size) in enumerate(shards)
    )
    return Occupancy(
        pool="p", limit=sum(c for c, _ in shards), shard_count=len(shards), shards=found, read=len(shards)
    )


def test_candidates_are_the_shards_with_room_weighted_by_room():
    view = occupancy((3, 3), (3, 0), (3, 2), (1, 1))
    rng = random.Random(7)
    firsts = [candidates(view, rng)[0] for _ in range(2_000)]
    assert set(candidates(view, rng)) == {1, 2}
    assert firsts.count(1) > 2.5 * firsts.count(2) > 0  # room 3 against room 1
    assert pick(occupancy((2, 2), (0, 0)), rng) is None
    assert pick(Occupancy(pool="p"), rng) is None


def test_a_look_reads_every_shard_or_a_random_sample():
    rng = random.Random(1)
    assert sample_shards(5, rng) == [0, 1, 2, 3, 4]
    some = sample_shards(1_000, rng)
    assert len(some) == len(set(some)) == LOOK_SHARDS and some == sorted(some)
    assert all(0 <= i < 1_000 for i in some) and some != sample_shards(1_000, rng)


def test_capacity_names_a_pool_and_a_limit():
    assert Capacity("executions", 10).limit == 10
    for bad in ("", "a#b", "x" * 65, "tab\there"):
        with pytest.raises(ValueError):
            check_pool(bad)
    with pytest.raises(ValueError):
        Capacity("executions", -1)
    with pytest.raises(ValueError):
        plan_caps(1, 0, [])


def test_a_change_writes_as_few_shards_as_it_can():
    # 5 → 7: the spare slot goes to the shard that moves anyway, not to shard 0.
    plan = plan_caps(7, 3, [(2, 0), (2, 0), (1, 0)])
    assert plan.caps == (2, 2, 3) and [m.shard for m in plan.moves] == [2]
    # 7 → 4: shard 0 is cut anyway, so it gives the slot the level has too many.
    plan = plan_caps(4, 3, [(3, 0), (2, 0), (2, 0)])
    assert plan.caps == (1, 1, 2) and [m.shard for m in plan.moves] == [0, 1]
