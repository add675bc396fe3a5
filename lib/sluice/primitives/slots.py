"""Slots: a counting semaphore sharded over several items, exact across any number of claimers.

A pool (``Capacity.pool``) has a limit in force and ``shard_count`` shards. Each shard holds its own
holders and its own ``cap``, and a claim is admitted by its shard alone (``size(holders) < cap``).
The caps add up to the limit, so shards can only under-admit, never over-admit:

    running = Σ size(holders_i) ≤ Σ cap_i = limit          (each shard keeps size ≤ cap)

A claimer reads the pool once (``look``), picks a shard with room (``pick``, ``candidates``) and
tries another when it loses the race for the last slot of that shard (``SlotsFull``).

Changing the limit moves caps (``plan_caps``) and never touches holders. New caps cover each
shard's holders (cap_i ≥ holders_i), add up to the new limit and are spread as evenly as the
holders allow. Each cap is written conditioned on ``size(holders) <= new cap``, so a shard that
gained holders since the read fails the write and the change is planned again. Decreases are
written before increases, and a new limit with its first increase: at every instant Σ cap_i is at
most the limit stored, and at most max(old, new).

Lowering below the holders: the freeze
--------------------------------------

When more run than the new limit allows, no static split of the caps is exact: the sum of caps is
below the holders, so some shard is over its cap, and another shard that drains below its own cap
admits while the total is still above the limit. So the pool *freezes*: every cap goes to 0 and
``frozen`` is set with the new limit. ``rebalance`` (each scheduled tick, and ``set_limit``)
unfreezes once the holders fit:

    limit 5 → 3 while 5 run: A holds 3 (cap 3), B holds 2 (cap 2)

    static caps A 2 + B 1 = 3                 frozen: A 0 + B 0, limit 3
    ─────────────────────────                 ────────────────────────────────────────
    B: a holder ends         4 running        B: a holder ends            4 running
    B: another ends          3 running        B: another ends             3 running
    B: 0 < cap 1, admits     4 running  ✗     claims: size < 0 is false   3 running
                                              rebalance reads A 3, B 0 (Σ 3 ≤ 3)
                                                writes A 3, B 0 IF size(holders) ≤ cap
                                              A: a holder ends            2 running
                                              A: 2 < cap 3, admits        3 running  ✓

Why unfreezing is safe: while every cap is 0 no write can add a holder (a claim needs
``size < cap``; a swap needs ``size ≤ cap`` with the old holder in the item), so between
rebalance's read and its write each shard's holders only shrink. Caps with cap_i ≥ holders_i as
read, summing to the limit, still cover the holders when written; the condition checks it again.
A holder is never evicted: a frozen shard simply waits for its holders to end.

A holder that runs already (an adoption: a redriven run) takes a shard with room like a claim; when
no shard has room it freezes the pool first and takes a slot past a cap only while the pool is still
frozen, moving its version (a planner's read before the take is refused), so an unfrozen pool never
holds a shard past its cap, whatever point the adopter stops at
(``sluice.adapters.dynamo.slots.DynamoSlots.adoption``).

Two planners (``set_limit``, ``rebalance``) racing are ordered by the pool's ``version``: a change
commits only if the version it read is still in force (the adapters say how).

Stamped limits
--------------

Several writers may work a limit out from readings of different ages: an operator who just wrote
MAX, and a launcher holding a MAX it read a few seconds ago. ``Capacity.stamp`` says what a limit
was worked out from, ordered (for the launcher: the MAX parameter's version, then when the running
count was taken). The pool keeps the stamp of the limit in force, and ``set_limit`` never replaces
it with a limit of an older stamp: it returns None and the caller obeys the pool instead. The
comparison is made on the pool as read and committed under the same ``version`` condition, so a
stale writer can never undo a newer limit, however the two interleave. A writer that merges its
reading with the pool's (the launcher: the newer MAX and the newer external count of the two) also
sets ``replaces``, the stamp it merged with: the change is written only while that stamp is still
in force (compare-and-set), else it reads again and merges again.

    operator (MAX 5 → 2, version 8)         launcher (MAX 5 cached, version 7)
    ───────────────────────────────         ──────────────────────────────────
    set_limit(2, stamp (8, t))  ✓ v → v+1
                                            read pool: limit 2, stamp (8, t)
                                            set_limit(5, stamp (7, t)): older → None, obeys 2
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sluice.core.errors import SlotsFull

DEFAULT_PER_SHARD = 8  # holders per shard item; see sluice.adapters.dynamo.slots for the bytes
LOOK_SHARDS = 99  # one BatchGetItem reads 100 keys: the pool item and 99 shards
MAX_POOL_LENGTH = 64
MAX_LIMIT = 10_000  # maxConcurrency's ceiling: a larger limit is refused, not planned shard by shard


def check_pool(pool: str) -> str:
    """A pool name is part of every item key: short, and without the key separator ``#``."""
    if not pool or "#" in pool or len(pool) > MAX_POOL_LENGTH or not pool.isprintable():
        raise ValueError(f"bad pool name {pool!r}: 1 to {MAX_POOL_LENGTH} printable characters, no '#'")
    return pool


