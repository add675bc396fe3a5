"""Concurrency keys: at most ``cap`` payloads of one key run at once, the rest wait their turn.

A message names its key in the attribute ``sluice-concurrency-key`` (``sluice enqueue
--concurrency-key KEY`` or ``--concurrency-key-field FIELD``). The cap is the stack parameter
``keyConcurrency`` (``SLUICE_KEY_CONCURRENCY``, default 1) unless the key has its own
(``sluice set-max N --key KEY``; 0 pauses the key). A message without the attribute has no key cap.

One item per key holds its runs and its waiting line:

    CKEY#<key>   holders   string set of the executions of the key holding a slot
                 cap       the key's own cap (absent: the default)
                 tickets   how many waiters were ever parked (the next ticket)
                 woken     how many of them were sent back (the head of the line)
                 inflight  string set "<ticket>@<ms sent back>": woken waiters whose claim has not landed
    KWAIT#<key>#<ticket>   a waiter: the message (body, group, attributes, original id), parked_at
    KEYS_WAITING           keys: string set of the keys with waiters (reconciliation's sweep)
    KWAITOF#<payload key>  the payload's latest place in a line (ckey, ticket), for ``sluice status``

**Claim.** A keyed claim adds ``CKEY#<key>`` to the claim's transaction, conditioned on the key
having room (``size(holders) < cap``) and, for a message that was not woken from the line, on
nobody waiting and nobody woken on the way (``woken = tickets``, ``inflight`` empty): a newcomer
never overtakes a waiter. A woken waiter's claim takes its ticket out of ``inflight``. The release removes the
execution from ``holders`` in its own transaction, and an adoption (a redriven run) adds it
unconditionally: it runs already. So the key's runs never exceed its cap, whatever interleaves.

**Wait.** A claim refused for the key (``KeyFull``) parks the message: one transaction writes
``KWAIT#<key>#<t>`` and moves ``tickets`` from t to t + 1 (conditioned on t, so two parkers get
two tickets), and adds the key to ``KEYS_WAITING``; then the message is deleted. It spends no
receives and holds nothing in its FIFO group while it waits.

**Wake** (``wake``). Read ``CKEY#<key>``; room = cap − holders − the waiters sent back in the
last ``INFLIGHT_SECONDS`` whose claim has not landed (their slot is kept for them); send the next
``min(room, tickets − woken)`` waiters back to the queue in their groups, with their original
message id (``sluice-origin-message-id``: the same execution name) and their ticket
(``sluice-key-ticket``, which lets their claim pass the line), then move ``woken`` forward and
note them in ``inflight`` (conditioned on the ``woken`` read). An in-flight ticket older than
``INFLIGHT_SECONDS`` (its message was dead-lettered, or waits for a global slot) stops holding a
slot and is dropped at the next wake, so a lost message cannot keep a key's slot for good.
Every release of a keyed run wakes its key, and the parker wakes the key itself after its park
commits. Both reads are consistent, so at least one sees the other's write:

    launcher (message M of key k)              completion of a run of k
    ─────────────────────────────              ────────────────────────
    claim: k full  ✗
                                               release: holders −= run
    park M (ticket t, tickets t+1)
    wake k: reads the room and M → sends M     wake k: reads the room, and M if parked by then

    a waiter sent twice (two wakers read the same woken, or a wake after a crash between a send
    and the move of ``woken``) arrives twice: each send's deduplication id is its in-flight entry,
    so every entry noted belongs to a copy that reaches the queue. The copies name one execution:
    the lease refuses the second while the first copy's run is live (ExecutionAlreadyExists after
    it ended), and the copy that did not claim gives its entry back (``forgo``). A copy SQS dropped
    as a repeat would leave its entry keeping a slot, and newcomers in the line, for nobody.

A woken waiter's claim can land before the wake that sent it notes its entry (another launcher
received it at once); the claim then finds no entry to take and records it as ``landed`` instead,
so that the entry noted after it keeps no slot:

    wake k                                     another launcher
    send M (entry e)
                                               receive M, claim: e not in inflight
                                                 → holders += M's run, landed += e
    woken += 1, inflight += e                  (e keeps no slot: it is in landed)
    next wake k: drops e from both sets

A ``landed`` note waits for its wake by its place in the line, never by its date: it is dropped
once its ticket is behind ``woken`` (no wake can note it any more) or past the line's end (forged),
so a launcher whose clock is an hour off cannot drop it before its wake notes the entry. At most
``LANDED_KEPT`` are kept, nearest the head first: forged tickets given back in a line that stands
still would otherwise fill the key's item (``KeyState.stale``).

A copy that does not claim in that window notes ``landed`` the same way: one that parks again
(``replaces`` its entry) and one that gives its entry back (``forgo``; only while its ticket is in
the line and not yet woken, else a forged ticket on an idle key would stay). Without it, a copy
parked again at the back before its wake noted it left its entry keeping a slot for nobody, and
under a key's rate the line behind it waited ``INFLIGHT_SECONDS``. ``forget_key`` clears
``landed``: with nobody in the line no wake is half done, and none would come to drop it.

A woken waiter can still find its key full (the cap was lowered, or its slot stopped being kept
for it after ``INFLIGHT_SECONDS``): it parks again, at the back. A crash between a release and its wake, or
between a send and the move of ``woken``, leaves the waiter parked; reconciliation's sweep
(``sweep``, each scheduled tick) wakes every key in ``KEYS_WAITING`` that has room. So does a parker's
own wake-up that AWS refuses (throttled): the park stands and the message is deleted all the same,
never handed back to the queue, where it would spend receives while it waits.

**Gate.** A key the launch's gate holds (``sluice.core.gates``: a key's rate, ``keyRateLimit``)
is held by it as by its cap: a message takes a grant of the gate before its claim, and one that
finds none waits in the line (``HeldKeys``). A wake sends no more waiters than the gate has room
for, less those sent whose claim has not landed (``gate_room``); the key's next release, the sweep
or a lingering tick (``HeldKeys.wake_held``) wakes it once the gate has room.

A fair lane (``sluice.features.fair``) parks its new messages in their tenant's line and marks ``CKEY#<key>``
with ``fair = <lane>``: only its lane's waker wakes it (``wake`` with ``by_lane``); a release, the
sweep and ``sluice set-max --key`` leave it alone (the sweep wakes it as any key once its lane is no
longer fair). A claim from a fair lane has no default cap for its key (``uncapped``); a claim of
the same key from any other lane has, whatever the mark.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from sluice.core.errors import InvalidPayload, TransientError
from sluice.core.gates import Gate, Grant
from sluice.core.model import Message, ParkedMessage, Payload
from sluice.core.names import ORIGIN_ATTRIBUTE, origin_id
from sluice.core.ports import Clock, Queue
from sluice.core.records import TICKET_PATTERN, KeyState
from sluice.core.validation import check_key

log = logging.getLogger("sluice.keys")

CONCURRENCY_KEY_ATTRIBUTE = "sluice-concurrency-key"
TICKET_ATTRIBUTE = "sluice-key-ticket"
DEFAULT_KEY_CONCURRENCY = 1
WAKE_BATCH = 50  # waiters one wake sends at most (their items and CKEY# in one transaction)
PARK_ATTEMPTS = 20  # parkers of one key racing for the next ticket
FAIR_UNCAPPED = 10_000  # a fair lane's tenant without its own cap: only its lane's MAX holds it
# A waiter is one DynamoDB item (400 KB): its body and attributes, beside its keys and ids. SQS takes
# messages of up to 1 MiB, body and attributes.
WAITER_MAX_BYTES = 400_000


@dataclass(frozen=True, slots=True)
class KeyWaiter:
    """Item ``KWAIT#<key>#<ticket>``: a message waiting for a slot of its concurrency key."""

    ckey: str
    ticket: int
    message_id: str  # the original SQS message id: the re-sent copy keeps its execution name
    key: str  # the payload key
    body: str
    group_id: str
    attributes: dict[str, str]
    parked_at: float


