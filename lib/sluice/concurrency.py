"""``@exclusive``: at most ``limit`` runs at once per key, for Lambda handlers and any Python code.

    from sluice.concurrency import exclusive, Busy

    @exclusive("detail.orderId")                   # JMESPath into the event: one run per order at a time
    def handler(event, context): ...

    @exclusive("tenant", limit=3, name="reports")   # at most 3 concurrent runs per tenant
    def report(event, context): ...

    with exclusive.hold("orders", order_id, ttl=60) as held:   # outside Lambda, or around a section
        ...

A run holds a lease (``sluice.primitives.lease``) on ``LEASE#<name>#<key>#<i>`` in the Sluice table. In Lambda
the lease expires at the invocation's deadline plus ``margin`` (the context's remaining time, read when
the call starts), so a timeout never leaves it held longer than that; elsewhere the run has ``ttl``
from its acquire's request, and the lease lasts ``ttl`` plus ``margin``. It
is released when the function returns or raises an ``Exception``, fenced by the holder: the Lambda
request id (a retry that keeps the request id takes its own lease back at once), else a uuid. Anything that is not an ``Exception`` (a timeout, a kill, ``KeyboardInterrupt``, ``SystemExit``)
leaves the lease to expire: a process that is going down does not write. The clock bound is in
``sluice.primitives.lease``: clocks must differ by less than ``margin``.

Nothing here imports the launcher: ``pip install .`` and a table with partition key ``pk`` suffice.
The table comes from ``table_name=`` or ``SLUICE_TABLE_NAME``, read at the first call, and the boto3
client is made then too (never at import); ``client=``, ``leases=``, ``clock=``, ``sleep=`` are for tests.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import random
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

import jmespath

from sluice.core.clock import SystemClock
from sluice.core.errors import ConfigurationError, SluiceError, TransientError
from sluice.primitives.lease import (
    BadLeaseName,
    Busy,
    LastError,
    Lease,
    LeaseLost,
    Leases,
    LeaseSlot,
    StateError,
    check_key,
    check_limit,
    check_scope,
    check_ttl,
    describe,
    encode_state,
)

__all__ = ["Busy", "Held", "MissingKey", "Reentered", "StateError", "exclusive", "hold"]

TABLE_ENV = "SLUICE_TABLE_NAME"
DEFAULT_MARGIN = 5.0
DEFAULT_TTL = 900.0
BACKOFF_FIRST = 0.1  # seconds; doubled per attempt up to BACKOFF_CAP, with jitter
BACKOFF_CAP = 2.0
STALE_GRANTS = 3  # grants that came back already ended, in one acquire, before it gives up

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])

_client_lock = threading.Lock()
_client: Any = None
_inside_lock = threading.Lock()
_inside: set[tuple[str, str, str, str]] = set()  # (store, scope, key, holder) of runs in this process
# A lease store without a table (in memory) is named by a number of its own, never reused: an id()
# can be, once the store is gone, and a mark left by a run that never ended would then match it.
_store_numbers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
_numbers = itertools.count()


class MissingKey(SluiceError, ValueError):
    """The key expression found nothing usable in the event (None, an empty string, a list or object)."""

    def __init__(self, expression: str, found: Any) -> None:
        kind = "nothing" if found is None else f"{type(found).__name__} {json.dumps(found, default=str)[:80]}"
        super().__init__(
            f"@exclusive key {expression!r} found {kind} in the event; it needs a string or number"
        )
        self.expression = expression
        self.found = found


class Reentered(SluiceError, RuntimeError):
    """A run asked again for a key it holds (same holder): releasing the inner one would free the outer."""


def _default_client() -> Any:
    global _client
    with _client_lock:
        if _client is None:
            import boto3

            _client = boto3.session.Session().client("dynamodb")
        return _client


def _is_lambda_context(context: Any) -> bool:
    return callable(getattr(context, "get_remaining_time_in_millis", None))


class Held:
    """What a run holds: the ``lease``, the key's ``state`` (a dict it may change; written back on
    release when asked for) and ``released`` (None inside, then whether the release freed the lease)."""

    def __init__(self, lease: Lease, guard: _Guard) -> None:
        self.lease = lease
        self.state: dict[str, Any] = dict(lease.state or {})
        self.released: bool | None = None
        self._guard = guard

    @property
    def last_error(self) -> LastError | None:
        """The last exception recorded on the key before this run (``record_errors``)."""
        return self.lease.last_error

    def renew(self, ttl: float) -> Lease:
        """Hold ``ttl`` more seconds from now (long work outside Lambda): the lock lasts ``ttl`` +
        ``margin``. ``LeaseLost`` if taken over, or if the answer came back after those ``ttl`` seconds."""
        guard, now = self._guard, self._guard.clock.now()
        end = now + check_ttl(ttl)
        lease = guard.leases().renew(self.lease, now, guard.lock_end(end) - now)
        if not guard.in_time(end):
            raise LeaseLost(lease, f"the renewal came back after the {ttl:g} s it asked for: stop here")
        self.lease = lease
        return self.lease


class _Guard:
    """One configuration: the scope, the limit, where leases live and what to do when busy."""

    def __init__(
        self,
        name: str,
        *,
        limit: int = 1,
        table_name: str | None = None,
        client: Any = None,
        leases: Leases | None = None,
        clock: Any = None,
        sleep: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
        on_busy: Literal["raise", "wait"] = "raise",
        wait_seconds: float | None = None,
        margin: float = DEFAULT_MARGIN,
        record_errors: bool = False,
        state: bool = False,
    ) -> None:
        self.scope = check_scope(name)
        self.limit = check_limit(limit)
        if on_busy not in ("raise", "wait"):
            raise ValueError(f"on_busy is 'raise' or 'wait', got {on_busy!r}")
        if state and limit != 1:
            raise ValueError("state=True needs limit=1: with several holders at once there is no 'next' one")
        if margin < 0 or (wait_seconds is not None and wait_seconds < 0):
            raise ValueError("margin and wait_seconds are >= 0 seconds")
        self.table_name = table_name
        self.client = client
        self._leases = leases
        self.clock = clock or SystemClock()
        self.sleep = sleep or time.sleep
        self.rng = rng or random.Random()
        self.on_busy = on_busy
        self.wait_seconds = wait_seconds
        self.margin = float(margin)
        self.record_errors = record_errors
        self.keep_state = state
        self._lock = threading.Lock()

    def leases(self) -> Leases:
        with self._lock:
            if self._leases is None:
                from sluice.adapters.dynamo.lease import DynamoLeases

                table = self.table_name or os.environ.get(TABLE_ENV)
                if not table:
                    raise ConfigurationError(
                        f"@exclusive needs table_name= or the {TABLE_ENV} environment variable"
                    )
                self._leases = DynamoLeases(
                    self.client or _default_client(), table, rng=self.rng, sleep=self.sleep
                )
            return self._leases

    def store(self) -> str:
        table = getattr(self._leases, "table", None)
        if table is None:
            with _inside_lock:
                table = _store_numbers.get(self._leases)
                if table is None:
                    table = _store_numbers[self._leases] = next(_numbers)
        return f"{type(self._leases).__name__}:{table}"

    def lock_end(self, end: float) -> float:
        """The lock outlasts the run by the margin: a taker's clock ahead by less sees it end only
        after the run's own end (sluice.primitives.lease, "Clock assumption")."""
        return end + self.margin

    def in_time(self, end: float) -> bool:
        """Whether a run that ends at ``end`` still has time, by the clock read now: after an answer,
        never by the reading its request was dated with (the request may have waited)."""
        return self.clock.now() < end

    def acquire(self, key: str, holder: str, ends_at: Callable[[float], float], wait_until: float) -> Lease:
        """Take a lease for a run that ends at ``ends_at(now)``; when busy, raise or wait with backoff
        and jitter until ``wait_until``."""
        leases = self.leases()
        attempt, stale = 0, 0
        while True:
            now = self.clock.now()
            end = ends_at(now)
            try:
                lease = leases.acquire(self.scope, key, holder, now, self.lock_end(end) - now, self.limit)
                if self.in_time(end):
                    return lease
                # Granted, but dated by the reading taken before the request: the run's time under it
                # ran out while the request was on its way (sluice.primitives.lease, "A grant that
                # comes back after its own end"), and another run may take it soon. Give it back and
                # ask again while the run has time left.
                stale += 1
                later = self.clock.now()
                self._give_back(lease, stale, ends_at(later) <= later)
                continue
            except Busy:
                if self.on_busy == "raise":
                    raise
                step = min(BACKOFF_CAP, BACKOFF_FIRST * 2**attempt)
                delay = step / 2 + self.rng.uniform(0, step / 2)
                attempt += 1
                left = wait_until - self.clock.now()
                if left <= 0:
                    raise
                self.sleep(min(delay, left))  # the last try lands on the deadline

    def _give_back(self, lease: Lease, stale: int, out_of_time: bool) -> None:
        log.warning(
            "%s was granted after the run's time under it had ended: given back",
            describe(self.scope, lease.key),
        )
        self.leases().release(lease)  # False when already taken over: nothing to give back
        if out_of_time:
            raise TransientError(
                f"{describe(self.scope, lease.key)}: granted after the invocation's deadline; given back",
                operation="UpdateItem",
            )
        if stale >= STALE_GRANTS:
            raise TransientError(
                f"{describe(self.scope, lease.key)}: {stale} grants came back after the run's time under "
                "them had ended; the lease store answers slower than ttl (raise ttl, or check the clock)",
                operation="UpdateItem",
            )

    def release(self, held: Held, exc: BaseException | None) -> None:
        state, bad_state = None, None
        if self.keep_state:
            try:
                encode_state(held.state)
                state = held.state
            except StateError as refused:
                bad_state = refused  # released without it: the lease is freed all the same
        error = None
        if exc is not None and self.record_errors:
            error = LastError.of(exc, self.clock.now(), held.lease.holder)
        try:
            held.released = self.leases().release(held.lease, state=state, error=error)
        except SluiceError as failed:
            # Throttled or refused: the lease expires at its ttl. The run's own outcome stands, unless
            # the state it wrote would be lost without a word.
            log.warning("release of %s failed: %s", describe(self.scope, held.lease.key), failed)
            if exc is None and self.keep_state:
                raise
        if bad_state is not None and exc is None:
            raise bad_state
        if held.released is False:
            log.warning(
                "%s was taken over before its release (it expired): the run outlived its lease",
                describe(self.scope, held.lease.key),
            )

    def hold(self, key: str, holder: str, ends_at: Callable[[float], float], wait_until: float) -> _Hold:
        return _Hold(self, key, holder, ends_at, lambda: wait_until)