@dataclass(frozen=True)
class Capacity:
    """A named limit: at most ``limit`` holders in ``pool`` at once.

    ``stamp`` orders limits worked out from readings of different ages (see "Stamped limits"); an
    empty stamp is unfenced: it always applies, and the pool then has no stamp."""

    pool: str
    limit: int
    stamp: tuple[float, ...] = ()
    replaces: tuple[float, ...] | None = None  # written only while the pool's stamp is still this
    only_new: bool = False  # written only where the pool does not exist yet (a conditional create)

    def refused_by(self, occupancy: Occupancy) -> bool:
        """The pool as read keeps its limit: its stamp is newer, or not the one this change replaces,
        or it exists and this change only creates."""
        if self.only_new and occupancy.version:
            return True
        if self.replaces is not None and occupancy.version and occupancy.stamp != self.replaces:
            return True
        return occupancy.newer_than(self)

    def __post_init__(self) -> None:
        check_pool(self.pool)
        if self.limit < 0:
            raise ValueError(f"limit must be >= 0, got {self.limit}")


@dataclass(frozen=True)
class Shard:
    index: int
    cap: int
    holders: Mapping[str, float] = field(default_factory=dict, hash=False)  # name -> claimed_at

    @property
    def size(self) -> int:
        return len(self.holders)

    @property
    def room(self) -> int:
        return max(0, self.cap - self.size)


@dataclass(frozen=True)
class Occupancy:
    """A pool as read: the pool item, and every shard (``complete``) or a sample of them."""

    pool: str
    limit: int = 0
    shard_count: int = 0
    per_shard: int = DEFAULT_PER_SHARD
    frozen: bool = False
    version: int = 0  # 0: the pool does not exist yet
    shards: tuple[Shard, ...] = ()
    stamp: tuple[float, ...] = ()  # of the limit in force
    read: int = 0  # how many shard indexes were read (missing items count as read, empty)

    @property
    def complete(self) -> bool:
        return self.read >= self.shard_count

    @property
    def capacity(self) -> Capacity:
        return Capacity(self.pool, self.limit, self.stamp)

    def newer_than(self, capacity: Capacity) -> bool:
        """The limit in force was worked out from a newer reading than ``capacity``'s: keep it."""
        return bool(capacity.stamp) and self.version > 0 and self.stamp > capacity.stamp

    @property
    def running(self) -> int:
        return sum(s.size for s in self.shards)

    @property
    def caps(self) -> int:
        return sum(s.cap for s in self.shards)

    @property
    def free(self) -> int:
        return sum(s.room for s in self.shards)

    def loads(self) -> list[tuple[int, int]]:
        """(cap, holders) for shard 0 .. shard_count - 1; a shard never written is (0, 0)."""
        by_index = {s.index: s for s in self.shards}
        out = []
        for i in range(self.shard_count):
            s = by_index.get(i)
            out.append((s.cap, s.size) if s else (0, 0))
        return out