class KeyStore(Protocol):
    """The store's side of concurrency keys (``MemoryStore``, ``DynamoStore``)."""

    key_concurrency: int  # the default cap
    key_gate: Gate  # the launch's gate, as a wake asks it (``sluice.core.gates``)

    def key_state(self, ckey: str) -> KeyState:
        """``CKEY#<ckey>`` read consistently (an empty state when it does not exist)."""
        ...

    def park_for_key(
        self, waiter: KeyWaiter, *, tickets: int, replaces: str | None = None, fair: str | None = None
    ) -> bool:
        """Park ``waiter`` as ticket ``tickets`` (its ``ticket`` is ignored); a woken waiter parking
        again gives up its in-flight entry ``replaces``; ``fair``: the key is a tenant of that fair
        lane (``KeyState.fair``). False when another parker took that ticket first (read the state
        again)."""
        ...

    def key_states(self, ckeys: Sequence[str]) -> dict[str, KeyState]:
        """``CKEY#`` of each key, read consistently in one call (an empty state for a missing one)."""
        ...

    def key_waiters(self, ckey: str, tickets: Sequence[int]) -> list[KeyWaiter]:
        """The waiters of ``ckey`` with these tickets that are still parked, in ticket order."""
        ...

    def advance_key(self, ckey: str, *, woken: int, to: int, now: float, drop: Sequence[str] = ()) -> bool:
        """Move ``woken`` from ``woken`` to ``to``, drop those waiters and note them in flight at
        ``now`` (``entry``); forget the in-flight entries ``drop``. False when ``woken`` had moved."""
        ...

    def key_wait_of(self, key: str) -> KeyWaiter | None:
        """The latest place payload ``key`` took in a key's line (it may have left it since)."""
        ...

    def keys_waiting(self) -> frozenset[str]:
        """Keys that may have waiters, or waiters on the way (reconciliation's sweep)."""
        ...

    def drop_inflight(self, ckey: str, entries: Sequence[str]) -> None:
        """Stop keeping slots for these woken waiters: out of ``inflight``; noted ``landed`` too while
        its ticket is in the line and not yet woken, so that a wake that notes it only after this
        keeps nothing for it (any other ticket, a forged one too, is not noted; a key with no item:
        nothing)."""
        ...

    def keep_inflight(self, ckey: str, entries: Sequence[str]) -> None:
        """Keep slots for these woken waiters again (a claim rolled back: its message returns)."""
        ...

    def forget_key(self, ckey: str) -> None:
        """Take ``ckey`` off ``keys_waiting`` if its line is empty and nobody is on the way (and
        then it is no fair lane's tenant any more)."""
        ...

    def set_key_cap(self, ckey: str, cap: int | None) -> None:
        """Give ``ckey`` its own cap, or (None) put it back on the default."""
        ...


