"""What a call is, in protocol terms: the step a boto3 call performs, and where a process can die.

Shared by the fault injectors (tests/support/faults.py), which aim at steps, and the reference model
(tests/support/model.py), which checks the promises at each step.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

ORIGIN_ATTRIBUTE = "sluice-origin-message-id"  # on a parked message re-sent to the queue
AWAITS_ATTRIBUTE = "sluice-awaits"  # the keys a message awaits (a JSON array)
ONCE_ATTRIBUTE = "sluice-once"  # "true": the key runs successfully at most once
EFFECT_ORIGIN_PREFIX = "fx-"  # the origin id of an effect's message (docs/protocol.md, "Effects")
REASON_ATTRIBUTE = "sluice-error"  # on every dead-letter copy: the reason
CONCURRENCY_KEY_ATTRIBUTE = "sluice-concurrency-key"  # the message's concurrency key
LANE_POOL_PREFIX = "SLOTS#lane-"  # a lane's slot pool (sluice.features.lanes): SLOTS#lane-<lane>[#<i>]
TICKET_ATTRIBUTE = "sluice-key-ticket"  # on a waiter woken from its key's line: "<ticket>@<ms>"
# A woken waiter's deduplication id ends with the digest of the awaits feature's wake-up "holder".
WAKE_DEDUP_SUFFIX = "-" + hashlib.sha256(b"sluice-awaits").hexdigest()[:32]
AWAITED_FLAG = "SET awaited = :yes"
SWAP = "REMOVE holders.#old SET holders.#new = :now"  # a shard's slot handed from one holder to the next  # a waiter's park flags each key it awaits (``PAYLOAD#<key>``)


@dataclass(frozen=True)
class Call:
    container: str
    service: str  # sqs, dynamodb, stepfunctions, ssm
    operation: str  # the API operation, e.g. TransactWriteItems
    step: str  # the protocol step, e.g. claim, start, mark, delete, release
    params: dict[str, Any]

    def matches(self, target: str) -> bool:
        return target in (self.step, self.operation)


def _updates(params: dict[str, Any]) -> list[dict[str, Any]]:
    return [item["Update"] for item in params.get("TransactItems", []) if "Update" in item]


def _puts(params: dict[str, Any]) -> list[dict[str, Any]]:
    return [item["Put"] for item in params.get("TransactItems", []) if "Put" in item]


def _pk(update_or_put: dict[str, Any]) -> str:
    where = update_or_put.get("Key") or update_or_put.get("Item") or {}
    return str(where.get("pk", {}).get("S", ""))


def slot_names(params: dict[str, Any], verb: str) -> list[str]:
    """The execution names a transaction gives a slot (``take``) or takes one from (``give``): on a
    shard of the launcher's pool (``SET holders.#n`` / ``REMOVE holders.#n``), or in the LEDGER's
    legacy holder set (``ADD holders`` / ``DELETE holders``)."""
    out: list[str] = []
    for u in _updates(params):
        pk, expression = _pk(u), u.get("UpdateExpression", "")
        if pk == "LEDGER" and f"{'ADD' if verb == 'take' else 'DELETE'} holders" in expression:
            values = u["ExpressionAttributeValues"]
            out.extend(values.get(":names", {}).get("SS") or [values[":name"]["S"]])
        elif pk.startswith("SLOTS#launcher#"):
            prefix = "SET holders.#n" if verb == "take" else "REMOVE holders.#n"
            if expression.startswith(prefix):
                out.append(u["ExpressionAttributeNames"]["#n"])
            elif expression == SWAP:  # a hand-over: one name gives the slot, the other takes it
                out.append(u["ExpressionAttributeNames"]["#new" if verb == "take" else "#old"])
    return out


def hand_over(params: dict[str, Any]) -> bool:
    """A release that hands its slot to a successor's claim in the same transaction."""
    return any(
        _pk(u).startswith("SLOTS#launcher#") and u.get("UpdateExpression") == SWAP for u in _updates(params)
    )


