"""Rate limits: at most N grants per period, for the whole stack, each lane and each concurrency key.

A rate is ``N/second``, ``N/minute`` or ``N/hour``. Every start takes a grant from each scope that
has a rate in force (the stack's, its lane's, its concurrency key's), and the promise is, for each
scope with rate N per period P: **at most N grants in any window [t, t + P) of the granting
clock**, across every launcher and completion at once, whatever crashes.

The protocol is written once here, over two persistence primitives (``RatePersistence``: ``load``
and ``save`` fenced by a version): the DynamoDB adapter and the in-memory one implement only those.
One record (``RateBook``) holds every scope's rate set at run time and its window: the grants of
the last period, as (millisecond, count) pairs. A grant is one conditional write of that record:

    launcher A                           launcher B                     RATES item (version v)
    load: v, window has N − 2 in (t − P, t]
                                         load: v, same window
    save v+1: window + (t, 2)  ✓ (IF version = v)
                                         save v+1: ✗ (version is v+1) → load again: no room → 0

A grant is taken *before* the receive it sizes, so a payload held by a rate is never received
(it waits in the queue, no receive spent, nothing walks towards the DLQ). What a round does not
start (an empty queue, a duplicate, a refusal) is given back (``give_back``): the same fenced
write, removing the round's own count from its own entry. A crash between the two keeps the
grants spent: fewer starts, never more. A grant before its start: AWS sees at most N starts in
any window of length P shortened by the longest claim-to-start a round takes, plus the skew
between the granting clocks (docs/protocol.md, "Rate limits").

**Keys.** A concurrency key's rate (``keyRateLimit``, or ``sluice set-rate --key``) has a book of
its own (``where``: the key's scope), so that no item grows with the number of keys: its rate set
at run time and its window. The stack's book keeps a copy of each key's rate set at run time, read
once per ``idle_seconds`` where no key has a default rate, so a keyed start reads the key's book
only where a rate may be in force. A key's grant is taken after the receive, before its claim
(the key is known only then); a message it holds waits in the key's line
(``sluice.features.keys``), whose wake sends no more waiters than the key has room for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from sluice.core.errors import ConfigurationError
from sluice.core.gates import Grant

PERIODS = {"second": 1, "minute": 60, "hour": 3_600}
# The largest N a rate takes: a book keeps up to N entries in its window and up to 1,000 past it
# (below), about 16 bytes each: the stack's and one lane's at 10,000 fit DynamoDB's 400 KB item.
MAX_COUNT = 10_000
_RATE = re.compile(r"([1-9][0-9]{0,5})/(second|minute|hour)", re.ASCII)
STACK = "stack"
LANE_PREFIX = "lane:"
KEY_PREFIX = "key:"
MAIN = ""  # the stack's book: the stack's and the lanes' scopes, and a copy of the keys' rates
NONE = "none"  # ``sluice set-rate none``: no rate for the scope, whatever the stack's parameter
ATTEMPTS = 8  # fenced writes lost to other launchers before a round takes no grant
# Entries kept past their period (the latest N, at least this many and at most KEPT_PAST_MAX), for the
# launchers whose clocks run behind the writer's and for a period lengthened at run time, while a small
# rate's record stays small (about 1 KB: one write unit). What a write drops is remembered as spans of
# time (``RateBook.dropped``): a window that may reach one has no room (``RateBook.room``).
KEPT_PAST = 32
KEPT_PAST_MAX = 1_000  # the stack's and a lane's book at 10,000/hour: about 350 KB of DynamoDB's 400
MAX_SPANS = 16  # spans of dropped entries a scope keeps: the closest merge first (wider only waits longer)


@dataclass(frozen=True, slots=True)
class Rate:
    count: int
    period: int  # seconds

    def __str__(self) -> str:
        unit = next(name for name, seconds in PERIODS.items() if seconds == self.period)
        return f"{self.count}/{unit}"


def parse_rate(raw: str, *, source: str) -> Rate:
    """``N/second|minute|hour``, N a whole number from 1 to 10,000; else ``ConfigurationError``
    naming ``source``."""
    found = _RATE.fullmatch(raw.strip())
    if not found or int(found.group(1)) > MAX_COUNT:
        raise ConfigurationError(
            f"{source}={raw!r}: a rate is N/second, N/minute or N/hour, N a whole number from 1 to {MAX_COUNT:,}"
        )
    return Rate(int(found.group(1)), PERIODS[found.group(2)])


def parse_optional_rate(raw: str, *, source: str) -> Rate | None:
    return parse_rate(raw, source=source) if raw.strip() else None


def parse_lane_rates(raw: str, lanes: Iterable[str], *, source: str) -> dict[str, Rate]:
    """``lane=rate,...`` (``gpu=10/second,api=600/minute``), each lane one of ``lanes``."""
    known = set(lanes)
    out: dict[str, Rate] = {}
    for part in filter(None, (p.strip() for p in raw.split(","))):
        name, eq, rate = part.partition("=")
        if not eq or name.strip() not in known or name.strip() in out:
            raise ConfigurationError(
                f"{source}: {part!r} is not lane=rate for a lane of the stack, once each "
                f"(lanes: {', '.join(sorted(known))})"
            )
        out[name.strip()] = parse_rate(rate, source=f"{source} ({name.strip()})")
    return out


def lane_scope(lane: str) -> str:
    return LANE_PREFIX + lane


def key_scope(ckey: str) -> str:
    return KEY_PREFIX + ckey


def book_of(scopes: Sequence[str]) -> str:
    """The book ``scopes`` live in: a key's own, else the stack's (``MAIN``); one per take."""
    where = {scope if scope.startswith(KEY_PREFIX) else MAIN for scope in scopes}
    if len(where) > 1:
        raise ValueError(f"scopes of different books taken at once: {sorted(scopes)}")
    return next(iter(where), MAIN)


@dataclass(frozen=True, slots=True)
class RateDefaults:
    """The rates the stack was deployed with (``rateLimit``, ``laneRateLimits``, ``keyRateLimit``)."""

    stack: Rate | None = None
    lanes: Mapping[str, Rate] = field(default_factory=dict)
    key: Rate | None = None  # every concurrency key's, unless set for the key at run time

    def of(self, scope: str) -> Rate | None:
        if scope == STACK:
            return self.stack
        if scope.startswith(KEY_PREFIX):
            return self.key
        return self.lanes.get(scope.removeprefix(LANE_PREFIX)) if scope.startswith(LANE_PREFIX) else None


@dataclass(frozen=True, slots=True)
class RateBook:
    """Every scope's rate set at run time (a rate's text, or ``NONE``) and its window of grants:
    (ms, count) pairs, oldest first; ``dropped``: each scope's spans (first, last ms) of the entries
    writes dropped.
    ``version`` fences each write."""

    version: int = 0
    overrides: Mapping[str, str] = field(default_factory=dict)
    windows: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    dropped: Mapping[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    def rate(self, scope: str, defaults: RateDefaults) -> Rate | None:
        """The rate in force for ``scope``: set at run time, else the stack's parameter."""
        override = self.overrides.get(scope)
        if override is None:
            return defaults.of(scope)
        return None if override == NONE else parse_rate(override, source=f"the rate set for {scope}")

    def in_window(self, scope: str, rate: Rate, now_ms: int) -> int:
        """Grants of ``scope`` in (now − P, now]."""
        start = now_ms - rate.period * 1000
        return sum(n for at, n in self.windows.get(scope, ()) if at > start)

    def room(self, scope: str, rate: Rate, now_ms: int) -> int:
        """Grants ``now_ms`` may take: N less the busiest window [x, x + P) that holds ``now_ms``.
        Grants ahead of this clock (another launcher's, whose clock runs ahead) count in the windows
        they share with it, so every window of the granting clocks holds at most N.

        A window that may hold a dropped entry has none: ``now`` within a period of a span of
        ``dropped``. A writer drops only entries a period before its own clock, so it is never held:

            launcher B (clock an hour behind)     launcher A (an hour ahead)    RATES
            grant at b                                                          b, A's last hour
                                                  grant at a: keeps A's latest 32 past a − P,
                                                  drops b                       dropped: (b, b), …
            now b + 1 < b + P: no room (it read an empty window: a second grant at 1/s)
            now b + P: room again (a clock a day ahead that dropped only its own holds no one else)
        """
        if self._reaches_dropped(scope, rate, now_ms):
            return 0
        return max(0, rate.count - busiest(self.windows.get(scope, ()), rate.period * 1000, now_ms))

    def _reaching(self, scope: str, rate: Rate, now_ms: int) -> list[tuple[int, int]]:
        period = rate.period * 1000
        return [(lo, hi) for lo, hi in self.dropped.get(scope, ()) if lo - period < now_ms < hi + period]

    def _reaches_dropped(self, scope: str, rate: Rate, now_ms: int) -> bool:
        return bool(self._reaching(scope, rate, now_ms))

    def next_due(self, scope: str, rate: Rate, now_ms: int) -> float | None:
        """When ``scope`` next has room (seconds, by the granting clock); None: it has room now."""
        if self.room(scope, rate, now_ms) > 0:
            return None
        if self._reaches_dropped(scope, rate, now_ms):
            return (max(hi for _, hi in self._reaching(scope, rate, now_ms)) + rate.period * 1000) / 1000
        start, held = now_ms - rate.period * 1000, 0
        excess = self.in_window(scope, rate, now_ms) - rate.count + 1
        for at, n in self.windows.get(scope, ()):
            if at > start:
                held += n
                if held >= excess:
                    return (at + rate.period * 1000) / 1000
        return None

    def granted(self, scopes: Sequence[str], n: int, now_ms: int, rates: Mapping[str, Rate]) -> RateBook:
        """This book with ``n`` grants at ``now_ms`` in each scope; of the entries past their period
        (``rates``: each scope's) only the latest N (from ``KEPT_PAST`` to ``KEPT_PAST_MAX``) kept, the
        rest remembered as spans."""
        windows, dropped = dict(self.windows), dict(self.dropped)
        for scope in scopes:
            start = now_ms - rates[scope].period * 1000
            kept = dict(windows.get(scope, ()))
            kept[now_ms] = kept.get(now_ms, 0) + n
            past = sorted(at for at in kept if at <= start)
            gone = past[: max(0, len(past) - max(KEPT_PAST, min(rates[scope].count, KEPT_PAST_MAX)))]
            for at in gone:
                del kept[at]
            if gone:
                dropped[scope] = spans_with(dropped.get(scope, ()), gone)
            windows[scope] = tuple(sorted(kept.items()))
        return replace(self, windows=windows, dropped=dropped)

    def given_back(self, scopes: Sequence[str], n: int, at_ms: int) -> RateBook:
        """This book with ``n`` of the grants made at ``at_ms`` removed from each scope (as many as
        that entry still holds: one already out of the window needs nothing)."""
        windows = dict(self.windows)
        for scope in scopes:
            windows[scope] = tuple(
                (at, k - min(n, k) if at == at_ms else k)
                for at, k in windows.get(scope, ())
                if not (at == at_ms and k <= n)
            )
        return replace(self, windows=windows)

    def with_override(self, scope: str, value: str | None) -> RateBook:
        overrides = {k: v for k, v in self.overrides.items() if k != scope}
        if value is not None:
            overrides[scope] = value
        return replace(self, overrides=overrides)


