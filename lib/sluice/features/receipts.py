"""Receipts and run-once keys.

**A receipt** is how a key's latest run ended: its outcome (SUCCEEDED, FAILED, TIMED_OUT, ABORTED),
execution ARN, start and stop times, error and cause, and its output. It costs no item and no call of
its own: the release that frees the run's slot and lease (``Store.release``, one transaction, the
path every end takes: status event, reconciliation, a redelivered message that already ran) writes

    EXEC#<name>     state, ended_at, error, cause (as before) + output | output_ref, output_size
    PAYLOAD#<key>   receipt = <name>; succeeded_by = if_not_exists(succeeded_by, <name>) on SUCCEEDED

in the items it writes anyway, conditional on ``<name>`` holding the lease. So a repeated or late
event of a run that was released already writes nothing, and a run of the key that ended earlier
can never overwrite the receipt of one that ended later: the runs of one key hold its lease one
after another, and each writes its receipt as it gives the lease up. A run that is redriven and
adopted back holds the lease again and writes the receipt again when it ends; an event of its
earlier run that arrives after that is refused (``sluice.launch.completion``: its stop date is not the one
Step Functions reports).

The output comes from the status event's ``detail.output`` when the event carries it, else from
DescribeExecution. At most ``SLUICE_RECEIPT_INLINE_BYTES`` (8,192 by default) is kept inline on the
execution record; a larger one is put in the stack's payload bucket under ``outputs/<sha256>`` and
the record keeps a pointer of the stored-payload format (``sluice.features.pointers``: uri, sha256, size).
Without a bucket only its size is kept.

**Run once.** A message with the attribute ``sluice-once: true`` (``sluice enqueue --once``) runs
its key successfully at most once. Its claim carries one more condition on the payload record,
``attribute_not_exists(succeeded_by)``, in the claim's own transaction. A claim that fails on it is
``AlreadyDone``: the message is deleted, counted on the payload record (``already_done``) and in the
tick summary (``already_done``), and nothing starts. The check and the write it races with are on
one item, so DynamoDB orders them; there is no moment where the lease is free and the success not
yet recorded. A check made by reading the receipt before the claim would have that moment:

    launcher, once-message m2 of key k          completion of e1 (m1, key k)
    ─────────────────────────────────           ────────────────────────────
    read PAYLOAD#k: no receipt yet
                                                e1 SUCCEEDED; release(e1): holder REMOVEd,
                                                  receipt = e1, succeeded_by = e1
    claim(k) IF attribute_not_exists(holder) ✓  (the lease is free)
    StartExecution(e2)  ✗ k succeeds twice

With the condition in the claim, each order ends the same way:

    claim(k) IF no holder AND no succeeded_by  ✗ LeaseHeld(e1)      (e1 still holds the lease)
    DescribeExecution(e1): SUCCEEDED (its event on the way)
    complete(e1): release, succeeded_by = e1 ✓  ── or the completion's own release wins; this one is a no-op
    claim(k) again                             ✗ AlreadyDone: delete m2, record it, start nothing

A once-key whose success is recorded keeps its payload record without expiry (the release of a
SUCCEEDED run claimed with once writes ``once_by = <name>`` and no ``expires_at``), so the promise
outlives ``retentionDays``. No later write puts it back under TTL: every write that sets
``expires_at`` on ``PAYLOAD#<key>`` (a release, a dead letter's ``record_invalid``) is conditioned on
``attribute_not_exists(once_by)`` and written again without the expiry when refused
(``sluice.adapters.dynamo.release`` has the timeline). Messages without the attribute run as before,
whatever the receipt says.

A run whose outcome cannot be known (its execution vanished with its state machine, deleted
after a switch, before Sluice saw it end: ``sluice.launch.reconcile``) may have SUCCEEDED, whether a
run-once message claimed it or not: a run-once message of its key must not run after it. Its
release marks the record ``once_unknown = <name>`` (and ``once_by``: kept without expiry), and a
run-once claim also carries ``attribute_not_exists(once_unknown)``: it fails as ``OnceUnknown`` and
the message is dead-lettered with the reason, until the operator, knowing the outcome, removes the
mark (docs/operations.md). The mark is written by the release of the run holding the lease, so no
once-claim of the key commits between that run and its mark.

A claim dropped unstarted leaves its key ``RELEASED`` (its message is retried), but a run-once
claim not over a success recorded while it held (a redriven run's, written later; one recorded
before is refused by the claim): its message is already done, and nothing else would write the
key again. Its release then keeps the key at its receipt's end (``sluice.adapters.dynamo.release``, ``NO_SUCCESS``). A success recorded after the
drop is settled by the count of the already-done message, while the key still reads so
(``left_released``):

    once-message m2's claim n2 of k             redriven run e1 of k (FAILED, released)
    ───────────────────────────────             ───────────────────────────────────────
    claim(k): holder = n2 ✓
    n2 dropped: state RELEASED, holder REMOVEd
                                                SUCCEEDED: succeeded_by = e1, receipt SUCCEEDED
    m2 again: claim(k) ✗ AlreadyDone (RELEASED)
    count it: SET state = receipt_state IF no holder AND state = RELEASED  ✓ k reads SUCCEEDED

A vanished run's ``RELEASED`` (``once_unknown``) is left as it is: its outcome is not an end.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.core.errors import InvalidPayload
from sluice.core.model import ExecutionRecord, Message, PayloadRecord, PayloadState
from sluice.core.records import ReceiptOutput
from sluice.features.pointers import PayloadObjects, Pointer

ONCE_ATTRIBUTE = "sluice-once"
OUTPUT_PREFIX = "outputs/"
DEFAULT_INLINE_BYTES = 8_192
MAX_INLINE_BYTES = 100_000  # the execution record stays well under DynamoDB's 400 KB item limit


def is_once(message: Message) -> bool:
    """Whether a message asks to run its key successfully at most once (``sluice-once: true``). A
    value other than ``true`` or ``false`` is dead-lettered at receipt (``sluice.features.attributes``)."""
    raw = message.attributes.get(ONCE_ATTRIBUTE)
    try:
        return raw is not None and parse_once(raw)
    except InvalidPayload:
        return False


def drops_once_claim(record: ExecutionRecord, state: PayloadState, outcome_unknown: bool) -> bool:
    """A release in ``state`` of ``record`` that gives up a run-once claim unstarted (its start
    refused, or abandoned), not a run's end: it leaves the key at a success recorded while it held
    (``left_released`` reads the same state from the other side)."""
    return record.once and state is PayloadState.RELEASED and not outcome_unknown


def left_released(payload: PayloadRecord) -> bool:
    """A key's record that a claim dropped unstarted left ``RELEASED`` over an earlier end."""
    return (
        payload.state is PayloadState.RELEASED
        and payload.holder is None
        and payload.receipt_state is not None
        and payload.once_unknown is None  # a vanished run's: its outcome is unknown, not an end
    )