def limit_change(params: dict[str, Any]) -> bool:
    """A transaction that moves the caps of the launcher's pool (``set_limit``, ``rebalance``)."""
    items = params.get("TransactItems", [])
    return any(_pk(i.get("Update") or i.get("ConditionCheck") or {}) == "SLOTS#launcher" for i in items)


def lane_of_pool(pk: str) -> str | None:
    """The lane whose pool item (``SLOTS#lane-<lane>``) ``pk`` is; None for any other item."""
    if pk.startswith(LANE_POOL_PREFIX) and pk.count("#") == 1:
        return pk[len(LANE_POOL_PREFIX) :]
    return None


def lane_of_shard(pk: str) -> str | None:
    """The lane whose pool shard (``SLOTS#lane-<lane>#<i>``) ``pk`` is; None for any other item."""
    if pk.startswith(LANE_POOL_PREFIX) and pk.count("#") == 2:
        return pk[len(LANE_POOL_PREFIX) :].rsplit("#", 1)[0]
    return None


def lane_slot_names(params: dict[str, Any], verb: str) -> list[tuple[str, str]]:
    """(lane, execution name) for each slot of a lane's pool (``sluice.features.lanes``) a transaction takes
    (``take``: a claim, an adoption) or gives back (``give``: a release): ``SET holders.#n`` /
    ``REMOVE holders.#n`` on a shard ``SLOTS#lane-<lane>#<i>``."""
    out: list[tuple[str, str]] = []
    prefix = "SET holders.#n" if verb == "take" else "REMOVE holders.#n"
    for u in _updates(params):
        lane = lane_of_shard(_pk(u))
        if lane is not None and u.get("UpdateExpression", "").startswith(prefix):
            out.append((lane, u["ExpressionAttributeNames"]["#n"]))
    return out


def lane_limit_change(params: dict[str, Any]) -> bool:
    """A transaction that moves the caps of a lane's pool (``Store.set_lane_limit``, a rebalance)."""
    items = params.get("TransactItems", [])
    return any(lane_of_pool(_pk(i.get("Update") or i.get("ConditionCheck") or {})) for i in items)


def _key_item(update_or_check: dict[str, Any]) -> bool:
    return _pk(update_or_check).startswith("CKEY#")


def key_wake_dedup(attributes: dict[str, Any]) -> str | None:
    """The deduplication id suffix of a waiter woken from its key's line (``sluice.features.keys.as_parked``:
    the holder ``sluice-key:<key>#<ticket>@<ms>``, its in-flight entry, which the attribute
    ``sluice-key-ticket`` carries whole), or None for a message without a key and a ticket."""
    ckey = attributes.get(CONCURRENCY_KEY_ATTRIBUTE, {}).get("StringValue")
    ticket = attributes.get(TICKET_ATTRIBUTE, {}).get("StringValue", "")
    if not ckey or not ticket:
        return None
    return "-" + hashlib.sha256(f"sluice-key:{ckey}#{ticket}".encode()).hexdigest()[:32]