def concurrency_key(message: Message) -> str | None:
    """The message's concurrency key, or None. A bad one is an ``InvalidPayload`` (to the DLQ)."""
    raw = message.attributes.get(CONCURRENCY_KEY_ATTRIBUTE)
    if raw is None:
        return None
    return check_key(raw, source=f"message attribute {CONCURRENCY_KEY_ATTRIBUTE!r}")


def waiter_attributes(message: Message) -> dict[str, str]:
    """The attributes a waiter keeps (its origin and ticket are given again when it is sent back)."""
    return {k: v for k, v in message.attributes.items() if k not in (ORIGIN_ATTRIBUTE, TICKET_ATTRIBUTE)}


def check_fits_line(message: Message, *, key: str) -> None:
    """A keyed message may have to wait in its key's line: one item. One too big for it is an
    ``InvalidPayload`` (to the DLQ with the reason), whether or not its key has room just now."""
    size = len(message.body.encode("utf-8", "surrogatepass")) + len(
        json.dumps(waiter_attributes(message), sort_keys=True).encode()
    )
    if size > WAITER_MAX_BYTES:
        raise InvalidPayload(
            f"body and attributes are {size:,} bytes; a message with a concurrency key waits in its "
            f"key's line, which keeps at most {WAITER_MAX_BYTES:,}",
            key=key,
        )


