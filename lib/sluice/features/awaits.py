"""Awaits: a payload that starts only once every key it awaits has SUCCEEDED.

A message names the keys it awaits in the attribute ``sluice-awaits`` (a JSON array of keys;
``sluice enqueue --after KEY``). A key has SUCCEEDED when its payload record names a first
SUCCEEDED run (``PayloadRecord.succeeded_by``, written by the release with the receipt and never
removed), so "satisfied" only ever goes one way. A key *ended badly* when its lease is free, it has
never SUCCEEDED and its latest run ended FAILED, TIMED_OUT or ABORTED, or vanished (``once_unknown``).

Until its awaits are satisfied a waiter is parked in the table, and its message deleted, so it
spends no receives and blocks nothing in its group:

    WAIT#<message id>   the waiter: key, body, group, attributes, the keys it awaits, whether it runs
                        anyway after a failure, parked_at; once released: released_at, how
                        (sent | dead-lettered), the reason, expires_at
    AWAITED#<key>       waiters: string set of the waiters (message ids) parked on that key
    AWAITING            waiters: string set of every parked waiter (reconciliation's sweep)

Parking is one transaction (the WAIT# item, AWAITED#<k> for each key still missing, AWAITING): a
set ``ADD``, so a redelivered message parks again as a no-op. It is not conditioned on the awaited
keys: the launcher reads the missing keys again *after* the park commits, and the completion reads
AWAITED#<k> *after* its release wrote the receipt. Both reads are consistent, so at least one of the
two sees the other's write and the waiter cannot be left behind:

    launcher (waiter W awaits k)               completion of k's run
    ────────────────────────────               ─────────────────────
    read PAYLOAD#k: not SUCCEEDED
    park: WAIT#W, AWAITED#k += W               release: PAYLOAD#k succeeded_by = e
    read PAYLOAD#k again                       read AWAITED#k
    delete the message

    either the launcher's second read sees succeeded_by (it releases W itself), or the
    completion's read sees W (it releases W), or both (two sends of one waiter: below).

A receive with several waiters reads the keys they all await in one BatchGetItem (``read_ahead``)
before any is processed; each gate judges from it (a verdict of "ended badly" on a read of its own:
a dead-letter is final, and the key may have run again since). The read after the park is always
the waiter's own.

**Release** (``settle``): all satisfied → the message is sent back to the queue in its group with
its original id (``sluice-origin-message-id``, so the same execution name) and a deduplication id
that is a function of that id, and without ``sluice-awaits`` (met, and satisfied only goes one way,
so its admission does not read them again); it is admitted like any message. A key ended badly →
dead-lettered (``awaited KEY ended FAILED``), unless ``sluice-on-await-failure: run`` (released once
every awaited key has ended, whichever way); a key with a young redriven mark may run again, and is
waited for (``PayloadRecord.may_run_again``). Then, and only then, the waiter is marked released and
taken off the sets. A crash leaves it parked; reconciliation's sweep (each tick) settles it again:

    completion: release(k) ─✗ crash: W still parked ─► sweep: all satisfied → send W
    send W ─✗ crash before the mark: W still parked ─► sweep: send W again. Within 5 minutes SQS
        drops it (same deduplication id). Later it is a second copy with the same origin id, so the
        same execution name: the lease refuses it while the first copy's run is live (it resumes or
        is a duplicate of it), and once that run has ended the claim refuses its name
        (``AlreadyRan``): it is settled as already run. A name runs once.

**Horizon.** A waiter parked longer than the await horizon (``SLUICE_AWAIT_HORIZON_SECONDS``, 7 days)
on a key with no SUCCEEDED run and no live lease is dead-lettered by the sweep: ``awaited KEY not
seen within the await horizon (604800 s)``. A key still running at the horizon is waited for.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sluice.core.errors import InvalidPayload, TransientError
from sluice.core.model import Message, ParkedMessage, Payload, PayloadRecord, PayloadState
from sluice.core.names import named_entry, origin_id
from sluice.core.ports import Queue
from sluice.core.validation import json_depth
from sluice.features.keys import waiter_attributes

log = logging.getLogger("sluice.awaits")

AWAITS_ATTRIBUTE = "sluice-awaits"
ON_FAILURE_ATTRIBUTE = "sluice-on-await-failure"
RUN_ANYWAY = "run"
# One park is one transaction of at most 100 items: WAIT#, AWAITING and one AWAITED# per key.
MAX_AWAITS = 98
MAX_AWAITED_KEY_BYTES = 1_024
# The longest value holding MAX_AWAITS keys of MAX_AWAITED_KEY_BYTES, each character escaped (\uXXXX)
MAX_AWAITS_CHARS = MAX_AWAITS * (MAX_AWAITED_KEY_BYTES * 6 + 4) + 2
DEFAULT_HORIZON_SECONDS = 7 * 86_400
WAKE_HOLDER = "sluice-awaits"  # the "holder" a woken waiter's deduplication id is derived from
BAD_ENDS = (PayloadState.FAILED, PayloadState.TIMED_OUT, PayloadState.ABORTED)


@dataclass(frozen=True, slots=True)
class Waiter:
    """Item ``WAIT#<entry>``: a message parked until the keys it awaits have SUCCEEDED."""

    message_id: str  # the original SQS message id: the re-sent copy keeps its execution name
    key: str
    body: str
    group_id: str
    attributes: dict[str, str]
    awaits: tuple[str, ...]
    run_anyway: bool
    parked_at: float
    released_at: float | None = None
    how: str | None = None  # "sent" | "dead-lettered", once released
    reason: str | None = None
    # Parked under ``WAIT#<name>``: beside a waiter of another key under the same origin id.
    by_name: bool = False

    @property
    def parked(self) -> bool:
        return self.released_at is None

    @property
    def entry(self) -> str:
        """Its id in the awaits sets and its item's: its message id, or the name it runs under where
        a waiter of another key holds that id (a producer's message carrying the same
        ``sluice-origin-message-id`` is another message). Not the name always: the previous version
        releases a waiter by its message id."""
        return named_entry(self.key, self.message_id) if self.by_name else self.message_id


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a waiter's awaits say now: ``ready``, ``wait`` (for ``missing``) or ``dead`` (``reason``)."""

    kind: str
    missing: tuple[str, ...] = ()
    reason: str = ""
    states: dict[str, str] = field(default_factory=dict)


