"""Lease: a per-key holder with an expiry, taken over after it expires; renewal and release fenced by
the holder's name.

A lease is named by a ``scope`` (what is protected: a function, a resource) and a ``key`` (which one:
an order id, a tenant). ``limit`` items stand for the key: limit 1 is a mutex, limit N lets N holders
in at once. Item ``i`` in 0 .. limit - 1 holds at most one holder:

    acquire   holder, expires_at = now + ttl, acquired_at, version + 1
              IF no holder  OR  expires_at <= now  OR  holder = me           (one item, random order)
    renew     expires_at = now + ttl                          IF holder = me
    release   REMOVE holder; keep state and last_error        IF holder = me   (False when not)

``version`` grows at every acquire of an item: the ``Lease`` carries it as a fencing token, so a
resource that records the highest token it has seen can refuse the writes of a holder that lost its
lease without knowing it. ``state`` (a small JSON object) and ``last_error`` outlive their holder: the
next holder of the item reads what the previous one left. With limit N each item has its own state;
a per-key state is meaningful for a mutex.

Clock assumption
----------------

``expires_at`` is written from the holder's clock and compared with the taker's (``:now`` is the
taker's reading). If the taker's clock is ahead of the holder's by ``d`` seconds, the taker sees the
lease end ``d`` seconds early. A holder must stop using its lease by its own deadline, ``margin``
seconds before ``expires_at``; then a lease is exclusive as long as

    d < margin            (clocks differ by less than the margin)

``sluice.concurrency.exclusive`` writes ``expires_at`` = the Lambda's deadline + margin (5 s by
default): Lambda stops the function at its deadline, so the bound is clock difference < 5 s. Lambda's
hosts keep time with the Amazon Time Sync Service (well under a second apart); a laptop whose clock is
minutes off is not safe.

An expired takeover, taker B's clock ``d`` ahead of holder A's (d < margin, deadline R after t0):

    real time     holder A (clock = real)                taker B (clock = real + d)
    ─────────     ───────────────────────                ──────────────────────────
    t0            acquire v7: expires_at = t0 + R + m
    t0 + R        deadline: Lambda stops A               acquire: t0 + R + d < expires_at → Busy
    t0 + R + m - d                                       acquire: expires_at <= now → holds, v8

A late release after a takeover (A paused past its expiry, as a clock jump or a long GC would do):

    holder A                                       taker B
    ────────                                       ───────
    acquire v7, expires_at = e
    …paused past e…                                acquire at now >= e: holder = B, v8
    release: REMOVE holder IF holder = A   ✗       still holds: A's late release freed nothing
    write to a fenced resource with token 7  ✗     (the resource has seen 8)

A grant that comes back after its own end (the clock read for ``:now`` went stale while the request
waited: a pause, retries, a free item taken with an old reading):

    holder A                                       taker B
    ────────                                       ───────
    read now = t, send acquire (ttl T)
    …request delayed past t + T…
    granted: expires_at = t + T + m, and the run's
    own end t + T already past                     acquire at now >= t + T + m: holds
    must not enter: ``exclusive`` reads the clock again after the grant, gives such a lease back
    (fenced by holder) and asks again; a renewal answered that late raises ``LeaseLost``

The table's TTL attribute is ``expires_at``: a lease never released is deleted by DynamoDB some time
after it expires (with its state); a release sets ``expires_at`` to the lease's expiry + retention
(30 days by default), so a released item and its state live that long after its last use. Expiry
itself is judged by the conditions above, never by TTL deletion.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sluice.core.errors import ClaimRejected, SluiceError
from sluice.core.validation import MAX_KEY_BYTES

MAX_SCOPE_LENGTH = 128
MAX_HOLDER_BYTES = 256
MAX_LIMIT = 100  # one BatchGetItem reads every item of a key
STATE_MAX_BYTES = 4_096  # canonical JSON: an acquire or release stays a few write units
ERROR_MESSAGE_CHARS = 1_000
ERROR_TYPE_CHARS = 200
DEFAULT_RETENTION = 30 * 86_400


class BadLeaseName(SluiceError, ValueError):
    """A scope, key, holder or limit the table cannot take."""


class StateError(SluiceError, ValueError):
    """A lease's state is not a JSON object or is larger than ``STATE_MAX_BYTES``."""