def entry(ticket: int, at: float) -> str:
    """A woken waiter's in-flight entry, and the ticket attribute it is sent back with."""
    return f"{ticket}@{int(at * 1000)}"


def parse_ticket(raw: str) -> str:
    """A ``sluice-key-ticket`` value, checked (``sluice.features.attributes``): ``<ticket>@<ms>``."""
    if not TICKET_PATTERN.fullmatch(raw):
        raise InvalidPayload(
            f"message attribute {TICKET_ATTRIBUTE!r} is {raw[:40]!r}, not <ticket>@<ms> (ASCII digits)"
        )
    return raw


def ticket_of(message: Message) -> str | None:
    """The in-flight entry a woken waiter carries (its claim passes the line), or None."""
    raw = message.attributes.get(TICKET_ATTRIBUTE)
    return None if raw is None else parse_ticket(raw)


def check_cap(cap: int) -> int:
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
        raise ValueError(f"a key's cap is a whole number ≥ 0 (0 pauses the key), not {cap!r}")
    return cap


def wait(
    *,
    store: KeyStore,
    queue: Queue,
    payload: Payload,
    ckey: str,
    now: float,
    seen: KeyState | None = None,
    fair: str | None = None,
) -> int:
    """Park ``payload`` in ``ckey``'s line, then wake the key (its room may have come back while
    we parked). ``seen``: the key as the refused claim read it (saves a read). ``fair``: the fair
    lane the message came from (``sluice.features.fair``): its waker, not this one, sends the tenant's
    waiters. Returns the ticket. The caller deletes the message."""
    message = payload.message
    attributes = waiter_attributes(message)
    for _ in range(PARK_ATTEMPTS):
        state = seen if seen is not None else store.key_state(ckey)
        seen = None
        waiter = KeyWaiter(
            ckey=ckey,
            ticket=state.tickets,
            message_id=origin_id(message.message_id, message.attributes),
            key=payload.key,
            body=message.body,
            group_id=message.group_id,
            attributes=attributes,
            parked_at=now,
        )
        if _park(store, waiter, replaces=ticket_of(message), fair=fair):
            break
    else:
        raise TransientError(f"parking on key {ckey!r}: the line kept moving", operation="TransactWriteItems")
    if fair is not None:
        return waiter.ticket
    try:
        wake(store=store, queue=queue, ckey=ckey, now=now)
    except TransientError as exc:
        # Parked: the message is done and is deleted all the same. Handed back to the queue, it
        # would be received and parked again, spending receives while it waits. A wake-up lost
        # here is a wake-up lost to a crash: the key's next release or reconciliation's sweep.
        log.warning(
            "key's wake-up after a park failed; the next release or the sweep wakes it",
            extra={"correlation_id": payload.key, "concurrency_key": ckey, "error": str(exc)},
        )
    return waiter.ticket