@dataclass(frozen=True)
class Move:
    shard: int
    old: int
    new: int

    @property
    def decrease(self) -> bool:
        return self.new < self.old


@dataclass(frozen=True)
class Plan:
    """New caps for a pool. ``moves`` lists the changed shards, decreases first."""

    limit: int
    frozen: bool
    caps: tuple[int, ...]
    moves: tuple[Move, ...]

    @property
    def shard_count(self) -> int:
        return len(self.caps)


def shards_needed(limit: int, per_shard: int) -> int:
    return max(1, math.ceil(limit / per_shard))


def plan_caps(limit: int, per_shard: int, loads: Sequence[tuple[int, int]]) -> Plan:
    """Caps for ``limit`` given each shard's (cap, holders). Pure.

    Not frozen (holders ≤ limit): cap_i ≥ holders_i, Σ cap_i = limit, caps already valid are kept,
    otherwise raised from the lowest or lowered from the highest (water-filling), so a raise from a
    valid state only increases caps and a lowering only decreases them. Frozen (holders > limit):
    every cap 0. The shard count grows to ceil(limit / per_shard) and never shrinks.
    """
    if limit < 0 or per_shard < 1:
        raise ValueError(f"limit {limit} and per_shard {per_shard}")
    if limit > MAX_LIMIT:
        raise ValueError(f"limit {limit} is above {MAX_LIMIT}, the most a pool plans for")
    count = max(len(loads), shards_needed(limit, per_shard))
    old = [c for c, _ in loads] + [0] * (count - len(loads))
    held = [h for _, h in loads] + [0] * (count - len(loads))
    frozen = sum(held) > limit
    if frozen:
        caps = [0] * count
    else:
        base = [max(c, h) for c, h in zip(old, held, strict=True)]
        total = sum(base)
        if total < limit:
            caps = _raise(base, old, limit, per_shard)
        elif total > limit:
            caps = _lower(base, old, held, limit)
        else:
            caps = base
    moves = [Move(i, o, n) for i, (o, n) in enumerate(zip(old, caps, strict=True)) if o != n]
    ordered = [m for m in moves if m.decrease] + [m for m in moves if not m.decrease]
    return Plan(limit=limit, frozen=frozen, caps=tuple(caps), moves=tuple(ordered))


def plan_freeze(limit: int, per_shard: int, loads: Sequence[tuple[int, int]]) -> Plan:
    """Every cap 0 with ``limit`` kept (frozen), whatever the holders: for an adoption about to take
    a slot of a pool with no room (``sluice.adapters.dynamo.slots.DynamoSlots.adoption``). Pure."""
    if limit < 0 or per_shard < 1:
        raise ValueError(f"limit {limit} and per_shard {per_shard}")
    count = max(len(loads), shards_needed(limit, per_shard))
    old = [c for c, _ in loads] + [0] * (count - len(loads))
    moves = tuple(Move(i, o, 0) for i, o in enumerate(old) if o)
    return Plan(limit=limit, frozen=True, caps=(0,) * count, moves=moves)


def _raise(base: list[int], old: list[int], limit: int, per_shard: int) -> list[int]:
    """Fill from the lowest shards up to ``per_shard``: caps max(base_i, level), plus one on some."""

    def filled(level: int) -> int:
        return sum(max(b, level) for b in base)

    lo, hi = 0, per_shard  # filled(per_shard) ≥ count · per_shard ≥ limit
    while lo < hi:  # the highest level that does not pass the limit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if filled(mid) <= limit else (lo, mid - 1)
    caps = [max(b, lo) for b in base]
    spare = limit - sum(caps)
    # Some shards at the level get one more: first those that move anyway (fewer writes).
    level = sorted((i for i, b in enumerate(base) if b <= lo), key=lambda i: (old[i] == lo, i))
    for i in level[:spare]:
        caps[i] += 1
    return caps