def parse_once(raw: str) -> bool:
    """A ``sluice-once`` value: ``true`` or ``false``, in any case."""
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise InvalidPayload(f"is {raw[:40]!r}: use 'true' or 'false'")
    return value == "true"


class Outputs:
    """Where receipts keep outputs: inline up to ``inline_bytes``, else in the payload bucket."""

    def __init__(
        self, objects: PayloadObjects | None = None, inline_bytes: int = DEFAULT_INLINE_BYTES
    ) -> None:
        self.objects = objects
        self.inline_bytes = inline_bytes

    def keep(self, text: str | None) -> ReceiptOutput | None:
        if text is None:
            return None
        raw = text.encode("utf-8")
        if len(raw) <= self.inline_bytes:
            return ReceiptOutput(inline=text, size=len(raw), text=text)
        if self.objects is None:
            return ReceiptOutput(
                size=len(raw), text=text
            )  # too big to keep inline, and no bucket: its size only
        digest = hashlib.sha256(raw).hexdigest()
        key = f"{OUTPUT_PREFIX}{digest}"
        self.objects.put(key, raw, sha256=digest)  # content-addressed: a retry writes the same object
        pointer = Pointer(self.objects.bucket, key, digest, len(raw))
        spec = {"uri": pointer.uri, "sha256": pointer.sha256, "size": pointer.size}
        return ReceiptOutput(pointer=json.dumps(spec, separators=(",", ":")), size=len(raw), text=text)