def _park(store: KeyStore, waiter: KeyWaiter, *, replaces: str | None, fair: str | None) -> bool:
    """Park ``waiter`` as its ticket; False when another parker took that ticket first."""
    try:
        return store.park_for_key(waiter, tickets=waiter.ticket, replaces=replaces, fair=fair)
    except TransientError:
        # The answer was lost (a read timeout): the park may have landed. Parked, the message is
        # done and is deleted: handed back, it would be received while it waits. One consistent
        # read of the line's item for the ticket says: the park took that ticket, or another
        # parker did (the payload's own index, ``key_wait_of``, may name a later park of another
        # message of the payload: explorer seed 1206101088). Its message id and payload key both:
        # a producer may give two payloads' messages one origin. Unsure (the read fails too, the
        # write lands after it, or a wake sent the waiter already), the error stands and the
        # message returns to the queue, as after a crash between the park and the delete:
        # received, it parks again and its second place is a duplicate.
        placed = store.key_waiters(waiter.ckey, [waiter.ticket])
        if [(w.message_id, w.key) for w in placed] != [(waiter.message_id, waiter.key)]:
            raise
        return True


def wake(
    *,
    store: KeyStore,
    queue: Queue,
    ckey: str,
    now: float,
    tidy: bool = False,
    at_most: int = WAKE_BATCH,
    by_lane: str | None = None,
    fair_lanes: Collection[str] | None = None,
    seen: KeyState | None = None,
) -> int:
    """Send as many of ``ckey``'s waiters back to the queue as it has room for, oldest first.
    ``tidy`` (the sweep): take a key whose line is empty off the sweep's list. A fair lane's
    tenant is woken only by its lane's waker (``by_lane``, ``sluice.features.fair``), which shares the
    lane's room among its tenants; ``fair_lanes``: the lanes the stack has fair (None: any).
    ``seen``: the key as just read consistently (saves the first read)."""
    sent = 0
    for _ in range(3):  # another waker moved the line meanwhile: read it again
        state = seen if seen is not None else store.key_state(ckey)
        seen = None
        # A fair lane's waker wakes its tenants with no default cap (its lane's MAX holds them).
        default = FAIR_UNCAPPED if by_lane is not None and state.fair == by_lane else store.key_concurrency
        count = min(state.room(default, now), state.waiting, WAKE_BATCH, at_most)
        if (
            state.fair is not None
            and state.fair != by_lane
            and (fair_lanes is None or state.fair in fair_lanes)
        ):
            count = 0  # a fair lane's tenant: its lane's waker decides
        count = gate_room(store, ckey, now, count, state.kept(now))
        stale = state.stale(now)
        if count <= 0 and not stale:
            if tidy and state.waiting == 0 and not state.inflight:
                store.forget_key(ckey)
            return sent
        tickets = range(state.woken, state.woken + max(0, count))
        own_group = state.fair is not None and state.fair == by_lane
        for waiter in store.key_waiters(ckey, tickets):
            queue.requeue(as_parked(waiter, entry(waiter.ticket, now), own_group=own_group))
            sent += 1
            log.info(
                "key waiter woken",
                extra={
                    "correlation_id": waiter.key,
                    "message_id": waiter.message_id,
                    "concurrency_key": ckey,
                },
            )
        if store.advance_key(ckey, woken=state.woken, to=state.woken + max(0, count), now=now, drop=stale):
            return sent
    return sent


def gate_room(store: KeyStore, ckey: str, now: float, wanted: int, kept: int) -> int:
    """Waiters the gate has room for: no more are sent than can take a grant on arrival (each
    takes its own before its claim), less those sent already whose claim has not landed
    (``kept``); no limit, ``wanted``. One sent all the same (two wakes at once) finds no grant and
    waits again, at the back: the grant, not the wake, is what is exact."""
    if wanted <= 0:
        return wanted
    room = store.key_gate.key_room(ckey, now)
    return wanted if room is None else min(wanted, max(0, room - kept))


class Launching(Protocol):
    """What ``HeldKeys`` takes from a launch (``sluice.launch.context.LaunchContext``)."""

    @property
    def gate(self) -> Gate: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def store(self) -> KeyStore: ...
    @property
    def queue(self) -> Queue: ...


