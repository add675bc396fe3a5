"""The reference model of the reliability suite: what Sluice did, seen through its AWS calls.

``Model`` is the observer of every ``Injector`` (tests/support/faults.py): each successful call of
every container is reported to it, and it checks the promises at the moment they could break,
so the invariants that run after every step stay cheap (they only read ``violations``):

* a claim (the admission) must find fewer slots taken than the MAX in force at that moment, where a
  slot is taken by every holder in the ledger and by every RUNNING execution (one that runs without
  a slot, a leak, still counts; one started or redriven behind Sluice's back counts once a
  reconciliation has listed it) (promise 1). MAX lowered, or an execution redriven, between a claim
  and its start does not take the slot back: the start is judged by its claim;
* a new StartExecution (a name Step Functions had not seen) must hold a claim and a slot, find no
  RUNNING execution of the same payload key (promise 2), and be the first execution of its message;
* a deleted message must have started an execution, been recorded as a duplicate of *another*
  message's live lease, been parked (a deferred duplicate stored in the table), or been sent to
  the DLQ with a reason (promise 3);
* a message recorded as a duplicate must not be suppressed behind an execution that had already
  ended in Step Functions when its claim was refused (promise 3: it would never run);
* a message sent to the DLQ must be one the test made unusable, and carry a reason; or a waiter
  (``sluice-awaits``) dead-lettered with an ``awaited …`` reason;
* awaits: a new StartExecution of a message that awaits keys must find every one of them with a
  SUCCEEDED end seen (the test ends executions, so it knows);
* run once: a claim of a ``sluice-once`` message must not commit after another run of its key
  was seen to end SUCCEEDED (unless DynamoDB's TTL deleted the key's record since: its success is
  forgotten, as docs/protocol.md says of a success not claimed by a once-message; one claimed by a
  once-message never is; nor while the success is a redriven run's that Sluice did not hold and
  has not written yet: its event or the next reconciliation writes it);
* effects: each effect's message (origin id ``fx-…`` of its execution and index) must be named by
  a SUCCEEDED output the test ended an execution with, and must not be sent again once that
  execution's release has committed (the release marks the effects sent); and no effect may have
  two SUCCEEDED runs (the exactly-once check above covers two starts);
* concurrency keys (issue 11): a claim of a message sent with ``sluice-concurrency-key`` must find
  fewer of that key's runs holding a slot (an adopted one too) or running without one than the key's
  cap in force (its own, as the test set it, else the default); a message parked in a key's line
  (``KWAIT#``) may be deleted, and the invocation that parked it must delete it, not return it to
  the queue (it would spend receives while it waits); a waiter sent back must have been parked.

* lanes (promise 7 of docs/protocol.md, ``sluice.features.lanes``): on a stack with lanes every claim names
  its lane on its ``EXEC#`` Put, and it must be the lane of the queue the message was sent to (a
  message parked in the table and sent back goes back to its lane's queue); it must find fewer of
  that lane's runs holding a slot (of the lane's pool or, with the lane on its record, the global
  one; an adopted run too) or running without one than the lane's limit in force: its configured
  MAX (for the lane ``default`` when the stack's lanes do not name it: the global MAX in force, which
  it follows), or the operator's setting as the test wrote it (a raise counts from its first write, a
  lowering once the caps carry it: once the command returns, or, when only the setting was
  written, once a tick has run). Promise 1 is checked on every claim as before.

RUNNING executions Sluice does not hold count against MAX too: executions the test started by hand
and executions an operator redrove are in ``running`` (and in ``outside`` until Sluice adopts them).
As docs/protocol.md says, Sluice learns of them at its next reconciliation: one counts against MAX
at a start once a reconciliation whose listing showed it, made after it went outside, has completed
(a stale listing that hid it does not count). Promise 2 likewise: a redriven execution is one of its
key's runs again once a reconciliation has seen it.
A parked message re-sent to the queue gets a new SQS message id but is the same message: ids are
mapped back to the original (``origin``) before anything is counted.

Payload keys are computed here from what the test sent, independently of ``sluice.core.validation``, and
messages are tied to executions through the claim transaction (``EXEC#<name>`` carries the message
id), not through Sluice's naming, so a broken naming scheme cannot hide itself.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.support.model_machines import Machines
from tests.support.steps import (
    AWAITS_ATTRIBUTE,
    CONCURRENCY_KEY_ATTRIBUTE,
    EFFECT_ORIGIN_PREFIX,
    ONCE_ATTRIBUTE,
    ORIGIN_ATTRIBUTE,
    REASON_ATTRIBUTE,
    Call,
    lane_slot_names,
    slot_names,
)

AWAIT_REASON = "awaited "  # the start of every reason a waiter is dead-lettered with
SQS_DEDUPLICATION_SECONDS = 300  # the FIFO queue's deduplication interval


def effect_origin(name: str, index: int) -> str:
    """The origin id of effect ``index`` of execution ``name``, as docs/protocol.md ("Effects")
    documents it: ``fx-`` and the first 40 hex digits of SHA-256(name NUL index)."""
    return EFFECT_ORIGIN_PREFIX + hashlib.sha256(f"{name}\x00{index}".encode()).hexdigest()[:40]


def awaited_keys(sent: Sent | None) -> list[str]:
    """The keys a sent message awaits (its ``sluice-awaits`` attribute)."""
    raw = sent.attributes.get(AWAITS_ATTRIBUTE) if sent is not None else None
    try:
        keys = json.loads(raw) if raw else []
    except (ValueError, RecursionError):
        return []  # a forged value: its message is dead-lettered as invalid, it awaits nothing
    return [str(k) for k in keys] if isinstance(keys, list) else []


def canonical_key(body: str, attributes: dict[str, str] | None = None) -> str:
    """The payload key a correct launcher must use: the ``sluice-key`` attribute, else ``id``, else
    the SHA-256 of the canonical JSON (sorted keys, no spaces, UTF-8)."""
    if attributes and attributes.get("sluice-key"):
        return attributes["sluice-key"]
    obj = json.loads(body)
    if isinstance(obj.get("id"), str) and obj["id"]:
        return obj["id"]
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass
class Sent:
    message_id: str
    body: str
    group: str
    dedup: str
    key: str | None  # the payload key; None for a message the test made unusable
    attributes: dict[str, str] = field(default_factory=dict)
    lane: str | None = None  # the lane whose queue it was sent to (None: the stack has no lanes)

    @property
    def valid(self) -> bool:
        return self.key is not None

    @property
    def once(self) -> bool:
        return self.attributes.get(ONCE_ATTRIBUTE) == "true"

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 60 else f"{self.body[:40]}...({len(self.body):,} chars)"
        return f"Sent({self.message_id[:8]}, group={self.group!r}, key={self.key!r:.40}, body={body!r})"


@dataclass(frozen=True)
class Start:
    name: str
    key: str | None
    message_id: str | None
    running_before: int
    max_in_force: int


class Model:
    """Everything the suite knows about one run, kept from the hooks. Thread safe."""

    # A duplicate suppressed behind a holder that had already ended is a lost re-submission.
    check_ended_holders = True

    def __init__(
        self,
        *,
        dlq_url: str,
        clock: Any,
        max_concurrency: int,
        visibility_timeout: int,
        key_concurrency: int = 1,
        lanes: Mapping[str, int | None] | None = None,
        lane_queues: Mapping[str, str] | None = None,
        fair_lanes: frozenset[str] = frozenset(),
    ) -> None:
        self.lock = threading.RLock()
        self.dlq_url = dlq_url
        self.clock = clock
        self.max = max_concurrency
        self.visibility_timeout = visibility_timeout
        self.violations: list[str] = []

        self.sent: dict[str, Sent] = {}
        self.holders: set[str] = set()  # names holding a slot, from claim and release transactions
        self.claims: dict[str, str] = {}  # execution name -> message id of its claim
        self.claimed_under: dict[str, int] = {}  # execution name -> MAX in force at its claim
        self.taken_at_claim: dict[str, int] = {}  # execution name -> slots taken by others at its claim
        self.started: dict[str, str | None] = {}  # execution name -> message id, every start Sluice made
        self.started_by_message: dict[str, set[str]] = {}
        self.started_on: dict[str, str] = {}  # execution name -> the state machine it was started on
        self.running: dict[str, str | None] = {}  # RUNNING in Step Functions: name -> payload key
        self.starts: list[Start] = []
        self.receipts: dict[str, str] = {}  # receipt handle -> message id
        self.in_flight: dict[str, tuple[str, float]] = {}  # message id -> (receipt, visible again at)
        self.deleted: set[str] = set()
        self.duplicates: set[str] = set()
        self.dead_lettered: dict[str, str] = {}  # message id -> reason
        # message id -> (holder named by its refused claim, whether that holder had ended by then)
        self.refused_by: dict[str, tuple[str, bool]] = {}
        # A duplicate is one of a run that ended after the message was sent (docs/protocol.md,
        # "Staleness": a re-submission sent after its key's run ended must run): the order of each
        # message's send (else its first refused claim) and of each execution's latest end.
        self.sent_order: dict[str, int] = {}
        self.first_refused: dict[str, int] = {}
        self.ended_order: dict[str, int] = {}
        self.order = 0
        self.finished: set[str] = set()  # ended in Step Functions, and not running again
        self.outside: set[str] = set()  # RUNNING, not held by Sluice: started by hand, or redriven
        self.parked: set[str] = set()  # message ids parked in the table (deferred duplicates)
        self.origin: dict[str, str] = {}  # message id of a re-sent parked message -> the original
        # (origin id, key) -> a producer's message of that key carrying another key's message id as
        # its ``sluice-origin-message-id``: another message, with a name of its own.
        self.forged: dict[tuple[str, str], str] = {}
        self.adopted: set[str] = set()
        self.outside_since: dict[str, int] = {}  # outside name -> the event count when it went outside
        self.listing: dict[str, tuple[int, set[str]]] = {}  # container -> (event count, names listed)
        self.known_outside: set[str] = set()  # outside names the last completed reconciliation listed
        # A start is judged by its start mark (``Store.mark_starting``, the commit point a block
        # must precede): the outside runs known when it was written. name -> known_outside then.
        self.known_at_mark: dict[str, set[str]] = {}
        # An unstarted claim a reconciliation blocked for a redriven run of its key (``Store.block``):
        # no StartExecution follows a block (docs/protocol.md), so that run is known to its start.
        self.blocked_for: dict[str, str] = {}  # claimed name -> the run it was blocked for
        self.events = 0
        self.max_receive_count = 0
        # Awaits, run-once keys and effects (issue 13).
        self.ever_succeeded: set[str] = set()  # keys with a SUCCEEDED end seen, ever
        self.succeeded_runs: dict[str, set[str]] = {}  # key -> SUCCEEDED runs its record remembers
        self.ended_keys: set[str] = set()  # keys with an end seen that their record remembers
        self.already_done: set[str] = set()  # once-messages acknowledged as already done
        self.effects: dict[str, tuple[str, int]] = {}  # effect origin id -> (execution, index)
        self.effect_sends: dict[str, int] = {}  # effect origin id -> sends seen
        self.effect_taken_at: dict[str, float] = {}  # deduplication id -> when SQS last took a copy
        self.effects_marked: set[str] = set()  # executions named with effects whose release committed
        self.unheard_success: set[str] = set()  # redriven runs that SUCCEEDED unheld, not yet written
        self.effect_succeeded: dict[str, str] = {}  # effect origin id -> its SUCCEEDED run
        # Concurrency keys (issue 11).
        self.key_concurrency = key_concurrency  # the default cap
        self.key_caps: dict[str, int] = {}  # concurrency key -> its own cap (the test set it)
        self.claim_seq: dict[str, int] = {}  # execution name -> the order of its claim
        self.claimed_key_cap: dict[str, int] = {}  # execution name -> its key's cap in force at its claim
        self.adopted_at: dict[str, int] = {}  # redriven execution -> the claim order when it was adopted
        self.seq = 0
        self.key_parked: set[str] = set()  # message ids waiting in a key's line (parked, not woken since)
        self.key_parks = 0
        self.key_wakes = 0
        self.received_by: dict[str, str] = {}  # physical message id -> the container that received it
        # physical message id -> (container, message id): a copy whose message that container parked
        # in a key's line; it must be deleted, not returned, so that it spends no receives while it waits
        self.key_parked_copies: dict[str, tuple[str, str]] = {}
        # (container, "KWAIT#<key>#<ticket>") -> the message it parked there (``_place_unknown``)
        self.key_park_places: dict[tuple[str, str], str] = {}
        # physical message id -> every copy of its message that container held when it parked it: a
        # copy returned to the queue breaks nothing while another of them may be the one parked
        self.park_siblings: dict[str, set[str]] = {}
        self.queue_of: dict[str, str] = {}  # physical message id -> the queue it was received from
        # Lanes (sluice.features.lanes; empty: the stack has none).
        self.lanes = dict(lanes or {})  # lane -> its configured MAX (None: the global MAX, as implied)
        self.fair_lanes = fair_lanes  # lanes serving their tenants round-robin (sluice.features.fair)
        self.lane_queues = {url: lane for lane, url in (lane_queues or {}).items()}  # queue URL -> lane
        self.lane_limits = dict(self.lanes)  # lane -> its limit in force, as the test set it (None: MAX)
        self.lane_lowered: dict[str, int | None] = {}  # lowered in LANE# only: binding once a tick ran
        self.lane_of: dict[str, str] = {}  # execution name -> its lane (its claim's EXEC# Put)
        self.lane_holders: dict[str, str] = {}  # execution name -> the lane whose slot it holds
        # State machines: each claim's, and those switched from and deleted (tests.support.model_machines).
        self.machines = Machines()
        # Messages dead-lettered as ``Machines.excused`` accepts it, and their keys.
        self.vanished_messages: set[str] = set()
        self.vanished_keys: set[str] = set()

    # -- the test's own actions ------------------------------------------------------------------

    def sent_message(self, sent: Sent) -> None:
        with self.lock:
            self.sent[sent.message_id] = sent
            self.order += 1
            self.sent_order[sent.message_id] = self.order
            origin = self.sent.get(sent.attributes.get(ORIGIN_ATTRIBUTE, ""))
            if origin is not None and sent.key is not None and origin.key != sent.key:
                # The same forgery sent again is a copy of the first: one name, one message.
                first = self.forged.setdefault((origin.message_id, sent.key), sent.message_id)
                if first != sent.message_id:
                    self.origin[sent.message_id] = first
            elif origin is not None and sent.key is not None:
                # A producer's copy of an earlier message of the same key: the same name, one message.
                self.origin[sent.message_id] = self.logical(origin.message_id)

    def machine_switched(self, state_machine_arn: str) -> None:
        with self.lock:
            self.machines.switched(state_machine_arn)

    def machine_deleted(self, state_machine_arn: str) -> None:
        with self.lock:
            self.machines.deleted_machine(state_machine_arn)

    def ended(self, name: str, status: str | None = None) -> None:
        with self.lock:
            key = self.running.pop(name, None)
            self.finished.add(name)
            self.order += 1
            self.ended_order[name] = self.order
            was_outside = name in self.outside
            self.outside.discard(name)
            if key is None or status is None:
                return
            self.ended_keys.add(key)
            if status != "SUCCEEDED":
                return
            if was_outside and name in self.claims:
                # Redriven behind Sluice's back and not adopted: Sluice learns of this success from
                # its event or the next reconciliation's listing of redriven runs, not before.
                self.unheard_success.add(name)
            self.ever_succeeded.add(key)
            self.succeeded_runs.setdefault(key, set()).add(name)
            origin = self.claims.get(name)
            if origin in self.effects:
                first = self.effect_succeeded.setdefault(origin, name)
                if first != name:
                    execution, index = self.effects[origin]
                    self.violations.append(
                        f"effects once: effect {index} of {execution} ({origin}) has two SUCCEEDED runs: "
                        f"{first} and {name}"
                    )

    def effects_never_sent(self) -> list[str]:
        """At rest: effects a SUCCEEDED output of one of Sluice's runs named that were never sent nor
        dead-lettered (nothing lost), but those of a run whose state machine was deleted before
        Sluice saw it end (its output cannot be read: docs/operations.md, "Switch the state machine"),
        and those of a run of a machine switched from, redriven after its release, whose success
        Sluice never heard (documented there too)."""
        with self.lock:
            dead = " ".join(self.dead_lettered.values())
            return sorted(
                f"effect {index} of {name}"
                for origin, (name, index) in self.effects.items()
                if not self.effect_sends.get(origin)
                and f"effect {index}" not in dead
                and name in self.claims  # (one started by hand is not Sluice's to follow up)
                and self.machines.vanished(name) is None
                and not (name in self.unheard_success and self._switched_from(name))
            )

    def _switched_from(self, name: str) -> bool:
        """``name`` runs on a state machine the stack switched from: its events are not heard, and
        reconciliation lists the redriven runs of the machines in use only (docs/protocol.md)."""
        machine = self.machines.claimed_on.get(name)
        return self.machines.current is not None and machine not in (None, self.machines.current)

    def expect_effects(self, name: str, count: int) -> None:
        """Execution ``name`` ended SUCCEEDED with an output naming ``count`` effects."""
        with self.lock:
            for index in range(count):
                self.effects[effect_origin(name, index)] = (name, index)

    def key_cap(self, ckey: str, *, uncapped: bool = False) -> int:
        """The cap in force for concurrency key ``ckey``: its own, else the default (none for a
        fair lane's tenant: its lane's MAX holds it). docs/protocol.md, Fair lanes, "Caps": a
        tenant's own cap (``sluice set-max N --key``) still holds it, while ``keyConcurrency`` does
        not apply to a claim from a fair lane (its condition takes ``FAIR_UNCAPPED``); the lane's
        MAX and the global MAX, checked at every claim as in any lane, are what hold its tenants."""
        return self.key_caps.get(ckey, 10_000 if uncapped else self.key_concurrency)

    def set_key_cap(self, ckey: str, cap: int | None) -> None:
        with self.lock:
            if cap is None:
                self.key_caps.pop(ckey, None)
            else:
                self.key_caps[ckey] = cap

    def lane_limit(self, lane: str) -> int:
        """The limit in force in ``lane``: the operator's, as the test set it, else its configured MAX;
        an implied lane ``default`` without the operator's MAX follows the global MAX in force (each
        tick puts the MAX it reads in its caps; until then the global pool binds it)."""
        limit = self.lane_limits[lane]
        in_force = self.max if limit is None else limit
        if lane in self.lane_lowered:  # written, not yet put in force: a tick that read it may obey it
            pending = self.lane_lowered[lane]
            in_force = max(in_force, self.max if pending is None else pending)
        return in_force

    def set_lane_limit(self, lane: str, limit: int | None, *, caps_moved: bool = True) -> None:
        """The test set ``lane``'s limit (None: the global MAX, for the implied lane ``default`` put
        back to its configured MAX). ``caps_moved``: the caps carry it (the operator's command
        returned): it binds now. Otherwise only the setting was written: a raise binds now (it is
        allowed from its first write), a lowering once a tick has put it in force (``tick_returned``).
        A lane that follows the global MAX given a MAX of its own is lowered whatever the two are
        now: a tick that read the setting before it puts the global MAX it reads in the lane's
        caps, and the operator may raise that MAX meanwhile (explorer seed 1206001197: the lane set
        to 0 under a global MAX of 0, then MAX 1, and a tick from before the setting claimed in it)."""
        with self.lock:
            follows_max = self.lane_limits[lane] is None and limit is not None
            if caps_moved or (
                not follows_max and (self.max if limit is None else limit) >= self.lane_limit(lane)
            ):
                self.lane_limits[lane] = limit
                self.lane_lowered.pop(lane, None)
            else:
                self.lane_lowered[lane] = limit

    def tick_returned(self) -> None:
        """A scheduled tick returned: it read every lane's setting and put its limit in force first."""
        with self.lock:
            self.lane_limits.update(self.lane_lowered)
            self.lane_lowered.clear()

    def lane_runs(self, lane: str, *, but: str = "") -> list[str]:
        """The runs of ``lane`` that take room in it: holding a slot of its pool, or (by the lane of
        their claim) a global slot, or RUNNING without one; not runs redriven behind Sluice's back and
        not adopted yet (Sluice cannot know them)."""
        ours = {n for n in self.running if n not in self.outside}
        return sorted(
            n
            for n in (set(self.lane_holders) | self.holders | ours) - {but}
            if self.lane_holders.get(n, self.lane_of.get(n)) == lane
        )

    def ckey_of_message(self, message_id: str | None) -> str | None:
        """The concurrency key the test sent message ``message_id`` with, if any; in a fair lane,
        its tenant (its key, else ``lane:<name>``). docs/protocol.md, Fair lanes: an unkeyed
        message of a fair lane lines up as ``lane:<name>`` and carries that key from then on, so its
        claim takes a slot of that key (``CKEY#lane:<name>``) and its runs count as that key's."""
        sent = self.sent.get(message_id or "")
        if sent is None:
            return None
        ckey = sent.attributes.get(CONCURRENCY_KEY_ATTRIBUTE)
        if ckey is None and sent.lane in self.fair_lanes:
            return f"lane:{sent.lane}"
        return ckey

    def uncapped(self, message_id: str | None) -> bool:
        """A fair lane's tenant: no default cap, only its own (``sluice.features.fair``). Judged by the lane the
        message was sent to, not by the key's ``fair`` mark: per docs/protocol.md a claim of the same
        key from an ordinary lane has the default cap, whatever its runs in the fair lane (which
        count against it), and the mark only says whose waker wakes the tenant."""
        sent = self.sent.get(message_id or "")
        return sent is not None and sent.lane in self.fair_lanes

    def ckey_of(self, name: str) -> str | None:
        """The concurrency key of execution ``name``'s payload (tied to its message by the claim)."""
        return self.ckey_of_message(self.claims.get(name))

    def invocation_ended(self, container: str, outcome: str) -> None:
        """An invocation of ``container`` returned (``ok``), failed on an AWS error or died. One that
        returned must have deleted every message it parked in a key's line: one left in the queue
        comes back and spends receives while its payload waits (a crash leaves it, by design)."""
        with self.lock:
            mine = [p for p, (c, _) in self.key_parked_copies.items() if c == container]
            for physical in mine:
                _, message_id = self.key_parked_copies.pop(physical)
                if outcome == "ok" and message_id in self.key_parked:
                    self.violations.append(
                        f"key line (no receive while parked): message {message_id} was parked in its key's "
                        f"line by {container}, which returned without deleting it"
                    )

    def forget_key(self, key: str) -> None:
        """DynamoDB's TTL deleted the key's record: its ends are forgotten, but a success of a run
        a run-once message claimed, which the record keeps for good (docs/protocol.md)."""
        with self.lock:
            kept = {n for n in self.succeeded_runs.pop(key, set()) if self._claimed_once(n)}
            if kept:
                self.succeeded_runs[key] = kept
            self.ended_keys.discard(key)

    def _claimed_once(self, name: str) -> bool:
        sent = self.sent.get(self.claims.get(name) or "")
        return sent is not None and sent.once

    def running_again(self, name: str) -> None:
        """An ended execution RUNNING again (an operator's redrive): it counts against MAX and its key.
        Outside Sluice until adopted, unless its slot was never given back (its end's event lost, and
        no reconciliation released it before the redrive; or an adopted run's end left to
        reconciliation): then Sluice holds it still, by its claim or by its adoption."""
        with self.lock:
            message_id = self.claims.get(name)
            sent = self.sent.get(message_id or "")
            self.running[name] = sent.key if sent else None
            self.finished.discard(name)
            if name not in self.holders:
                self.adopted_at.pop(name, None)
                self._went_outside(name)
            # Still held by an adoption (its end left to reconciliation): the same adoption goes on
            # (explorer seed 472216048: taken for a claim, it blamed a claim made before it).

    def started_outside(self, name: str, key: str | None = None) -> None:
        """An execution Sluice did not start (ListExecutions shows it; MAX counts it)."""
        with self.lock:
            self.running[name] = key
            self._went_outside(name)

    def _went_outside(self, name: str) -> None:
        self.events += 1
        self.outside.add(name)
        self.outside_since[name] = self.events
        self.known_outside.discard(name)

    def logical(self, message_id: str) -> str:
        """The message a (re-sent) message id stands for."""
        return self.origin.get(message_id, message_id)

    def logical_for(self, message_id: str, key: str | None) -> str:
        """The message an item's message id (an origin) and key stand for: the producer's own where
        it forged that origin for another key."""
        return self.forged.get((message_id, key or ""), self.logical(message_id))

    def _logical_of(self, item: dict[str, Any]) -> str:
        return self.logical_for(item["message_id"]["S"], item.get("key", {}).get("S"))

    def _logical_recorded(self, call: Call) -> str:
        """The message a count on ``PAYLOAD#<key>`` names (``:mid``, its origin id)."""
        key = call.params["Key"]["pk"]["S"].removeprefix("PAYLOAD#")
        return self.logical_for(call.params["ExpressionAttributeValues"][":mid"]["S"], key)

    def _logical_sent(self, params: dict[str, Any], message_id: str) -> str:
        """``message_id`` (an origin) of a message Sluice sends, as its body and attributes key it."""
        attributes = {k: v.get("StringValue", "") for k, v in params.get("MessageAttributes", {}).items()}
        try:
            key = canonical_key(params.get("MessageBody", ""), attributes)
        except (ValueError, AttributeError, RecursionError):
            key = None
        return self.logical_for(message_id, key)

    def made_visible(self, message_id: str) -> None:
        with self.lock:
            self.in_flight.pop(message_id, None)

    def due(self) -> dict[str, str]:
        """Messages whose visibility timeout has run out by the clock: message id -> receipt."""
        now = self.clock.now()
        with self.lock:
            return {m: r for m, (r, at) in self.in_flight.items() if at <= now}

    def violate(self, text: str) -> None:
        with self.lock:
            self.violations.append(text)

    # -- what Sluice did ---------------------------------------------------------------------------

    def saw(self, call: Call, status: int, parsed: dict[str, Any]) -> None:
        with self.lock:
            if status >= 300:
                if call.step in ("claim", "hand_over"):
                    self._refused_claim(call, parsed)
                elif call.step == "delete":
                    self._delete_failed(call)
                else:
                    self._place_unknown(call)
                return
            handler = getattr(self, f"_on_{call.step}", None)
            if handler is not None:
                handler(call, parsed)

    def answer_lost(self, call: Call) -> None:
        """AWS carried ``call`` out and its caller got no answer (a read timeout)."""
        with self.lock:
            self._place_unknown(call)

    def _place_unknown(self, call: Call) -> None:
        """A parker's read of its place in a key's line (the line's item for its ticket,
        ``KWAIT#<key>#<ticket>``, read after its park's answer was lost) failed: it cannot know that
        it parked, so it returns the message, as after a crash between the park and the delete
        (docs/protocol.md). That return is no breach. (A wake's read of one waiter it parked itself
        excuses its copies too: that parker deletes them all the same.)"""
        if call.operation != "BatchGetItem":
            return
        keys = [k for t in call.params.get("RequestItems", {}).values() for k in t.get("Keys", [])]
        if len(keys) != 1 or not keys[0].get("pk", {}).get("S", "").startswith("KWAIT#"):
            return
        message_id = self.key_park_places.get((call.container, keys[0]["pk"]["S"]))
        for physical, (container, parked) in list(self.key_parked_copies.items()):
            if container == call.container and parked == message_id:
                del self.key_parked_copies[physical]

    def _on_receive(self, call: Call, parsed: dict[str, Any]) -> None:
        visible_at = self.clock.now() + self.visibility_timeout
        for message in parsed.get("Messages", []):
            self.receipts[message["ReceiptHandle"]] = message["MessageId"]
            self.in_flight[message["MessageId"]] = (message["ReceiptHandle"], visible_at)
            self.received_by[message["MessageId"]] = call.container
            # Received again: the copy a parker held came back (it died before its delete: docs/
            # protocol.md, "Waiting without the queue"), and whoever holds it now may return it (explorer
            # seed 1208200707: a completion throttled with it in hand, after the parker's Lambda timeout).
            self.key_parked_copies.pop(message["MessageId"], None)
            self.park_siblings.pop(message["MessageId"], None)
            self.queue_of[message["MessageId"]] = call.params.get("QueueUrl", "")
            count = int(message.get("Attributes", {}).get("ApproximateReceiveCount", "1"))
            self.max_receive_count = max(self.max_receive_count, count)

    @staticmethod
    def _claimed_item(call: Call) -> dict[str, Any]:
        """The ``EXEC#<name>`` item a claim puts."""
        puts = [i["Put"]["Item"] for i in call.params["TransactItems"] if "Put" in i]
        return next((p for p in puts if p.get("pk", {}).get("S", "").startswith("EXEC#")), puts[0])

    def _on_claim(self, call: Call, parsed: dict[str, Any]) -> None:
        item = self._claimed_item(call)
        name, message_id = item["name"]["S"], self._logical_of(item)
        taken = (self.holders | set(self._counted_running())) - {name}
        if len(taken) >= self.max:
            self.violations.append(
                f"promise 1 (MAX): {name} claimed a slot while {len(taken)} were taken under MAX {self.max}: "
                f"{sorted(taken)}"
            )
        sent = self.sent.get(message_id)
        if sent is not None and sent.once and sent.key is not None:
            # A success Sluice cannot know of yet (a redriven run's, unheld, not yet written) excused.
            others = sorted(self.succeeded_runs.get(sent.key, set()) - {name} - self.unheard_success)
            if others:
                self.violations.append(
                    f"run once: {name} claimed for run-once message {message_id} of key {sent.key!r}, "
                    f"which had SUCCEEDED already ({others[0]})"
                )
        ckey = self.ckey_of_message(message_id)
        if ckey is not None:
            self._key_claim(name, ckey, uncapped=self.uncapped(message_id))
        if self.lanes:
            self._lane_claim(call, name, message_id, item.get("lane", {}).get("S"))
        self.holders.add(name)
        if "starting_at" in item:  # the claim carries its start mark: a block after it is refused
            self.known_at_mark[name] = set(self.known_outside)
        # A block holds the claim it landed on: a claim of the same name after that one was rolled
        # back (a name is a function of its message) is a new claim (explorer seed 479302113).
        self.blocked_for.pop(name, None)
        self.claims[name] = message_id
        self.machines.claimed(name, item)
        self.claimed_under[name] = self.max
        self.taken_at_claim[name] = len(taken)
        self.seq += 1
        self.claim_seq[name] = self.seq
        if ckey is not None:
            self.claimed_key_cap[name] = self.key_cap(ckey, uncapped=self.uncapped(message_id))

    def _key_claim(self, name: str, ckey: str, *, uncapped: bool = False) -> None:
        """Promise 6 at the claim: the runs of its concurrency key that hold a slot (an adopted,
        redriven one too) or run without one must be fewer than the key's cap in force. Runs
        redriven behind Sluice's back and not adopted yet are not counted: Sluice cannot know them."""
        ours = {n for n in self.running if n not in self.outside}
        taken = sorted(n for n in (self.holders | ours) - {name} if self.ckey_of(n) == ckey)
        cap = self.key_cap(ckey, uncapped=uncapped)
        if len(taken) >= cap:
            self.violations.append(
                f"key cap: {name} claimed a slot of concurrency key {ckey!r} while {len(taken)} "
                f"of its runs held one under its cap {cap}: {taken}"
            )

    def _lane_claim(self, call: Call, name: str, message_id: str, lane: str | None) -> None:
        """Promise 7 at the claim: a claim on a stack with lanes names its lane, the lane of the
        queue its message was sent to, and finds fewer of that lane's runs taking room in it than
        the lane's limit in force (``lane_runs``). The claim's own lane slot is then recorded."""
        if lane is None or lane not in self.lanes:
            self.violations.append(
                f"lanes: {name} claimed for message {message_id} on a stack with lanes "
                f"{sorted(self.lanes)} in lane {lane!r}"
            )
            return
        sent = self.sent.get(message_id)
        if sent is not None and sent.lane is not None and sent.lane != lane:
            self.violations.append(
                f"lanes (messages keep their lane): {name} claimed in lane {lane!r} for message "
                f"{message_id}, sent to lane {sent.lane!r}"
            )
        taken = self.lane_runs(lane, but=name)
        limit = self.lane_limit(lane)
        if len(taken) >= limit:
            self.violations.append(
                f"promise 7 (lane MAX): {name} claimed a slot of lane {lane!r} while {len(taken)} of its "
                f"runs held one or ran, under its limit {limit}: {taken}"
            )
        self.lane_of[name] = lane
        self.lane_holders.update({n: took for took, n in lane_slot_names(call.params, "take")})

    def _refused_claim(self, call: Call, parsed: dict[str, Any]) -> None:
        reasons = parsed.get("CancellationReasons") or []
        entries = call.params["TransactItems"]
        lease = next(
            (
                i
                for i, e in enumerate(entries)
                if e.get("Update", {}).get("Key", {}).get("pk", {}).get("S", "").startswith("PAYLOAD#")
                and ":claimed" in e["Update"].get("ExpressionAttributeValues", {})  # the claim's lease
            ),
            1,
        )
        if len(reasons) <= lease or reasons[lease].get("Code") != "ConditionalCheckFailed":
            return
        holder = reasons[lease].get("Item", {}).get("holder", {}).get("S")
        if holder:
            message_id = self._logical_of(self._claimed_item(call))
            self.order += 1
            self.first_refused.setdefault(message_id, self.order)
            self.refused_by[message_id] = (holder, holder in self.finished)

    def _on_hand_over(self, call: Call, parsed: dict[str, Any]) -> None:
        """A completion's release handing its slot to the next payload's claim, in one write: the
        release, then the claim (promise 1 is judged with the slot already given back)."""
        self._on_release(call, parsed)
        self._on_claim(call, parsed)

    def _on_release(self, call: Call, parsed: dict[str, Any]) -> None:
        given = slot_names(call.params, "give")
        self.holders.difference_update(given)
        for _, name in lane_slot_names(call.params, "give"):
            self.lane_holders.pop(name, None)
        self._mark_effects(call)
        self.machines.released(call.params)

    def _mark_effects(self, call: Call) -> None:
        """A committed write of ``name``'s SUCCEEDED end (its release, or its success recorded after
        it), or of ``EFFECTS#<name>``: no effect of ``name`` is sent after it. A release on an
        earlier end, before a redrive, marks nothing: that run named no effects."""
        for entry in call.params.get("TransactItems", []):
            put = entry.get("Put", {}).get("Item", {}).get("pk", {}).get("S", "")
            if put.startswith("EFFECTS#"):
                self.effects_marked.add(put[len("EFFECTS#") :])
            update = entry.get("Update", {})
            pk = update.get("Key", {}).get("pk", {}).get("S", "")
            if pk.startswith("EXEC#") and update.get("ExpressionAttributeValues", {}).get(":state") == {
                "S": "SUCCEEDED"
            }:
                self.effects_marked.add(pk[len("EXEC#") :])
                self.unheard_success.discard(pk[len("EXEC#") :])

    def _on_later_success(self, call: Call, parsed: dict[str, Any]) -> None:
        """A redriven run's success written after its release: its effects marked, no slot freed."""
        self._mark_effects(call)

    def _on_wait(self, call: Call, parsed: dict[str, Any]) -> None:
        """A waiter parked (its WAIT# item and the awaits sets): its message may be deleted."""
        for entry in call.params["TransactItems"]:
            values = entry.get("Update", {}).get("ExpressionAttributeValues", {})
            if ":m" in values:  # the WAIT# item: its id in the sets may be its name
                self.parked.add(self.logical_for(values[":m"]["S"], values.get(":key", {}).get("S")))
            else:
                self.parked.update(self.logical(i) for i in values.get(":ids", {}).get("SS", []))

    def _on_wake(self, call: Call, parsed: dict[str, Any]) -> None:
        """A waiter sent back to the queue: a new SQS id for the same message."""
        self._on_unpark(call, parsed)

    def _deduplicated(self, dedup: str) -> bool:
        """SQS drops a FIFO message whose deduplication id it took in the last five minutes (whether
        or not that message was deleted since): such a send enqueues nothing. Each copy taken opens
        new five minutes; a dropped copy opens none."""
        taken = self.effect_taken_at.get(dedup)
        return taken is not None and self.clock.now() - taken < SQS_DEDUPLICATION_SECONDS

    def _on_already_done(self, call: Call, parsed: dict[str, Any]) -> None:
        self.already_done.add(self._logical_recorded(call))

    def _on_effect(self, call: Call, parsed: dict[str, Any]) -> None:
        """An effect's message sent: it must be named by a SUCCEEDED output, and its execution not
        released yet (the release marks the effects sent; nothing sends them after it)."""
        attributes = {
            k: v.get("StringValue", "") for k, v in call.params.get("MessageAttributes", {}).items()
        }
        origin = attributes.pop(ORIGIN_ATTRIBUTE)
        named = self.effects.get(origin)
        dedup = str(call.params.get("MessageDeduplicationId", ""))
        if named is not None and not dedup.endswith("-" + hashlib.sha256(named[0].encode()).hexdigest()[:32]):
            # An effect's message parked as a deferred duplicate and sent back behind another
            # holder (its deduplication id names that holder, not the execution that named it).
            self._on_unpark(call, parsed)
            return
        dropped = self._deduplicated(dedup)
        if named is None:
            self.violations.append(
                f"effects: message {origin} sent as an effect that no SUCCEEDED output named"
            )
        elif named[0] in self.effects_marked and not dropped:
            self.violations.append(
                f"effects once: effect {named[1]} of {named[0]} ({origin}) enqueued again after "
                f"{named[0]}'s release had committed (send {self.effect_sends.get(origin, 0) + 1})"
            )
        self.effect_sends[origin] = self.effect_sends.get(origin, 0) + 1
        if not dropped:
            self.effect_taken_at[dedup] = self.clock.now()
        if origin not in self.sent:
            self.order += 1
            self.sent_order[origin] = self.order  # sent now: an end ordered before this send is before it
            key = attributes.get("sluice-key") or canonical_key(call.params["MessageBody"], attributes)
            self.sent[origin] = Sent(
                origin,
                call.params["MessageBody"],
                call.params.get("MessageGroupId", ""),
                call.params.get("MessageDeduplicationId", ""),
                key,
                attributes,
                self.lane_queues.get(call.params.get("QueueUrl", "")),
            )
        if parsed.get("MessageId"):
            self.origin[parsed["MessageId"]] = origin

    def _on_adopt(self, call: Call, parsed: dict[str, Any]) -> None:
        """Reconciliation took a slot and the lease back for an execution RUNNING again."""
        key = None
        for entry in call.params["TransactItems"]:
            value = entry.get("Update", {}).get("ExpressionAttributeValues", {}).get(":key")
            if value is not None:
                key = value["S"]
        for lane, name in lane_slot_names(call.params, "take"):
            self.lane_holders[name] = lane
            self.lane_of[name] = lane
        for name in slot_names(call.params, "take"):
            self.holders.add(name)
            self.adopted.add(name)
            self.adopted_at[name] = self.seq
            self.outside.discard(name)
            if name in self.running and key is not None:
                self.running[name] = key

    def _on_park(self, call: Call, parsed: dict[str, Any]) -> None:
        for entry in call.params["TransactItems"]:
            item = entry.get("Put", {}).get("Item", {})
            if item.get("pk", {}).get("S", "").startswith("PARK#"):
                self.parked.add(self._logical_of(item))

    def _on_key_park(self, call: Call, parsed: dict[str, Any]) -> None:
        """A message parked in its key's line (``KWAIT#``): its message may be deleted, and must be."""
        for entry in call.params["TransactItems"]:
            item = entry.get("Put", {}).get("Item", {})
            if item.get("pk", {}).get("S", "").startswith("KWAIT#"):
                message_id = self._logical_of(item)
                self.key_park_places[(call.container, item["pk"]["S"])] = message_id
                self.parked.add(message_id)
                self.key_parked.add(message_id)
                self.key_parks += 1
                copies = {
                    physical
                    for physical in self.in_flight
                    if self.logical(physical) == message_id
                    and self.received_by.get(physical) == call.container
                }
                for physical in copies:
                    self.key_parked_copies[physical] = (call.container, message_id)
                    if len(copies) > 1:
                        self.park_siblings[physical] = copies

    def _on_key_wake(self, call: Call, parsed: dict[str, Any]) -> None:
        """A waiter of a key's line sent back to the queue: a new SQS id for the same message."""
        self._on_unpark(call, parsed)
        self.key_parked.discard(
            self._logical_sent(call.params, call.params["MessageAttributes"][ORIGIN_ATTRIBUTE]["StringValue"])
        )
        self.key_wakes += 1

    def _delete_failed(self, call: Call) -> None:
        """A DeleteMessageBatch AWS refused: its messages come back (a fault, not Sluice's doing)."""
        for entry in call.params.get("Entries", []):
            self.key_parked_copies.pop(self.receipts.get(entry.get("ReceiptHandle", ""), ""), None)

    def _on_unpark(self, call: Call, parsed: dict[str, Any]) -> None:
        """A parked message re-sent to the queue: a new SQS id for the same message."""
        origin = call.params["MessageAttributes"][ORIGIN_ATTRIBUTE]["StringValue"]
        origin = self._logical_sent(call.params, origin)
        if origin not in self.parked:
            self.violations.append(f"message {origin} was re-sent to the queue, but it was never parked")
        sent = self.sent.get(origin)
        to = self.lane_queues.get(call.params.get("QueueUrl", ""))
        if self.lanes and sent is not None and sent.lane is not None and to != sent.lane:
            self.violations.append(
                f"lanes (messages keep their lane): message {origin}, sent to lane {sent.lane!r}, was sent "
                f"back to {'lane ' + repr(to) if to else call.params.get('QueueUrl')}"
            )
        if parsed.get("MessageId"):
            self.origin[parsed["MessageId"]] = origin

    def _counted_running(self) -> list[str]:
        """RUNNING executions that count against MAX: Sluice's, and outside ones once listed."""
        return [n for n in self.running if n not in self.outside or n in self.known_outside]

    def _on_start(self, call: Call, parsed: dict[str, Any]) -> None:
        name, machine = call.params["name"], call.params.get("stateMachineArn", "")
        if name in self.started:
            first = self.started_on.get(name, machine)
            if first != machine:  # names are unique per state machine only: a second execution
                self.violations.append(
                    f"exactly once: {name} started on {machine.rsplit(':', 1)[-1]}, "
                    f"after its start on {first.rsplit(':', 1)[-1]}"
                )
            return  # same name, same input, still running: Step Functions returned the same ARN
        self.started_on[name] = machine
        if name not in self.known_at_mark and name in self.claims:
            # docs/protocol.md: every StartExecution is preceded by its claim's start mark (written
            # by the claim, or by a resume after its renewal), the commit point a block must precede.
            self.violations.append(f"promise 2 (one per key): {name} started without its start mark")
        known = self.known_at_mark.pop(name, self.known_outside)
        message_id = self.claims.get(name)
        sent = self.sent.get(message_id or "")
        key = sent.key if sent else None
        start = Start(
            name,
            key,
            message_id,
            self.taken_at_claim.get(name, len(self._counted_running())),
            self.claimed_under.get(name, self.max),
        )
        if message_id is None:
            self.violations.append(f"{name} started without a claim")
        if name not in self.holders:
            self.violations.append(f"{name} started without holding a slot")
        blocker = self.blocked_for.pop(name, None)
        known = known | {blocker} if blocker is not None else known
        twins = sorted(
            n
            for n, k in self.running.items()
            if key is not None and k == key and (n not in self.outside or n in known)
        )
        if twins:
            self.violations.append(
                f"promise 2 (one per key): {name} started for key {key!r} while {twins[0]} still runs"
                + (" (a reconciliation had blocked its claim for it)" if twins[0] == blocker else "")
            )
        missing = [k for k in awaited_keys(sent) if k not in self.ever_succeeded]
        if missing:
            self.violations.append(
                f"awaits: {name} started for message {message_id} (key {key!r}), which awaits {missing[0]!r}, "
                "a key with no SUCCEEDED end"
            )
        earlier = self.started_by_message.get(message_id or "", set())
        if message_id and earlier:
            self.violations.append(
                f"exactly once: message {message_id} started a second execution {name} (first: {sorted(earlier)[0]})"
            )
        self.started[name] = message_id
        if message_id:
            self.started_by_message.setdefault(message_id, set()).add(name)
        self.running[name] = key
        self.starts.append(start)

    def _on_block(self, call: Call, parsed: dict[str, Any]) -> None:
        name = call.params["Key"]["pk"]["S"].removeprefix("EXEC#")
        if name in self.known_at_mark:
            return  # after the start mark: the start was decided first, a redrive racing it
        self.blocked_for[name] = call.params["ExpressionAttributeValues"][":by"]["S"]

    def _on_start_mark(self, call: Call, parsed: dict[str, Any]) -> None:
        name = call.params["Key"]["pk"]["S"].removeprefix("EXEC#")
        self.known_at_mark[name] = set(self.known_outside)

    def _on_renew(self, call: Call, parsed: dict[str, Any]) -> None:
        if call.operation == "UpdateItem":  # a renewal lifts the start mark
            self.known_at_mark.pop(call.params["Key"]["pk"]["S"].removeprefix("EXEC#"), None)
            self.machines.renewed(call.params["Key"]["pk"]["S"].removeprefix("EXEC#"), call.params)

    def _on_list(self, call: Call, parsed: dict[str, Any]) -> None:
        """A page of RUNNING executions, as the reconciler saw it (after any stale rewriting)."""
        names = {e["name"] for e in parsed.get("executions", [])}
        if "nextToken" in call.params:
            self.listing.setdefault(call.container, (self.events, set()))[1].update(names)
        else:
            self.events += 1
            self.listing[call.container] = (self.events, names)

    def _on_save_reconciliation(self, call: Call, parsed: dict[str, Any]) -> None:
        """A reconciliation completed: what its listing showed of the executions outside Sluice is
        what admission now counts against MAX (the last one saved wins, as in the ledger)."""
        at, names = self.listing.pop(call.container, (0, set()))
        self.known_outside = {
            n for n in names if n in self.outside and self.outside_since.get(n, self.events + 1) < at
        }

    def _on_delete(self, call: Call, parsed: dict[str, Any]) -> None:
        handles = {e["Id"]: e["ReceiptHandle"] for e in call.params.get("Entries", [])}
        for ok in parsed.get("Successful", []):
            physical = self.receipts.get(handles.get(ok["Id"], ""))
            if physical is None:
                continue
            message_id = self.logical(physical)
            if not (
                message_id in self.started_by_message
                or message_id in self.dead_lettered
                or message_id in self.duplicates
                or message_id in self.parked
                or message_id in self.already_done
            ):
                self.violations.append(
                    f"promise 3 (nothing lost): message {message_id} was deleted, but it never started an "
                    "execution, was not recorded as a duplicate or as already done, not parked and not dead-lettered"
                )
            self.deleted.add(message_id)
            self.in_flight.pop(physical, None)
            self.key_parked_copies.pop(physical, None)
            for sibling in self.park_siblings.pop(physical, set()):
                self.key_parked_copies.pop(sibling, None)
                self.park_siblings.pop(sibling, None)
        for failed in parsed.get("Failed", []):
            self.key_parked_copies.pop(self.receipts.get(handles.get(failed["Id"], ""), ""), None)

    def _on_return(self, call: Call, parsed: dict[str, Any]) -> None:
        entries = {e["Id"]: e for e in call.params.get("Entries", [])}
        now = self.clock.now()
        for ok in parsed.get("Successful", []):
            entry = entries.get(ok["Id"], {})
            message_id = self.receipts.get(entry.get("ReceiptHandle", ""))
            if message_id is None:
                continue
            parked = self.key_parked_copies.pop(message_id, None)
            siblings = self.park_siblings.pop(message_id, set())
            # Two copies of one message in one batch (a parker died before its delete, and the woken
            # copy came back beside the original): the tick parks one and may return the other.
            another = any(s in self.key_parked_copies for s in siblings if s != message_id)
            if parked is not None and parked[1] in self.key_parked and not another:
                self.violations.append(
                    f"key line (no receive while parked): message {parked[1]} was returned to the queue by "
                    f"{parked[0]} after it parked it in its key's line: it spends receives while it waits"
                )
            delay = int(entry.get("VisibilityTimeout", 0))
            if delay <= 0:
                self.in_flight.pop(message_id, None)
            else:
                self.in_flight[message_id] = (entry["ReceiptHandle"], now + delay)

    def _on_duplicate(self, call: Call, parsed: dict[str, Any]) -> None:
        message_id = self._logical_recorded(call)
        holder, holder_had_ended = self.refused_by.get(message_id, (None, False))
        # Ended, and before the message was sent: the message came after its end.
        first = self.sent_order.get(message_id, self.first_refused.get(message_id, 0))
        holder_had_ended = holder_had_ended and self.ended_order.get(holder or "", first) < first
        holder_message = self.claims.get(holder or "")
        if holder_message is None:
            self.violations.append(
                f"message {message_id} recorded as a duplicate, but no live lease refused it"
            )
        elif holder_message == message_id:
            self.violations.append(
                f"promise 3 (nothing lost): message {message_id} was suppressed as a duplicate of its own "
                f"earlier claim {holder}: a redelivered message must resume, never be dropped"
            )
        elif holder_had_ended and self.check_ended_holders:
            self.violations.append(
                f"promise 3: a re-submission was suppressed as a duplicate of an execution that had already "
                f"ended: message {message_id} behind {holder}, which had ended before it was sent"
            )
            self.duplicates.add(message_id)  # reported once, here, not again at its delete
        else:
            self.duplicates.add(message_id)

    def _on_dead_letter(self, call: Call, parsed: dict[str, Any]) -> None:
        if call.params.get("QueueUrl") != self.dlq_url:
            return
        attributes = call.params.get("MessageAttributes", {})
        # Its key too: another key's message under the same origin id is another message.
        source = attributes.get("sluice-source-message-id", {}).get("StringValue", "")
        message_id = self._logical_sent(call.params, source)
        reason = attributes.get(REASON_ATTRIBUTE, {}).get("StringValue", "")
        if not reason:
            self.violations.append(f"message {message_id} dead-lettered without a reason")
        sent = self.sent.get(message_id)
        waiter = awaited_keys(sent) and reason.startswith(AWAIT_REASON)
        vanished = sent is not None and sent.valid and self._vanished_machine(message_id, reason)
        if vanished and sent is not None and sent.key is not None:
            self.vanished_keys.add(sent.key)
            self.vanished_messages.add(message_id)
        if sent is not None and sent.valid and not waiter and not vanished:
            self.violations.append(
                f"valid payload {sent.key!r} (message {message_id}) dead-lettered: {reason}"
            )
        self.dead_lettered[message_id] = reason

    def _vanished_machine(self, message_id: str, reason: str) -> bool:
        """A documented dead letter after a switch and the old machine's deletion (model_machines)."""

        def key_of(m: str) -> str | None:
            return self.sent[m].key if m in self.sent else None

        def once(m: str) -> bool:
            return m in self.sent and self.sent[m].once

        return self.machines.excused(message_id, reason, claims=self.claims, key_of=key_of, once=once)