@dataclass(frozen=True, slots=True)
class Receipt:
    """How the key's latest run ended (``PAYLOAD#<key>.receipt`` → ``EXEC#<name>``)."""

    key: str
    name: str
    outcome: PayloadState
    arn: str | None
    started_at: float | None
    stopped_at: float | None
    error: str | None = None
    cause: str | None = None
    output: str | None = None
    output_pointer: dict[str, Any] | None = None
    output_size: int | None = None
    succeeded_by: str | None = None  # the key's first SUCCEEDED run, whatever ran after it

    @property
    def succeeded(self) -> bool:
        return self.outcome is PayloadState.SUCCEEDED

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "execution": self.name,
            "outcome": self.outcome.value,
            "arn": self.arn,
            "started_at": self.started_at,
            "stopped_at": self.stopped_at,
            "error": self.error,
            "cause": self.cause,
            "output": self.output,
            "output_pointer": self.output_pointer,
            "output_size": self.output_size,
            "succeeded_by": self.succeeded_by,
        }


def receipt_of(payload: PayloadRecord | None, run: ExecutionRecord | None) -> Receipt | None:
    """The receipt these records make, or None when the key has none (yet)."""
    if payload is None or run is None or payload.receipt != run.name or not run.state.ended:
        return None
    return Receipt(
        key=payload.key,
        name=run.name,
        outcome=run.state,
        arn=run.arn,
        started_at=run.started_at,
        stopped_at=run.ended_at,
        error=run.error,
        cause=run.cause,
        output=run.output,
        output_pointer=json.loads(run.output_ref) if run.output_ref else None,
        output_size=run.output_size,
        succeeded_by=payload.succeeded_by,
    )


def read_receipt(store: Any, key: str) -> Receipt | None:
    """The key's receipt from a ``Store``: its payload record, then the execution it names."""
    payload = store.payload(key)
    if payload is None or payload.receipt is None:
        return None
    return receipt_of(payload, store.execution(payload.receipt))


def wait_for(
    read: Callable[[], Receipt | None],
    *,
    timeout: float | None,
    now: Callable[[], float],
    sleep: Callable[[float], None] = time.sleep,
    first: float = 1.0,
    longest: float = 30.0,
) -> Receipt | None:
    """Poll ``read`` until it returns a receipt, or None once ``timeout`` seconds have passed (None:
    no limit). The pause doubles from ``first`` to ``longest`` and never overshoots the deadline."""
    deadline = None if timeout is None else now() + timeout
    pause = first
    while True:
        found = read()
        if found is not None:
            return found
        left = None if deadline is None else deadline - now()
        if left is not None and left <= 0:
            return None
        sleep(pause if left is None else min(pause, left))
        pause = min(longest, pause * 2)


def asked_once(
    output: Callable[[ExecutionRecord], ReceiptOutput | None] | None,
) -> Callable[[ExecutionRecord], ReceiptOutput | None]:
    """``output``, asked once however many times a release is tried (it may send effects)."""
    kept: list[ReceiptOutput | None] = []

    def ask(record: ExecutionRecord) -> ReceiptOutput | None:
        if not kept:
            kept.append(output(record) if output is not None else None)
        return kept[0]

    return ask