class HeldKeys:
    """The gate's grants before one launch's keyed claims, and the keys it held: a lingering
    tick wakes each once its room is due (``wake_held``), besides the key's next release and the
    next tick's sweep."""

    def __init__(self, ctx: Launching) -> None:
        self.ctx = ctx
        self.held: dict[str, float] = {}  # keys the gate held, with when their room is due

    def take(self, ckey: str) -> Grant | None:
        """A grant for ``ckey``'s claim; None where no limit is in force for it. None to take:
        the key is noted as held."""
        now = self.ctx.clock.now()
        try:
            grant = self.ctx.gate.before_claim(ckey, now)
        except TransientError:
            grant = Grant(0, scopes=(ckey,))  # unsure of the room: it waits in the line, as if none
        if not grant.gated:
            return None
        if grant.n == 0:
            self.held[ckey] = grant.due if grant.due is not None else now + 1.0
        return grant

    def give_back(self, grant: Grant | None) -> None:
        if grant is not None and grant.n > 0:
            with contextlib.suppress(TransientError):  # kept spent: one start fewer, never one more
                self.ctx.gate.give_back(grant, grant.n)

    def wake_held(self) -> None:
        """Wake each held key once its room is due: a lingering tick receives its waiters then.
        A wake AWS refuses is left to the sweep."""
        now = self.ctx.clock.now()
        for ckey, due in sorted(self.held.items()):
            if due > now:
                continue
            del self.held[ckey]
            with contextlib.suppress(TransientError):
                sent = wake(store=self.ctx.store, queue=self.ctx.queue, ckey=ckey, now=now)
                # Some sent: looked at again next round, once they took their grants. None sent:
                # held again until the gate next has room (none due: room, or no limit).
                again = now if sent else self.ctx.gate.key_due(ckey, now)
                if again is not None:
                    self.held[ckey] = again

    def held_due(self) -> float | None:
        """When the first held key has room again (None: none held)."""
        return min(self.held.values(), default=None)


def forgo(*, store: KeyStore, ckey: str, ticket: str) -> None:
    """A woken waiter that will not claim (a duplicate, already run) gives its kept slot back."""
    store.drop_inflight(ckey, [ticket])


def as_parked(waiter: KeyWaiter, sent: str, *, own_group: bool = False) -> ParkedMessage:
    """The waiter as the queue re-sends it: its ticket rides along, and the holder it is named by
    (which the deduplication id derives from) is its in-flight entry: its place in the line and
    this send's time. ``own_group`` (a fair lane's tenant): in a message group of its own
    (``woken_group``), not its tenant's, where SQS would keep it behind every message of the tenant
    not lined up yet, and behind any other waiter of the tenant in flight."""
    return ParkedMessage(
        message_id=waiter.message_id,
        key=waiter.key,
        holder=f"sluice-key:{waiter.ckey}#{sent}",
        body=waiter.body,
        group_id=woken_group(waiter.message_id) if own_group else waiter.group_id,
        attributes={**waiter.attributes, TICKET_ATTRIBUTE: sent},
        parked_at=waiter.parked_at,
    )


def woken_group(message_id: str) -> str:
    """A fair lane's woken waiter's message group: its own, named by its origin message id (the same
    at every wake: parked again, it keeps it)."""
    return "sluice-woken-" + hashlib.sha256(message_id.encode()).hexdigest()[:32]


def sweep(
    *,
    store: KeyStore,
    queue: Queue,
    now: float,
    ckeys: frozenset[str] | None = None,
    fair_lanes: Collection[str] = (),
) -> int:
    """Wake every key with waiters and room (a wake-up lost to a crash). Returns how many were sent.
    ``ckeys``: the KEYS_WAITING index as already read. The tenants of ``fair_lanes`` are left to
    their lanes' wakers; a tenant of a lane no longer fair is woken as any key."""
    ckeys = store.keys_waiting() if ckeys is None else ckeys
    return sum(
        wake(store=store, queue=queue, ckey=ckey, now=now, tidy=True, fair_lanes=fair_lanes)
        for ckey in sorted(ckeys)
    )