class LeaseLost(SluiceError):
    """A renewal found the lease held by someone else, or by nobody, or came back after the time it
    asked for had passed: stop using it."""

    def __init__(self, lease: Lease, why: str = "") -> None:
        told = why or f"{lease.holder!r} no longer holds it"
        super().__init__(f"{describe(lease.scope, lease.key)}: {told}")
        self.lease = lease


@dataclass(frozen=True)
class Holding:
    """One live holder of a key as an acquire saw it."""

    holder: str
    expires_at: float
    slot: int = 0


class Busy(ClaimRejected):
    """Every item of the key is held by someone else, and not expired. ``holders`` are those seen;
    ``until`` is the earliest of their expiries (the latest the key can stay busy without a renewal)."""

    def __init__(self, scope: str, key: str, holders: Sequence[Holding], limit: int = 1) -> None:
        self.scope = scope
        self.key = key
        self.limit = limit
        self.holders = tuple(holders)
        self.until = min((h.expires_at for h in self.holders), default=0.0)
        who = ", ".join(f"{h.holder!r} until {h.expires_at:.3f}" for h in self.holders) or "others"
        super().__init__(f"{describe(scope, key)} is busy (limit {limit}): held by {who}")

    @property
    def holder(self) -> str | None:
        """The holder, for a mutex (limit 1)."""
        return self.holders[0].holder if self.holders else None


@dataclass(frozen=True)
class LastError:
    """The last exception recorded on a key: its type, message (truncated), when and by whom."""

    type: str
    message: str
    at: float
    holder: str

    @classmethod
    def of(cls, exc: BaseException, at: float, holder: str) -> LastError:
        kind = type(exc)
        name = (
            kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        )
        return cls(name[:ERROR_TYPE_CHARS], str(exc)[:ERROR_MESSAGE_CHARS], at, holder)

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message, "at": self.at, "holder": self.holder}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None) -> LastError | None:
        if not raw:
            return None
        return cls(str(raw["type"]), str(raw["message"]), float(raw["at"]), str(raw["holder"]))


@dataclass(frozen=True)
class Lease:
    """A held item of a key. ``version`` is the fencing token; ``state`` and ``last_error`` are what
    the item held when this lease was taken; ``previous`` the holder whose expired lease it took."""

    scope: str
    key: str
    slot: int
    holder: str
    version: int
    acquired_at: float
    expires_at: float
    state: Mapping[str, Any] | None = field(default=None, compare=False)
    last_error: LastError | None = None
    previous: Holding | None = None


@dataclass(frozen=True)
class LeaseSlot:
    """One item of a key as read: its holder (None when free or released) and what it keeps."""

    slot: int
    holder: str | None = None
    expires_at: float = 0.0
    acquired_at: float = 0.0
    version: int = 0
    state: Mapping[str, Any] | None = field(default=None, compare=False)
    last_error: LastError | None = None

    def live(self, now: float) -> bool:
        return self.holder is not None and self.expires_at > now

    def admits(self, holder: str, now: float) -> bool:
        """The acquire condition, as the adapters write it."""
        return self.holder is None or self.expires_at <= now or self.holder == holder


# -- names and sizes --------------------------------------------------------------------------------


def describe(scope: str, key: str) -> str:
    shown = key if len(key) <= 80 else key[:77] + "..."
    return f"{scope}/{shown!r}"