class AwaitStore(Protocol):
    """The store's side of awaits (``MemoryStore``, ``DynamoStore``)."""

    def payloads(self, keys: Iterable[str]) -> dict[str, PayloadRecord]:
        """The payload records of ``keys`` that exist, read consistently."""
        ...

    def park_waiter(self, waiter: Waiter, missing: Sequence[str]) -> Waiter:
        """Park ``waiter`` on each of ``missing`` (set semantics: parking it again changes nothing).
        A waiter released before is parked afresh. Returns it as parked: under its name
        (``by_name``) where a waiter of another key holds its message id."""
        ...

    def waiters_on(self, key: str) -> frozenset[str]:
        """The waiters (their entries) parked on ``key``; may include some released since."""
        ...

    def waiting(self) -> frozenset[str]:
        """Every parked waiter (its entry); may include some released since."""
        ...

    def waiters(self, entries: Iterable[str]) -> list[Waiter]:
        """The waiter records of ``entries`` (``Waiter.entry``) that exist, parked or released, oldest first."""
        ...

    def release_waiter(self, waiter: Waiter, *, how: str, reason: str | None, now: float) -> bool:
        """Mark ``waiter`` released (sent or dead-lettered) and take it off every set. False when it
        was released already."""
        ...

    def record_invalid(self, *, key: str, reason: str, now: float) -> None: ...


# -- reading a message ---------------------------------------------------------------------------


def awaits_of(message: Message, key: str | None = None) -> tuple[tuple[str, ...], bool]:
    """The keys a message awaits (in order, without repeats) and whether it runs anyway after an
    awaited key ended badly. Raises ``InvalidPayload`` for a malformed attribute."""
    raw = message.attributes.get(AWAITS_ATTRIBUTE)
    run_anyway = parse_policy(message.attributes.get(ON_FAILURE_ATTRIBUTE, ""), key=key)
    return (() if raw is None else parse_awaits(raw, key=key)), run_anyway


def parse_policy(raw: str, *, key: str | None = None) -> bool:
    """A ``sluice-on-await-failure`` value: True for ``run``; ``dead-letter`` or empty: False."""
    policy = raw.strip().lower()
    if policy not in ("", RUN_ANYWAY, "dead-letter"):
        raise InvalidPayload(f"{ON_FAILURE_ATTRIBUTE}={raw[:40]!r}: use 'run' or 'dead-letter'", key=key)
    return policy == RUN_ANYWAY