def protocol_step(service: str, operation: str, params: dict[str, Any]) -> str:
    """Name a call by the protocol step it performs (launcher.py's timeline, reconciliation's).

    Transactions: a slot passed from one holder to the next on a shard hands a completion's slot
    over (``hand_over``: the release and the successor's claim); a Put of ``PARK#`` parks a
    deferred duplicate; a slot given back (with or without
    the Put of ``EFFECTS#<name>``, the mark of the effects sent) releases; a write to ``WAIT#`` (with
    the flags ``SET awaited`` on the awaited keys, or those flags alone: ``await_flag``) or
    adding to the awaits sets (``AWAITING``, ``AWAITED#``) parks a waiter (``wait``), deleting from
    them clears a released waiter off them (``unwait``); a Put of ``EXEC#`` is a claim;
    a write to the pool item moves the caps (``limit``); ``SET succeeded_by`` with no slot given back
    records a redriven run's success after its release (``later_success``); a slot given back releases; a slot taken
    without a Put adopts an execution running again (a redrive); the rest marks RUNNING. Single updates: ``renewed_at`` renews
    a resumed claim; ``suspect_since`` is reconciliation's first sighting of an unstarted claim;
    ``SET starting_at`` is a resumed claim's mark just before StartExecution (``start_mark``; a fresh
    claim's ``EXEC#`` Put carries it).

    Concurrency keys (``sluice.features.keys``): a Put of ``KWAIT#`` parks a message in its key's line
    (``key_park``); a transaction that moves ``woken`` on ``CKEY#`` advances the line (``key_advance``);
    one that takes the key off ``KEYS_WAITING`` forgets it (``key_forget``); a SendMessage whose
    deduplication id names a key's ticket wakes a waiter (``key_wake``); a single update taking an
    entry off ``inflight`` gives a woken waiter's kept slot back (``key_forgo``), one of ``cap`` sets a
    key's own cap (``key_cap``).

    Lanes (``sluice.features.lanes``): a claim, release or adoption takes or gives a lane's slot in its own
    transaction (``lane_slot_names``); a write to a lane's pool item (``SLOTS#lane-<lane>``) moves
    that lane's caps (``lane_limit``: the tick's ``sync_lanes``, the operator's command, the
    rebalance after an adoption); a single update of ``LANE#<lane>`` records the operator's setting
    (``lane_setting``).
    """
    if operation == "TransactWriteItems":
        if hand_over(params):
            return "hand_over"  # a completion's release and its refill's claim (sluice.launch.handover)
        puts = [_pk(p) for p in _puts(params)]
        if any(pk.startswith("PARK#") for pk in puts):
            return "park"
        if any(pk.startswith("KWAIT#") for pk in puts):
            return "key_park"
        updates = _updates(params)
        if any(_key_item(u) and "SET #woken = :to" in u.get("UpdateExpression", "") for u in updates):
            return "key_advance"
        if any(_pk(u) == "KEYS_WAITING" and "DELETE" in u.get("UpdateExpression", "") for u in updates):
            return "key_forget"
        if puts and slot_names(params, "give"):
            return "release"  # with the Put of EFFECTS#<name>
        # A waiter's park flags the keys it awaits on their payload records (``SET awaited``): in
        # its own transaction, or, for many keys, in transactions of flags alone just before it.
        rooms = [u for u in _updates(params) if u.get("UpdateExpression") != AWAITED_FLAG]
        if not rooms and _updates(params):
            return "await_flag"
        touched = [_pk(u) for u in rooms]
        if touched and all(pk.startswith(("WAIT#", "AWAITED#")) or pk == "AWAITING" for pk in touched):
            deleting = all("DELETE waiters" in u.get("UpdateExpression", "") for u in rooms)
            return "unwait" if deleting else "wait"
        if any("SET succeeded_by" in u.get("UpdateExpression", "") for u in updates):
            return "later_success"  # a redriven run's success after its release (with EFFECTS#<name>)
        if puts:
            return "claim"
        if slot_names(params, "take") and not slot_names(params, "give"):
            return "adopt"  # with a check of the pool item when it takes a slot of a frozen pool
        if limit_change(params):
            return "limit"
        if lane_limit_change(params):
            return "lane_limit"
        if slot_names(params, "give"):
            return "release"
        if any("renewed_at" in u.get("UpdateExpression", "") for u in _updates(params)):
            return "renew"
        return "mark"
    if operation == "UpdateItem":
        expression = params.get("UpdateExpression", "")
        if "renewed_at" in expression:
            return "renew"
        if expression == "SET starting_at = :now":
            return "start_mark"  # a resumed claim's last write before StartExecution
        if expression.startswith("SET blocked_by = :by"):
            return "block"  # reconciliation's block of an unstarted claim, for a redriven run of its key
        if "suspect_since" in expression and "REMOVE suspect_since" not in expression:
            return "suspect"
        if (
            params.get("Key", {}).get("pk", {}).get("S", "").startswith("WAIT#")
            and "released_at =" in expression
        ):
            return "waiter_released"
        if "ADD already_done" in expression:
            return "already_done"
        if "ADD duplicates" in expression:
            return "duplicate"
        if ":invalid" in expression:
            return "invalid"
        if "reconciled_at" in expression:
            return "save_reconciliation"
        if params.get("Key", {}).get("pk", {}).get("S", "").startswith("SLOTS#launcher"):
            return "limit"
        if params.get("Key", {}).get("pk", {}).get("S", "").startswith(LANE_POOL_PREFIX):
            return "lane_limit"
        if params.get("Key", {}).get("pk", {}).get("S", "").startswith("LANE#"):
            return "lane_setting"
        if params.get("Key", {}).get("pk", {}).get("S", "").startswith("CKEY#"):
            return "key_forgo" if "DELETE #inflight" in expression else "key_cap"
        return "update"
    attributes = params.get("MessageAttributes", {})
    if operation == "SendMessage" and ORIGIN_ATTRIBUTE in attributes and REASON_ATTRIBUTE not in attributes:
        # A dead-letter copy keeps the message's attributes, its origin id too (a re-sent parked
        # message, a woken waiter, an effect dead-lettered by the launcher): it is a dead letter.
        origin = attributes[ORIGIN_ATTRIBUTE].get("StringValue", "")
        dedup = str(params.get("MessageDeduplicationId", ""))
        if dedup.endswith(WAKE_DEDUP_SUFFIX):
            return "wake"  # a waiter whose awaits have SUCCEEDED (an effect's, too) sent back to the queue
        key_wake = key_wake_dedup(attributes)
        if key_wake is not None and dedup.endswith(key_wake):
            return "key_wake"  # a waiter of a concurrency key's line sent back to the queue
        if origin.startswith(EFFECT_ORIGIN_PREFIX):
            return "effect"  # an effect a SUCCEEDED output named, sent before its release
        return "unpark"
    if operation == "ListExecutions" and "redriveFilter" in params:
        return "list_redriven"  # reconciliation's look for redriven runs' successes, after its listing
    return {
        "ReceiveMessage": "receive",
        "DeleteMessageBatch": "delete",
        "ChangeMessageVisibilityBatch": "return",
        "SendMessage": "dead_letter",
        "StartExecution": "start",
        "DescribeExecution": "describe",
        "ListExecutions": "list",
        "DescribeStateMachine": "check",
        "GetParameter": "max",
        "GetItem": "read",
        "BatchGetItem": "read",
    }.get(operation, operation)


