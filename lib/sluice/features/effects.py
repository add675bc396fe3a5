"""Effects: follow-up payloads that a SUCCEEDED execution's output names, enqueued exactly once.

An output may carry ``{"sluiceEffects": [{"payload": {...}, "key": "...", "group": "...",
"lane": "default", "awaits": ["k1", ...], "once": true}, ...]}``. When the execution is released as
SUCCEEDED, each effect goes to the main queue as a payload of its own (``sluice-key`` its key, in its
group, ``sluice-awaits`` a JSON array of the keys it awaits, ``sluice-once: true`` when asked); an
effect that cannot be a payload is copied to the DLQ with its reason instead, as bad input is. Nothing
is read or written for an output that names no effects.

**Where.** In the release itself (``complete``, the one path every end takes: status event,
reconciliation, a redelivered message that already ran): the release reads the execution record,
asks for the output (``PayloadLeases.release(output=...)``), and only a release that is about to happen asks.
``around`` wraps that question: it sends the effects *before* the release's transaction and hands
their log back, and the transaction writes ``EFFECTS#<name>`` (count, keys sent, reasons refused)
beside the slot, the lease and the receipt. So:

* a repeated or late event of a released execution releases nothing, so asks nothing, sends nothing;
* ``EFFECTS#<name>`` exists once and only once the effects were sent; a release that finds it sends
  nothing. A redelivered message of a name that ran is refused at its claim (``AlreadyRan``), so its
  execution is never released twice; the check stays as a second guard.

**Exactly once.** Sending to SQS and writing DynamoDB cannot be one transaction, so the window
between them is closed by names, not by time:

* each effect's message carries a deterministic deduplication id (its execution's name and the
  effect's index) and the same id as its origin (``sluice-origin-message-id``), from which the
  launcher derives its execution name (``sluice.core.names``);
* within SQS's 5-minute deduplication window a second send is dropped by SQS;
* after it (a lost event found by reconciliation an hour later), a second copy does reach the queue,
  but it names the same execution as the first: Step Functions runs a name once, so the launcher
  resumes it (running: the same ARN) or settles it as already ran (ended). The effect *runs* once.

::

    completion of A (SUCCEEDED, effects e0 e1 e2)          state left behind
    ─────────────────────────────────────────────          ─────────────────
    read EXEC#A: holds the lease; output in hand
    read EFFECTS#A: absent
    send e0 (dedup fx(A,0)) ── crash ①                      e0 queued; lease held, no EFFECTS#A
    send e1, e2             ── crash ②                      all queued;  lease held, no EFFECTS#A
    TransactWrite: release A + receipt + EFFECTS#A ── crash ③  released, EFFECTS#A written
    wake parked, refill

    ① ② retry (EventBridge, < 5 min): sends again, SQS drops the copies; the release writes the mark
    ① ② lost, reconciliation later (> 5 min): sends again; e0 (e1, e2) reach the queue twice, each
        copy with the same origin id: one execution name per effect, run once
    ③ retry or reconciliation: A released already → nothing asked, nothing sent
       a redelivered message of A claims A again, finds it ended → EFFECTS#A exists → nothing sent

**Limits.** At most ``MAX_EFFECTS`` (100) per execution, else the whole list is refused (one DLQ copy,
the reason recorded). ``lane`` sends the effect to that lane's queue (``sluice.features.lanes``); a lane the
stack does not have refuses that effect;
``awaits`` (at most ``sluice.features.awaits.MAX_AWAITS`` keys, the launcher's own limit) is passed on as
``sluice-awaits``, ``concurrency_key`` as ``sluice-concurrency-key`` (``sluice.features.keys``). A body over the pointer threshold is stored in the payload bucket and sent as a pointer
(``sluice.features.pointers``), as ``sluice enqueue`` does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sluice.core.errors import InvalidPayload
from sluice.core.model import EffectsLog, ExecutionRecord, Message, ParkedMessage, PayloadState
from sluice.core.names import ORIGIN_ATTRIBUTE
from sluice.core.ports import Queue, Records
from sluice.core.records import ReceiptOutput
from sluice.core.validation import KEY_ATTRIBUTE, MAX_INPUT_BYTES, check_key, parse_object
from sluice.features.awaits import MAX_AWAITS
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE
from sluice.features.lanes import DEFAULT_LANE, LANE_ATTRIBUTE
from sluice.features.pointers import DEFAULT_THRESHOLD, MAX_STORED_BYTES, SQS_MAX_BYTES, PayloadObjects, store
from sluice.features.receipts import ONCE_ATTRIBUTE

log = logging.getLogger("sluice.effects")

EFFECTS_FIELD = "sluiceEffects"
AWAITS_ATTRIBUTE = "sluice-awaits"
EFFECT_OF_ATTRIBUTE = "sluice-effect-of"  # on a dead-lettered effect: the execution that named it
EFFECT_INDEX_ATTRIBUTE = "sluice-effect-index"
MAX_EFFECTS = 100
FIELDS = frozenset({"payload", "key", "group", "lane", "awaits", "once", "concurrency_key"})
WHOLE_LIST = -1  # the index a refusal of the whole list is recorded under
_GROUP_ID = re.compile(r"^[!-~]{1,128}$")  # SQS: 1-128 printable ASCII characters

Output = Callable[[ExecutionRecord], ReceiptOutput | None]


def effect_id(name: str, index: int) -> str:
    """The effect's id: its message's origin id and deduplication id stem, from the execution's name
    and the effect's index, so every send of it is the same message to SQS and to the launcher."""
    return "fx-" + hashlib.sha256(f"{name}\x00{index}".encode()).hexdigest()[:40]