class _Hold:
    """The context manager: acquire on enter; on exit release, unless a ``BaseException`` that is not
    an ``Exception`` (a timeout, a kill) is on its way out: then the lease is left to expire."""

    def __init__(
        self,
        guard: _Guard,
        key: str,
        holder: str,
        ends_at: Callable[[float], float],
        wait_until: Callable[[], float],
    ):
        self.guard, self.key, self.holder = guard, check_key(key), holder
        self.ends_at, self.wait_until = ends_at, wait_until
        self.held: Held | None = None
        self._mark: tuple[str, str, str, str] | None = None

    def __enter__(self) -> Held:
        self.guard.leases()
        mark = (self.guard.store(), self.guard.scope, self.key, self.holder)
        with _inside_lock:
            if mark in _inside:
                raise Reentered(
                    f"{describe(self.guard.scope, self.key)} is held by this run already ({self.holder!r})"
                )
            _inside.add(mark)
        try:
            self.held = Held(
                self.guard.acquire(self.key, self.holder, self.ends_at, self.wait_until()), self.guard
            )
        except BaseException:
            with _inside_lock:
                _inside.discard(mark)
            raise
        self._mark = mark
        return self.held

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            if self.held is not None and (exc is None or isinstance(exc, Exception)):
                self.guard.release(self.held, exc)
        finally:
            if self._mark is not None:  # set by ``__enter__``, which came first
                with _inside_lock:
                    _inside.discard(self._mark)