def spans_with(spans: Sequence[tuple[int, int]], gone: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """``spans`` and the times ``gone``, as spans: those that overlap merged, then the closest until
    at most ``MAX_SPANS`` remain. (A gap merged by a period's length would outlive a shorter period.)"""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted([*spans, *((t, t) for t in gone)]):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    while len(merged) > MAX_SPANS:
        i = min(range(len(merged) - 1), key=lambda j: merged[j + 1][0] - merged[j][1])
        merged[i : i + 2] = [(merged[i][0], max(merged[i][1], merged[i + 1][1]))]
    return tuple(merged)


def busiest(window: Sequence[tuple[int, int]], period_ms: int, now_ms: int) -> int:
    """The most grants of ``window`` in one window [x, x + period) that holds ``now_ms``."""
    near = [(at, n) for at, n in window if now_ms - period_ms < at < now_ms + period_ms]
    # A grant at ``a`` is in [x, x + period) for a − period < x <= a: the busiest x is where one enters.
    first = now_ms - period_ms + 1
    starts = {first, *(min(max(at - period_ms + 1, first), now_ms) for at, _ in near)}
    return max((sum(n for at, n in near if x <= at < x + period_ms) for x in starts), default=0)


class RatePersistence(Protocol):
    """Where the books live: the store's two primitives. ``where``: ``MAIN`` or a key's scope."""

    def load(self, where: str = MAIN) -> RateBook:
        """The book, read consistently (an empty one at version 0 when never written)."""
        ...

    def save(self, book: RateBook, expected: int, where: str = MAIN) -> bool:
        """Write ``book`` (its version is ``expected`` + 1) if the stored version is ``expected``;
        False when another write came first. Adapters raise ``TransientError`` when AWS fails."""
        ...


@dataclass(frozen=True, slots=True)
class ScopeStatus:
    scope: str
    rate: Rate | None
    overridden: bool
    in_window: int
    next_due: float | None


class RateLimiter:
    """The protocol: ``take`` grants before a receive, ``give_back`` what a round did not start,
    ``set`` a scope's rate at run time, ``status`` for the operator. It is the launch's gate
    (``sluice.core.gates.Gate``): the hooks below name the scopes a start takes from."""

    name = "rate"

    def __init__(
        self, persistence: RatePersistence, defaults: RateDefaults, idle_seconds: float = 5.0
    ) -> None:
        self.persistence, self.defaults = persistence, defaults
        # Where no rate is in force, the book read is kept this long: a rate set at run time on
        # a stack deployed without one holds from at most this long after (as MAX's parameter).
        # Where one is, every grant reads it.
        self.idle_seconds = idle_seconds
        self._idle: tuple[float, RateBook] | None = None
        self._main: tuple[float, RateBook] | None = None  # the stack's book as last read

    def take(self, scopes: Sequence[str], wanted: int, now: float) -> Grant:
        """Up to ``wanted`` grants in every scope of ``scopes`` (of one book) that has a rate in
        force, at once."""
        now_ms, where = int(now * 1000), book_of(scopes)
        if self._unlimited(scopes, now):
            return Grant(max(wanted, 0))
        for _ in range(ATTEMPTS):
            book = self._load(where, now)
            rates = {s: r for s in scopes if (r := book.rate(s, self.defaults)) is not None}
            if where == MAIN:
                self._idle = None if rates else (now, book)
            if not rates or wanted <= 0:
                return Grant(max(wanted, 0))
            n = min([wanted, *(book.room(s, r, now_ms) for s, r in rates.items())])
            if n == 0:
                dues = [d for s, r in rates.items() if (d := book.next_due(s, r, now_ms)) is not None]
                return Grant(0, now_ms, tuple(rates), max(dues, default=None))
            after = replace(book.granted(tuple(rates), n, now_ms, rates), version=book.version + 1)
            if self.persistence.save(after, book.version, where):
                return Grant(n, now_ms, tuple(rates))
        return Grant(0, now_ms, tuple(scopes))  # lost every race: the next round or tick tries again

    def before_receive(self, lane: str | None, wanted: int, now: float) -> Grant:
        """Before a receive: the stack's rate, and its lane's."""
        return self.take([STACK] if lane is None else [STACK, lane_scope(lane)], wanted, now)

    def before_claim(self, ckey: str, now: float) -> Grant:
        """Before a keyed claim: the key's rate."""
        return self.take([key_scope(ckey)], 1, now)

    def key_room(self, ckey: str, now: float) -> int | None:
        return self.room(key_scope(ckey), now)

    def key_due(self, ckey: str, now: float) -> float | None:
        return self.next_due(key_scope(ckey), now)

    def room(self, scope: str, now: float) -> int | None:
        """Grants ``scope`` may take now; None: it has no rate in force (a key's wake asks)."""
        found = self._in_force(scope, now)
        return None if found is None else found[0].room(scope, found[1], int(now * 1000))

    def next_due(self, scope: str, now: float) -> float | None:
        """When ``scope`` next has room; None: it has room now, or no rate."""
        found = self._in_force(scope, now)
        return None if found is None else found[0].next_due(scope, found[1], int(now * 1000))

    def _in_force(self, scope: str, now: float) -> tuple[RateBook, Rate] | None:
        """``scope``'s book and its rate in force, read consistently; None where it has no rate."""
        if self._unlimited([scope], now):
            return None
        book = self._load(book_of([scope]), now)
        rate = book.rate(scope, self.defaults)
        return None if rate is None else (book, rate)

    def _load(self, where: str, now: float) -> RateBook:
        book = self.persistence.load(where)
        if where == MAIN:
            self._main = (now, book)
        return book

    def _unlimited(self, scopes: Sequence[str], now: float) -> bool:
        """No rate in force for ``scopes``, as far as a read less than ``idle_seconds`` old says: the
        stack's book where no scope has a rate by the parameters; for a key's scope, the stack's
        copy of the rates set for keys (so a key without one costs no read of its own book)."""
        if any(self.defaults.of(s) is not None for s in scopes):
            return False
        if book_of(scopes) != MAIN:
            if self._main is None or not 0 <= now - self._main[0] < self.idle_seconds:
                self._load(MAIN, now)
            assert self._main is not None
            return all(self._main[1].rate(s, self.defaults) is None for s in scopes)
        if self._idle is None:
            return False
        at, book = self._idle
        return 0 <= now - at < self.idle_seconds and all(book.rate(s, self.defaults) is None for s in scopes)

    def give_back(self, grant: Grant, unused: int) -> None:
        """Return ``unused`` of ``grant`` (never started). Best effort: one not returned stays spent."""
        unused = min(unused, grant.n)
        if unused <= 0 or not grant.scopes:
            return
        where = book_of(grant.scopes)
        for _ in range(ATTEMPTS):
            book = self.persistence.load(where)
            after = replace(book.given_back(grant.scopes, unused, grant.at_ms), version=book.version + 1)
            if self.persistence.save(after, book.version, where):
                return

    def set(self, scope: str, value: Rate | str | None) -> None:
        """A scope's rate from the next grant on: a ``Rate``, ``NONE``, or None (the parameter's).
        A key's is written in its own book and copied to the stack's, the copy first when it sets
        a rate and last when it lifts one: a command that dies between the two leaves the copy
        saying a rate may be in force wherever the key's book has one (its book decides)."""
        text = str(value) if isinstance(value, Rate) else value
        books = [MAIN, book_of([scope])] if isinstance(value, Rate) else [book_of([scope]), MAIN]
        for where in dict.fromkeys(books):
            self._set_in(where, scope, text)
        self._main = None

    def _set_in(self, where: str, scope: str, text: str | None) -> None:
        for _ in range(ATTEMPTS):
            book = self.persistence.load(where)
            after = replace(book.with_override(scope, text), version=book.version + 1)
            if self.persistence.save(after, book.version, where):
                return
        raise ConfigurationError(f"the rate of {scope} was not written: other writes kept coming first")

    def status(self, scopes: Iterable[str], now: float) -> list[ScopeStatus]:
        books: dict[str, RateBook] = {}
        now_ms, out = int(now * 1000), []
        for scope in scopes:
            where = book_of([scope])
            if where not in books:
                books[where] = self.persistence.load(where)
            book = books[where]
            rate = book.rate(scope, self.defaults)
            held = book.in_window(scope, rate, now_ms) if rate else 0
            due = book.next_due(scope, rate, now_ms) if rate else None
            out.append(ScopeStatus(scope, rate, scope in book.overrides, held, due))
        return out

    def keys_set(self) -> list[str]:
        """The keys' scopes with a rate set at run time (the stack's copy)."""
        return sorted(s for s in self.persistence.load(MAIN).overrides if s.startswith(KEY_PREFIX))