@dataclass(frozen=True, slots=True)
class Effects:
    """How effects are sent: the payload bucket for bodies over ``threshold`` (None: no bucket, such
    a body is refused), and the most effects one execution may name."""

    objects: PayloadObjects | None = None
    threshold: int = DEFAULT_THRESHOLD
    limit: int = MAX_EFFECTS
    lanes: tuple[str, ...] = ()  # the stack's lanes (sluice.features.lanes); () is the one lane "default"

    def send(self, text: str, *, record: ExecutionRecord, queue: Queue, now: float) -> EffectsLog | None:
        """Send the effects ``text`` (an output) names; None when it names none."""
        try:
            listed = _listed(text)
        except _Refused as refused:
            _dead_letter(queue, record.name, WHOLE_LIST, refused.body, refused.reason)
            return _logged(
                EffectsLog(record.name, record.key, refused.count, (), ((WHOLE_LIST, refused.reason),), now)
            )
        if not listed:
            return None
        if len(listed) > self.limit:
            reason = f"{EFFECTS_FIELD} names {len(listed)} effects; at most {self.limit} per execution"
            body = json.dumps({EFFECTS_FIELD: listed}, ensure_ascii=False, separators=(",", ":"))
            _dead_letter(queue, record.name, WHOLE_LIST, body, reason)
            return _logged(EffectsLog(record.name, record.key, len(listed), (), ((WHOLE_LIST, reason),), now))
        sent: list[str] = []
        rejected: list[tuple[int, str]] = []
        for index, spec in enumerate(listed):
            try:
                message = self._message(record, index, spec, now)
            except InvalidPayload as exc:
                reason = f"effect {index}: {exc.reason}"
                payload = spec.get("payload") if isinstance(spec, dict) else None
                shown = payload if isinstance(payload, dict) else spec
                _dead_letter(queue, record.name, index, _json(shown), reason)
                rejected.append((index, reason))
                continue
            queue.requeue(message)
            sent.append(message.key)
        return _logged(EffectsLog(record.name, record.key, len(listed), tuple(sent), tuple(rejected), now))

    def _message(self, record: ExecutionRecord, index: int, spec: Any, now: float) -> ParkedMessage:
        """The message effect ``index`` of ``record``'s output sends, checked as the launcher would
        check it (``InvalidPayload``: why it is refused)."""
        lane, payload, body = self._checked(spec)
        key, group = _key_and_group(spec, payload)
        attributes = _attributes(spec, key, lane)
        mid = effect_id(record.name, index)
        return ParkedMessage(
            message_id=mid,
            key=key,
            holder=record.name,
            body=self._sized(body, key, attributes, mid),
            group_id=group,
            attributes=attributes,
            parked_at=now,
        )

    def _checked(self, spec: Any) -> tuple[str, dict[str, Any], str]:
        """The effect's fields, its lane and its payload checked: (lane, payload, the body as sent)."""
        if not isinstance(spec, dict):
            raise InvalidPayload(f"an effect must be a JSON object, got {_type(spec)}")
        unknown = sorted(set(spec) - FIELDS)
        if unknown:
            raise InvalidPayload(
                f"unknown field(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(FIELDS))}"
            )
        lane = spec.get("lane", DEFAULT_LANE)
        if lane != DEFAULT_LANE and lane not in self.lanes:
            known = ", ".join(repr(n) for n in self.lanes) or f"{DEFAULT_LANE!r} only (no lanes configured)"
            raise InvalidPayload(f"lane {_json(lane)[:200]} refused: the stack's lanes are {known}")
        payload = spec.get("payload")
        if not isinstance(payload, dict):
            raise InvalidPayload(f"'payload' must be a JSON object, got {_type(payload)}")
        body = _json(payload)
        # The launcher's own rules (sluice.core.validation), on the body as it will be sent.
        parse_object(body, max_bytes=MAX_STORED_BYTES if self.objects is not None else MAX_INPUT_BYTES)
        return lane, payload, body

    def _sized(self, body: str, key: str, attributes: dict[str, str], mid: str) -> str:
        """The body as sent: stored in the payload bucket, a pointer in its place, when it is over
        the threshold or, with its attributes, over SQS's size."""
        size = len(body.encode()) + sum(
            len(k.encode()) + len("String") + len(v.encode())
            for k, v in {**attributes, ORIGIN_ATTRIBUTE: mid}.items()
        )
        if size > SQS_MAX_BYTES or len(body.encode()) > self.threshold:
            if self.objects is not None:
                body = store(self.objects, body.encode()).body(
                    key
                )  # content-addressed: a retry writes the same object
            elif size > SQS_MAX_BYTES:
                raise InvalidPayload(
                    f"payload is {len(body.encode()):,} bytes; with its attributes over SQS's {SQS_MAX_BYTES:,} "
                    "bytes, and this stack has no payload bucket (SLUICE_PAYLOAD_BUCKET) to store it in"
                )
        return body