def _timing(
    guard: _Guard, context: Any, ttl: float, wait_seconds: float | None
) -> tuple[str, Callable[[float], float], float]:
    """The holder, the run's end if it acquires at a given time, and the end of waiting, for one call
    (the lock lasts ``margin`` beyond the run's end: ``_Guard.lock_end``).

    In Lambda: the request id; the deadline (remaining time read now); waiting ends ``margin`` before
    the deadline. Elsewhere: a uuid; ``ttl`` from the acquire's request; ``ttl``."""
    now = guard.clock.now()
    if not _is_lambda_context(context):
        wait = ttl if wait_seconds is None else wait_seconds
        return uuid.uuid4().hex, lambda t: t + ttl, now + wait
    deadline = now + context.get_remaining_time_in_millis() / 1000
    holder = str(getattr(context, "aws_request_id", "") or uuid.uuid4().hex)
    wait_until = deadline - guard.margin if wait_seconds is None else now + wait_seconds
    return holder, lambda t: max(deadline, t), wait_until


def key_text(expression: str, found: Any) -> str:
    """The lease key for what a JMESPath expression found: a string as is, a number as JSON."""
    if isinstance(found, bool) or not isinstance(found, str | int | float) or found == "":
        raise MissingKey(expression, found)
    text = found if isinstance(found, str) else json.dumps(found)
    try:
        return check_key(text)
    except BadLeaseName as exc:
        raise BadLeaseName(f"@exclusive key {expression!r}: {exc}") from None