def parse_awaits(raw: str, *, key: str | None = None) -> tuple[str, ...]:
    """A ``sluice-awaits`` value: a JSON array of keys. Bounded before it is read (its size, its
    nesting) and read with every error caught: a deep array raises RecursionError, a 5,000-digit
    number ValueError, and either would otherwise escape the batch's read-ahead. Blank: none."""
    if not raw.strip():
        return ()
    if len(raw) > MAX_AWAITS_CHARS:
        raise InvalidPayload(
            f"{AWAITS_ATTRIBUTE} is {len(raw):,} characters; at most {MAX_AWAITS_CHARS:,}", key=key
        )
    if json_depth(raw) > 1:
        raise InvalidPayload(f"{AWAITS_ATTRIBUTE} is nested: use a flat JSON array of keys", key=key)
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidPayload(f"{AWAITS_ATTRIBUTE} is not JSON: use an array of keys", key=key) from None
    return check_awaits(value, key=key)


def check_awaits(value: object, *, key: str | None = None) -> tuple[str, ...]:
    """The rules for a list of awaited keys, shared by ``sluice enqueue`` and the launcher."""
    if not isinstance(value, list):
        raise InvalidPayload(f"{AWAITS_ATTRIBUTE} must be a JSON array of keys", key=key)
    keys: list[str] = []
    for item in value:
        if not isinstance(item, str) or not item:
            raise InvalidPayload(f"{AWAITS_ATTRIBUTE}: every awaited key must be a non-empty string", key=key)
        if len(item.encode("utf-8", "surrogatepass")) > MAX_AWAITED_KEY_BYTES or any(
            ord(c) < 32 or ord(c) == 127 for c in item
        ):
            raise InvalidPayload(
                f"{AWAITS_ATTRIBUTE}: awaited key {item[:64]!r} is over {MAX_AWAITED_KEY_BYTES} bytes "
                "or has control characters",
                key=key,
            )
        if item == key:
            raise InvalidPayload(f"awaits cycle: {key!r} awaits itself", key=key)
        if item not in keys:
            keys.append(item)
    if len(keys) > MAX_AWAITS:
        raise InvalidPayload(f"{AWAITS_ATTRIBUTE}: {len(keys)} keys; at most {MAX_AWAITS}", key=key)
    return tuple(keys)


# -- judging ---------------------------------------------------------------------------------------


def state_of(record: PayloadRecord | None) -> str:
    """An awaited key as a waiter sees it: SUCCEEDED, an ended-badly state, or what it is doing."""
    if record is None:
        return "UNSEEN"
    if record.succeeded_by:
        return PayloadState.SUCCEEDED.value
    return record.state.value


def last_end(record: PayloadRecord) -> PayloadState | None:
    """How the key's latest run ended: its receipt's outcome, which a later rolled-back claim or an
    invalid message of the key does not change (records written before it was kept: their state)."""
    return record.receipt_state if record.receipt_state is not None else record.state


def judge(
    awaits: Sequence[str],
    records: Mapping[str, PayloadRecord],
    *,
    run_anyway: bool,
    parked_at: float | None = None,
    now: float | None = None,
    horizon: float | None = None,
) -> Verdict:
    states = {k: state_of(records.get(k)) for k in awaits}
    missing: list[str] = []
    for k in awaits:
        record = records.get(k)
        if record is not None and record.succeeded_by:
            continue
        free = record is not None and record.holder is None and not record.may_run_again(now)
        if free and record is not None and last_end(record) in BAD_ENDS:
            if not run_anyway:
                return Verdict("dead", reason=f"awaited {k} ended {last_end(record).value}", states=states)
            continue
        if free and record is not None and record.once_unknown is not None:
            if not run_anyway:  # its run vanished with its state machine (sluice status KEY names it)
                return Verdict("dead", reason=f"awaited {k} ended with an unknown outcome", states=states)
            continue
        missing.append(k)
    if not missing:
        return Verdict("ready", states=states)
    if horizon is not None and parked_at is not None and now is not None and now - parked_at >= horizon:
        for k in missing:
            record = records.get(k)
            if record is None or record.holder is None:
                return Verdict(
                    "dead",
                    reason=f"awaited {k} not seen within the await horizon ({int(horizon)} s)",
                    states=states,
                )
    return Verdict("wait", missing=tuple(missing), states=states)