def _key_and_group(spec: dict[str, Any], payload: dict[str, Any]) -> tuple[str, str]:
    """The effect's key (its own, or its payload's id) and its FIFO group."""
    key = spec.get("key", payload.get("id"))
    if not isinstance(key, str) or not key:
        raise InvalidPayload("no key: give the payload an 'id' or the effect a 'key' (a non-empty string)")
    check_key(key, source="the effect's key")
    group = spec.get("group", key if _GROUP_ID.match(key) else hashlib.sha256(key.encode()).hexdigest())
    if not isinstance(group, str) or not _GROUP_ID.match(group):
        raise InvalidPayload("'group' must be 1 to 128 printable ASCII characters")
    return key, group


def _attributes(spec: dict[str, Any], key: str, lane: str) -> dict[str, str]:
    """The message attributes the effect's fields ask for: its key, lane, once, awaits, concurrency key."""
    attributes = {KEY_ATTRIBUTE: key}
    if lane != DEFAULT_LANE:
        attributes[LANE_ATTRIBUTE] = lane  # the queue adapter sends it to that lane's queue
    once = spec.get("once", False)
    if not isinstance(once, bool):
        raise InvalidPayload(f"'once' must be true or false, got {_type(once)}")
    if once:
        attributes[ONCE_ATTRIBUTE] = "true"
    if "awaits" in spec:
        attributes[AWAITS_ATTRIBUTE] = _json(_awaits(spec["awaits"]))
    if "concurrency_key" in spec:
        ckey = spec["concurrency_key"]
        if not isinstance(ckey, str) or not ckey:
            raise InvalidPayload(f"'concurrency_key' must be a non-empty string, got {_type(ckey)}")
        attributes[CONCURRENCY_KEY_ATTRIBUTE] = check_key(ckey, source="the effect's concurrency_key")
    return attributes


def around(
    output: Output | None,
    effects: Effects | None,
    *,
    store: Records,
    queue: Queue,
    name: str,
    state: PayloadState,
    now: float,
) -> Output | None:
    """The release's output question (``PayloadLeases.release(output=...)``), sending the effects the output
    names before the release writes them down. Asked only by a release that is about to happen."""
    if output is None or state is not PayloadState.SUCCEEDED:
        return output
    config = effects or Effects()

    def keep(record: ExecutionRecord) -> ReceiptOutput | None:
        kept = output(record)
        if kept is None or not kept.text or EFFECTS_FIELD not in kept.text:
            return kept  # an output without effects: nothing read, nothing sent, nothing written
        if store.effects(name) is not None:
            return kept  # an earlier release of this name sent them
        sent = config.send(kept.text, record=record, queue=queue, now=now)
        return kept if sent is None else replace(kept, effects=sent)

    return keep


class _Refused(Exception):
    def __init__(self, reason: str, body: str, count: int) -> None:
        super().__init__(reason)
        self.reason, self.body, self.count = reason, body, count


def _listed(text: str) -> list[Any]:
    """The output's effects list ([] when it names none); ``_Refused`` when it is not a list."""
    try:
        output = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _Refused(
            f"the output names {EFFECTS_FIELD} but cannot be read as JSON ({exc})", text, 0
        ) from None
    if not isinstance(output, dict) or EFFECTS_FIELD not in output:
        return []
    listed = output[EFFECTS_FIELD]
    if not isinstance(listed, list):
        raise _Refused(
            f"{EFFECTS_FIELD} must be a JSON array, got {_type(listed)}", _json({EFFECTS_FIELD: listed}), 0
        )
    return listed


def _awaits(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(k, str) and k for k in value):
        raise InvalidPayload("'awaits' must be a JSON array of keys (non-empty strings)")
    if len(value) > MAX_AWAITS:
        raise InvalidPayload(f"'awaits' names {len(value)} keys; at most {MAX_AWAITS}")
    for k in value:
        check_key(k, source="an awaited key")
    return list(value)


def _dead_letter(queue: Queue, name: str, index: int, body: str, reason: str) -> None:
    queue.send_to_dlq(
        Message(
            message_id=effect_id(name, index),  # the DLQ's deduplication id: a retry sends one copy
            receipt_handle="",
            body=body,
            attributes={EFFECT_OF_ATTRIBUTE: name, EFFECT_INDEX_ATTRIBUTE: str(index)},
        ),
        reason,
    )
    log.warning(
        "effect dead-lettered", extra={"execution_name": name, "effect_index": index, "reason": reason}
    )


def _logged(effects: EffectsLog) -> EffectsLog:
    log.info(
        "effects sent",
        extra={
            "execution_name": effects.name,
            "payload_key": effects.key,
            "effects": effects.count,
            "sent": len(effects.sent),
            "rejected": len(effects.rejected),
        },
    )
    return effects


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