# Where a process can die: (before or after the call, protocol step). "after" counts successful
# calls only: dying after a refused call is dying before it. These are the points one busy tick
# reaches (tests/reliability/test_scenarios.py crashes each).
CRASH_POINTS: dict[str, tuple[str, str]] = {
    "after_receive": ("after", "receive"),
    "after_claim": ("after", "claim"),
    "before_start": ("before", "start"),  # a fresh claim carries its start mark: the claim is next
    "after_start": ("after", "start"),
    "before_delete": ("before", "delete"),
    "after_delete": ("after", "delete"),
    "after_duplicate": ("after", "duplicate"),
    "after_dead_letter": ("after", "dead_letter"),
    "before_release": ("before", "release"),
    "after_release": ("after", "release"),
    "after_list": ("after", "list"),
    "after_describe": ("after", "describe"),
}

# Points reached only in particular situations, so not by every busy tick: a resumed claim (its
# renewal, its start mark), reconciliation's first sighting of an unstarted claim, the adoption of
# an execution running again, a deferred duplicate parked and re-sent, a batch given back (a lost
# race for a slot, or a transient error: deferred duplicates are parked, not returned). Each is
# crashed by its own scenario (tests/reliability/test_promise_breaks.py).
SITUATIONAL_POINTS: dict[str, tuple[str, str]] = {
    # a resumed claim's mark anew after its renewal (a fresh claim is written marked)
    "before_start_mark": ("before", "start_mark"),
    "after_start_mark": ("after", "start_mark"),
    "before_return": ("before", "return"),
    "after_return": ("after", "return"),
    "after_renew": ("after", "renew"),
    "after_suspect": ("after", "suspect"),
    "after_adopt": ("after", "adopt"),
    "after_park": ("after", "park"),
    "before_unpark": ("before", "unpark"),
    "after_unpark": ("after", "unpark"),
    # reconciliation's mark of a claim Step Functions says runs (the launcher writes none after a start)
    "after_mark": ("after", "mark"),
    # a completion's refill: after the receive, before the release that hands its slot on; after it
    "before_hand_over": ("before", "hand_over"),
    "after_hand_over": ("after", "hand_over"),
}
# Points of awaits, run-once keys and effects (issue 13): the release writing a key's receipt (then
# the wake-up of its waiters), a waiter parked, sent back (before the mark), marked released (before
# the sets are cleared), a run-once message recorded as already done, an effect sent before its
# execution's release. Reached by the property suite's awaits, once and effects actions, and each by
# its own scenario (tests/reliability/test_promise_breaks.py).
AWAIT_POINTS: dict[str, tuple[str, str]] = {
    "after_wait": ("after", "wait"),
    "before_wake": ("before", "wake"),
    "after_wake": ("after", "wake"),
    "after_waiter_released": ("after", "waiter_released"),
    "after_unwait": ("after", "unwait"),
    "after_already_done": ("after", "already_done"),
    "before_effect": ("before", "effect"),
    "after_effect": ("after", "effect"),
}
# Points of concurrency keys (issue 11): a message parked in its key's line (before its delete),
# a waiter sent back (before and after the send, before the line's head moves), the head moved,
# a woken waiter that does not claim giving its kept slot back. Reached by the property suite's
# keyed messages and key caps.
KEY_POINTS: dict[str, tuple[str, str]] = {
    "after_key_park": ("after", "key_park"),
    "before_key_wake": ("before", "key_wake"),
    "after_key_wake": ("after", "key_wake"),
    "after_key_advance": ("after", "key_advance"),
    "after_key_forgo": ("after", "key_forgo"),
}
# Points of lanes (sluice.features.lanes): the caps of a lane's pool moved to its limit in force (the tick's
# sync of every lane's limit, before it admits; the operator's command; the rebalance after an
# adoption). Reached by the first tick of a program with lanes, and whenever a lane's limit moves.
LANE_POINTS: dict[str, tuple[str, str]] = {
    "before_lane_limit": ("before", "lane_limit"),
    "after_lane_limit": ("after", "lane_limit"),
}
ALL_POINTS = {**CRASH_POINTS, **SITUATIONAL_POINTS, **AWAIT_POINTS, **KEY_POINTS, **LANE_POINTS}

# The steps of launcher.py's timeline, and of reconciliation and completion, where a crash matters.
PROTOCOL_STEPS = frozenset(step for _, step in ALL_POINTS.values())

# Calls that can be throttled: TransactWriteItems by protocol step, the rest by operation.
THROTTLE_TARGETS = (
    "ReceiveMessage",
    "DeleteMessageBatch",
    "ChangeMessageVisibilityBatch",
    "SendMessage",
    "claim",
    "wait",
    "key_park",
    "key_advance",
    "lane_limit",
    "mark",
    "release",
    "hand_over",
    "GetItem",
    "BatchGetItem",
    "UpdateItem",
    "StartExecution",
    "DescribeExecution",
    "ListExecutions",
    "DescribeStateMachine",
    "GetParameter",
)

STALE_MODES = ("empty", "drop_newest", "previous")