def _lower(base: list[int], old: list[int], held: list[int], limit: int) -> list[int]:
    """Cut the highest shards down, never below their holders: caps max(h_i, min(base_i, level))."""

    def cut(level: int) -> int:
        return sum(max(h, min(b, level)) for b, h in zip(base, held, strict=True))

    lo, hi = 0, max(base)  # cut(0) = Σ holders ≤ limit < cut(max)
    while lo < hi:  # the lowest level that keeps at least the limit
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if cut(mid) >= limit else (mid + 1, hi)
    caps = [max(h, min(b, lo)) for b, h in zip(base, held, strict=True)]
    excess = sum(caps) - limit  # some shards at the level give one back: first those that move anyway
    level = sorted(
        (i for i, c in enumerate(caps) if c == lo and c > held[i]), key=lambda i: (old[i] == lo, i)
    )
    for i in level[:excess]:
        caps[i] -= 1
    return caps


def sample_shards(count: int, rng: random.Random, budget: int = LOOK_SHARDS) -> list[int]:
    """The shard indexes one look reads: all of them, or a random ``budget`` of them."""
    if count <= budget:
        return list(range(count))
    return sorted(rng.sample(range(count), budget))


def candidates(occupancy: Occupancy, rng: random.Random) -> list[int]:
    """Shards with room, in the order to try them: a random order weighted by room, so claimers
    prefer roomier shards yet spread out instead of all racing for the same one."""
    roomy = [s for s in occupancy.shards if s.room > 0]
    # Efraimidis–Spirakis: sorting by u^(1/w) draws without replacement with weights w.
    keyed = sorted(roomy, key=lambda s: rng.random() ** (1.0 / s.room), reverse=True)
    return [s.index for s in keyed]


def pick(occupancy: Occupancy, rng: random.Random) -> int | None:
    order = candidates(occupancy, rng)
    return order[0] if order else None


class Slots(Protocol):
    """The port. ``pool`` is a ``Capacity.pool``; ``shard`` an index from ``look``."""

    def look(self, pool: str) -> Occupancy:
        """Cheap read for choosing a shard: possibly stale, a sample above ``LOOK_SHARDS``."""
        ...

    def occupancy(self, pool: str) -> Occupancy:
        """Every shard, read consistently (status, planning)."""
        ...

    def claim(self, pool: str, shard: int, name: str, now: float) -> None:
        """Take a slot on ``shard``; SlotsFull when it has no room. Holding it already is a no-op."""
        ...

    def release(self, pool: str, shard: int, name: str) -> bool:
        """Give ``name``'s slot back; False when it held none on ``shard``."""
        ...

    def swap(self, pool: str, shard: int, old: str, new: str, now: float) -> bool:
        """Hand ``old``'s slot to ``new`` on the same shard in one write. True also when done already
        (``new`` holds, ``old`` not); False when neither holds there; SlotsFull when the shard is over
        its cap (frozen): ``old`` keeps its slot."""
        ...

    def set_limit(self, capacity: Capacity) -> Plan | None:
        """Put ``capacity.limit`` in force; the plan written, or None when a later change overtook it
        or the limit in force has a newer stamp."""
        ...

    def rebalance(self, pool: str) -> Plan | None:
        """Bring the caps in line with the limit in force (unfreeze); None when the pool is absent, or
        when another change overtook a plan of several transactions (the next rebalance finishes)."""
        ...

    def restamp(self, pool: str, stamp: tuple[float, ...], replaces: tuple[float, ...]) -> bool:
        """Record a newer source for the limit in force, the caps unchanged: one write, only while the
        pool's stamp is ``replaces`` (and it moves the pool's version, fencing planners that read
        before it). False when the pool moved meanwhile or does not exist."""
        ...


def claim_any(
    slots: Slots, pool: str, name: str, now: float, rng: random.Random, *, attempts: int = 3
) -> int:
    """Claim a slot on some shard of ``pool`` from one look; the shard taken. SlotsFull when none
    of up to ``attempts`` shards with room admitted (the look was stale, or others won the races)."""
    occupancy = slots.look(pool)
    for shard in candidates(occupancy, rng)[:attempts]:
        try:
            slots.claim(pool, shard, name, now)
        except SlotsFull:
            continue
        return shard
    raise SlotsFull(occupancy.limit)