def hold(
    name: str,
    key: str | int,
    *,
    ttl: float = DEFAULT_TTL,
    limit: int = 1,
    holder: str | None = None,
    wait_seconds: float | None = None,
    **options: Any,
) -> _Hold:
    """``with hold("orders", key, ttl=60) as held: ...`` holds ``key`` of scope ``name`` for at most
    ``ttl`` seconds from the acquire's request (``held.renew(ttl)`` for more); the lock lasts ``margin``
    longer, for the clocks' sake. ``options`` as for ``exclusive``: ``on_busy``,
    ``record_errors``, ``state``, ``table_name``, ``client``, ``leases``, ``clock``, ``sleep``."""
    guard = _Guard(name, limit=limit, wait_seconds=wait_seconds, **options)
    length = check_ttl(ttl)
    wait = length if wait_seconds is None else wait_seconds
    return _Hold(
        guard,
        key_text("key", key),
        holder or uuid.uuid4().hex,
        lambda now: now + length,
        lambda: guard.clock.now() + wait,  # waiting starts when the block is entered
    )


def inspect(name: str, key: str | int, *, limit: int = 1, **options: Any) -> tuple[LeaseSlot, ...]:
    """The key's items as they are now: holders, expiries, state, last error (for tools and tests)."""
    return _Guard(name, limit=limit, **options).leases().inspect(name, key_text("key", key), limit)


class _Exclusive:
    """``exclusive(expression, ...)`` decorates a function; ``exclusive.hold(name, key, ...)`` is the
    context manager (``hold``). See docs/concurrency.md."""

    hold = staticmethod(hold)
    inspect = staticmethod(inspect)

    def __call__(
        self,
        expression: str,
        *,
        limit: int = 1,
        name: str | None = None,
        on_busy: Literal["raise", "wait"] = "raise",
        wait_seconds: float | None = None,
        ttl: float = DEFAULT_TTL,
        margin: float = DEFAULT_MARGIN,
        record_errors: bool = False,
        state: bool = False,
        table_name: str | None = None,
        client: Any = None,
        leases: Leases | None = None,
        clock: Any = None,
        sleep: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
    ) -> Callable[[F], F]:
        compiled = jmespath.compile(expression)
        length = check_ttl(ttl)

        def decorate(fn: F) -> F:
            guard = _Guard(
                name or f"{fn.__module__}.{fn.__qualname__}",
                limit=limit,
                table_name=table_name,
                client=client,
                leases=leases,
                clock=clock,
                sleep=sleep,
                rng=rng,
                on_busy=on_busy,
                wait_seconds=wait_seconds,
                margin=margin,
                record_errors=record_errors,
                state=state,
            )

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                event = args[0] if args else kwargs.get("event")
                context = args[1] if len(args) > 1 else kwargs.get("context")
                key = key_text(expression, compiled.search(event))
                holder, ends_at, wait_until = _timing(guard, context, length, wait_seconds)
                with guard.hold(key, holder, ends_at, wait_until) as held:
                    if state:
                        return fn(*args, state=held.state, **kwargs)
                    return fn(*args, **kwargs)

            return _guarded(fn, run, guard)

        return decorate


def _guarded(fn: F, run: Callable[..., Any], guard: _Guard) -> F:
    """``run``, ``fn``'s wrapper, as the type of ``fn``: it takes ``fn``'s arguments and returns its
    result (``functools.wraps`` gave it ``fn``'s name and docs), its guard at ``exclusive``."""
    run.__dict__["exclusive"] = guard
    return cast(F, run)


exclusive = _Exclusive()