# -- the launcher's gate ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadAhead:
    """The keys awaited by a whole receive's messages, read in one BatchGetItem before any of them
    is processed (``read_ahead``), instead of one read per message. ``keys``: the keys asked for
    (a key never seen has no record)."""

    keys: frozenset[str] = frozenset()
    records: Mapping[str, PayloadRecord] = field(default_factory=dict)

    def covers(self, awaits: Iterable[str]) -> bool:
        return self.keys.issuperset(awaits)


def read_ahead(store: AwaitStore, messages: Sequence[Message]) -> ReadAhead:
    """One read of every key the messages await, when two or more of them await keys (one message
    reads its own, at the same cost). A malformed attribute is left to its own gate, which
    dead-letters it; a throttled read leaves each message to read its own."""
    keys: set[str] = set()
    waiting = 0
    for message in messages:
        try:
            awaits, _ = awaits_of(message)
        except InvalidPayload:
            continue
        if awaits:
            keys.update(awaits)
            waiting += 1
    if waiting < 2:
        return ReadAhead()
    try:
        return ReadAhead(frozenset(keys), store.payloads(sorted(keys)))
    except TransientError:
        return ReadAhead()


def gate(
    *, store: AwaitStore, queue: Queue, payload: Payload, now: float, ahead: ReadAhead | None = None
) -> bool:
    """Before a claim: True when the message was parked (or settled) and is to be deleted; False
    when its awaits are satisfied (or it awaits nothing): claim it. Raises ``InvalidPayload`` for a
    bad attribute or an awaited key that ended badly (the launcher dead-letters it). ``ahead``: the
    batch's read of awaited keys, used in place of this message's own read when it covers them."""
    message = payload.message
    awaits, run_anyway = awaits_of(message, payload.key)
    if not awaits:
        return False
    if ahead is not None and ahead.covers(awaits):
        verdict = judge(awaits, ahead.records, run_anyway=run_anyway, now=now)
        if verdict.kind == "dead":
            # Read a moment earlier, for the whole batch: a key rerun since may be live again. A
            # dead-letter is final, so it is judged on a read of its own; "SUCCEEDED" never goes back.
            verdict = judge(awaits, store.payloads(awaits), run_anyway=run_anyway, now=now)
    else:
        verdict = judge(awaits, store.payloads(awaits), run_anyway=run_anyway, now=now)
    if verdict.kind == "ready":
        return False
    if verdict.kind == "dead":
        raise InvalidPayload(verdict.reason, key=payload.key)
    waiter = Waiter(
        message_id=origin_id(message.message_id, message.attributes),
        key=payload.key,
        body=message.body,
        group_id=message.group_id,
        attributes=waiter_attributes(message),  # no origin id, no key ticket (sluice.features.parking.park)
        awaits=awaits,
        run_anyway=run_anyway,
        parked_at=now,
    )
    waiter = store.park_waiter(waiter, verdict.missing)
    log.info(
        "payload parked until its awaits have SUCCEEDED",
        extra={
            "correlation_id": payload.key,
            "message_id": waiter.message_id,
            "missing": list(verdict.missing),
        },
    )
    # A receipt written between the first read and the park is seen here (see the module docstring).
    settle(store=store, queue=queue, waiter=waiter, now=now)
    return True


# -- release -----------------------------------------------------------------------------------------


def settle(
    *,
    store: AwaitStore,
    queue: Queue,
    waiter: Waiter,
    now: float,
    horizon: float | None = None,
    records: Mapping[str, PayloadRecord] | None = None,
) -> str:
    """Release ``waiter`` if its awaits say so: "sent", "dead-lettered" or "waiting". ``records``:
    the awaited keys' records, read (after the write that may have satisfied them) for several
    waiters at once; read here when not given."""
    verdict = judge(
        waiter.awaits,
        records if records is not None else store.payloads(waiter.awaits),
        run_anyway=waiter.run_anyway,
        parked_at=waiter.parked_at,
        now=now,
        horizon=horizon,
    )
    if verdict.kind == "wait":
        return "waiting"
    if verdict.kind == "ready":
        queue.requeue(_parked(waiter))
        store.release_waiter(waiter, how="sent", reason=None, now=now)
        log.info(
            "waiter released into admission",
            extra={"correlation_id": waiter.key, "message_id": waiter.message_id},
        )
        return "sent"
    # Its key too, as its re-send's (``_parked``): a waiter of another key under the same origin id
    # is another message, whose copy SQS must not drop as this one's within 5 minutes.
    queue.send_to_dlq(_message(waiter), verdict.reason, dedup=f"{waiter.message_id}#{waiter.key}")
    store.record_invalid(key=waiter.key, reason=verdict.reason, now=now)
    store.release_waiter(waiter, how="dead-lettered", reason=verdict.reason, now=now)
    log.warning(
        "waiter dead-lettered",
        extra={"correlation_id": waiter.key, "message_id": waiter.message_id, "reason": verdict.reason},
    )
    return "dead-lettered"