def _utf8(text: str, what: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise BadLeaseName(f"{what} holds a lone surrogate") from None


def check_scope(scope: str) -> str:
    """A scope is part of every item key: short, printable, without the separator ``#``."""
    if not isinstance(scope, str) or not scope or "#" in scope or len(scope) > MAX_SCOPE_LENGTH:
        raise BadLeaseName(f"bad lease scope {scope!r}: 1 to {MAX_SCOPE_LENGTH} characters, no '#'")
    if not scope.isprintable():
        raise BadLeaseName(f"bad lease scope {scope!r}: printable characters only")
    _utf8(scope, "lease scope")
    return scope


def check_key(key: str) -> str:
    """A key is at most ``MAX_KEY_BYTES`` bytes of UTF-8 (like payload keys; DynamoDB allows 2,048
    for the whole item key ``LEASE#<scope>#<key>#<i>``)."""
    if not isinstance(key, str) or not key:
        raise BadLeaseName(f"a lease key is a non-empty string, got {key!r}")
    size = _utf8(key, "lease key")
    if size > MAX_KEY_BYTES:
        raise BadLeaseName(f"lease key is {size:,} bytes in UTF-8; keys are at most {MAX_KEY_BYTES:,} bytes")
    return key


def check_holder(holder: str) -> str:
    if not isinstance(holder, str) or not holder:
        raise BadLeaseName("a lease holder needs a name")
    if _utf8(holder, "lease holder") > MAX_HOLDER_BYTES:
        raise BadLeaseName(f"lease holder name is longer than {MAX_HOLDER_BYTES} bytes")
    return holder


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise BadLeaseName(f"a lease limit is 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


def check_ttl(ttl: float) -> float:
    if not ttl > 0:
        raise ValueError(f"a lease ttl is > 0 seconds, got {ttl!r}")
    return float(ttl)


def encode_state(state: Mapping[str, Any]) -> str:
    """Canonical JSON of a state, checked: a JSON object of at most ``STATE_MAX_BYTES`` bytes."""
    if not isinstance(state, Mapping):
        raise StateError(f"lease state must be a dict, got {type(state).__name__}")
    try:
        text = json.dumps(dict(state), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StateError(f"lease state is not JSON: {exc}") from None
    size = len(text.encode("utf-8"))
    if size > STATE_MAX_BYTES:
        raise StateError(f"lease state is {size:,} bytes of JSON; at most {STATE_MAX_BYTES:,}")
    return text


def decode_state(text: str | None) -> dict[str, Any] | None:
    return None if text is None else dict(json.loads(text))


# -- choosing an item -------------------------------------------------------------------------------


def attempt_order(
    limit: int, holder: str, seen: Sequence[LeaseSlot], now: float, rng: random.Random
) -> list[int]:
    """The items an acquire tries, at most ``limit``. Without a read (``seen`` empty): all, in a random
    order. After a read: the one ``holder`` holds already first (an acquire asked again takes no second
    item: the first write that succeeds ends it, and a refusal of that one means another holds it
    now), then those that look free, then the rest (the read may be stale), each in random order."""
    indexes = list(range(limit))
    rng.shuffle(indexes)
    if not seen:
        return indexes
    by_slot = {s.slot: s for s in seen}
    mine = [i for i in indexes if i in by_slot and by_slot[i].holder == holder][:1]
    free = [i for i in indexes if i not in mine and (i not in by_slot or by_slot[i].admits(holder, now))]
    return mine + free + [i for i in indexes if i not in mine and i not in free]


class Leases(Protocol):
    """The port. Every method raises only ``sluice.core.errors`` exceptions (``TransientError`` for
    throttling and service faults, ``ConfigurationError`` for setup problems)."""

    def acquire(self, scope: str, key: str, holder: str, now: float, ttl: float, limit: int = 1) -> Lease:
        """Hold one of the ``limit`` items of ``key`` until ``now + ttl``: a free one, an expired one,
        or the one ``holder`` holds already. ``Busy`` when every item is live and held by others."""
        ...

    def renew(self, lease: Lease, now: float, ttl: float) -> Lease:
        """Move the expiry to ``now + ttl``; ``LeaseLost`` when ``lease.holder`` no longer holds it."""
        ...

    def release(
        self, lease: Lease, *, state: Mapping[str, Any] | None = None, error: LastError | None = None
    ) -> bool:
        """Give the item back, writing ``state`` and ``error`` when given (the item keeps its earlier
        ones otherwise). False, writing nothing, when ``lease.holder`` no longer holds it."""
        ...

    def inspect(self, scope: str, key: str, limit: int = 1) -> tuple[LeaseSlot, ...]:
        """Items 0 .. limit - 1 of ``key`` as they are now (an item never written reads as free)."""
        ...