def on_receipt(
    *, store: AwaitStore, queue: Queue, key: str, now: float, succeeded_by: str | None = None
) -> int:
    """A run of ``key`` ended and its receipt is written: settle the waiters parked on it. Returns
    how many were released. A failure here leaves them parked for reconciliation's sweep.
    ``succeeded_by``: the run that just SUCCEEDED, whose release wrote the key's ``succeeded_by``
    (never removed): the key's record is not read again."""
    try:
        ids = store.waiters_on(key)
        if not ids:
            return 0
        released = 0
        waiters = [w for w in store.waiters(ids) if w.parked]
        known = {}
        if succeeded_by is not None:
            known[key] = PayloadRecord(key=key, state=PayloadState.SUCCEEDED, succeeded_by=succeeded_by)
        records = _records(store, waiters, known)
        for waiter in waiters:
            if settle(store=store, queue=queue, waiter=waiter, now=now, records=records) != "waiting":
                released += 1
        return released
    except TransientError as exc:
        log.warning("waiters not settled; reconciliation will", extra={"payload_key": key, "error": str(exc)})
        return 0


def sweep(
    *, store: AwaitStore, queue: Queue, now: float, horizon: float, ids: frozenset[str] | None = None
) -> dict[str, int]:
    """Reconciliation: settle every parked waiter (a wake-up lost to a crash, a key past the
    horizon). Returns counts by outcome. ``ids``: the AWAITING index as already read."""
    counts: dict[str, int] = {}
    ids = store.waiting() if ids is None else ids
    if not ids:
        return counts
    found = store.waiters(ids)
    records = _records(store, [w for w in found if w.parked])
    for waiter in found:
        if not waiter.parked:
            store.release_waiter(waiter, how=waiter.how or "sent", reason=waiter.reason, now=now)
            continue
        how = settle(store=store, queue=queue, waiter=waiter, now=now, horizon=horizon, records=records)
        counts[how] = counts.get(how, 0) + 1
    if counts:
        log.info("awaits swept", extra={"awaits": counts})
    return counts


def _records(
    store: AwaitStore, waiters: Sequence[Waiter], known: Mapping[str, PayloadRecord] | None = None
) -> dict[str, PayloadRecord]:
    """Every key these waiters await, read at once (BatchGetItem, 100 keys a call) rather than
    once per waiter: a fan-in's sink awaits 50 keys, and reconciliation settles every waiter.
    ``known``: records already known to satisfy (not read)."""
    known = dict(known or {})
    keys = {k for w in waiters for k in w.awaits} - set(known)
    return {**(store.payloads(sorted(keys)) if keys else {}), **known}


def _parked(waiter: Waiter) -> ParkedMessage:
    """The waiter as it is sent back: without its awaits, which were met (they only go one way), so
    its admission does not read them again."""
    met = (AWAITS_ATTRIBUTE, ON_FAILURE_ATTRIBUTE)
    return ParkedMessage(
        message_id=waiter.message_id,
        key=waiter.key,
        # Its key too: a waiter of another key under the same origin id (a producer's forgery) is
        # another message, whose send SQS must not take for this one's within 5 minutes.
        holder=f"{WAKE_HOLDER}#{waiter.key}",
        body=waiter.body,
        group_id=waiter.group_id,
        attributes={k: v for k, v in waiter.attributes.items() if k not in met},
        parked_at=waiter.parked_at,
    )


def _message(waiter: Waiter) -> Message:
    return Message(
        message_id=waiter.message_id,
        receipt_handle="",
        body=waiter.body,
        group_id=waiter.group_id,
        attributes=dict(waiter.attributes),
    )
