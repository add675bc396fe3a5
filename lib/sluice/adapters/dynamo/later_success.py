"""A redriven run's later success (``Store.record_later_success``), in the launcher's table: a run
released on an earlier end (FAILED, TIMED_OUT or ABORTED) that Step Functions redrove ran again
without a slot or the lease, and SUCCEEDED. Its record and its key's success, in one transaction:

    EXEC#N         SET SUCCEEDED, ended_at, output   IF the end it was read with (one of two
                                                     completions of the same event writes it)
    PAYLOAD#<key>  SET succeeded_by (once_by, no expiry, for a run-once claim), and the receipt
                   while it is N's or the key has none; tried again without it; written afresh
                   where TTL took the record
    EFFECTS#N      PUT (when effects were sent before it)
"""

from __future__ import annotations

from typing import Any

from sluice.adapters.dynamo.codec import (
    effects_item,
    execution_pk,
    output_terms,
    payload_pk,
    refused,
    values,
)
from sluice.adapters.dynamo.table import TableRef
from sluice.core.model import EFFECTS_RETENTION_SECONDS, ExecutionRecord, PayloadState, record_expiry
from sluice.core.records import ReceiptOutput


def record_later_success(
    db: TableRef, record: ExecutionRecord, *, ended_at: float, now: float, receipt: ReceiptOutput | None
) -> bool:
    """``Store.record_later_success``: the record, conditioned on the end it was read with (so
    one of two completions of the same event writes it), and the key's success; the receipt
    too while it is still this execution's or the key has none, else tried again without it;
    the key's record written afresh when TTL took it (it lives ``retentionDays``, the
    execution's 15 days)."""
    for how in LATER_SUCCESS_WRITES:
        lease = _later_success_lease(db, record, now, how=how)
        items = [{"Update": _later_end(db, record, ended_at, now, receipt)}, {"Update": lease}]
        if receipt is not None and receipt.effects is not None:
            effects = effects_item(receipt.effects, expires_at=int(now) + EFFECTS_RETENTION_SECONDS)
            items.append({"Put": {"TableName": db.table, "Item": effects}})
        reasons = db.transact(items)
        if reasons is None:
            return True
        if refused(reasons[0]):
            return False
    return False


def _later_end(
    db: TableRef, record: ExecutionRecord, ended_at: float, now: float, receipt: ReceiptOutput | None
) -> dict[str, Any]:
    state = PayloadState.SUCCEEDED
    expires = record_expiry(state, now=now, retention_seconds=db.retention_seconds)
    named = values(state=state.value, ended=ended_at, expires=expires)
    named.update(values(was=record.state.value, was_ended=record.ended_at))
    names = {"#state": "state", "#error": "error", "#cause": "cause"}
    sets = "SET #state = :state, ended_at = :ended, expires_at = :expires"
    if receipt is not None:
        sets += output_terms(receipt, named, names)
    return {
        "TableName": db.table,
        "Key": {"pk": {"S": execution_pk(record.name)}},
        "UpdateExpression": sets + " REMOVE #error, #cause",
        "ConditionExpression": "#state = :was AND ended_at = :was_ended",
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": named,
    }


# A later success's write of PAYLOAD#<key>: with the receipt while it is the run's own, or while
# the key has none (TTL took its record, and a claim made it afresh: the success is its latest
# end); without it; written afresh where TTL took the record (and once more, should it reappear).
LATER_SUCCESS_WRITES = ("receipt", "unreceipted", "kept", "afresh", "kept")


def _later_success_lease(db: TableRef, record: ExecutionRecord, now: float, *, how: str) -> dict[str, Any]:
    """PAYLOAD#<key>'s update for a success recorded after its release: ``succeeded_by`` (and a
    run-once claim's ``once_by``, kept without expiry), the receipt only while it is this run's."""
    sets, removes = "SET succeeded_by = if_not_exists(succeeded_by, :name)", ""
    named = values(name=record.name, succeeded=PayloadState.SUCCEEDED.value)
    names: dict[str, str] = {}
    condition = "attribute_exists(pk)"
    if record.once:
        sets += ", once_by = if_not_exists(once_by, :name)"
        removes = " REMOVE expires_at"
    if how == "receipt":
        sets += ", receipt_state = :succeeded"
        condition += " AND receipt = :name"
    elif how == "unreceipted":
        sets += ", receipt = :name, receipt_state = :succeeded"
        condition += " AND attribute_not_exists(receipt)"
    elif how == "afresh":
        condition = "attribute_not_exists(pk)"
        sets += ", #key = :key, #state = :succeeded, receipt = :name, receipt_state = :succeeded"
        sets += ", updated_at = :now"
        named.update(values(key=record.key, now=now))
        names = {"#key": "key", "#state": "state"}
        if not record.once:
            sets += ", expires_at = :expires"
            named.update(values(expires=int(now) + db.retention_seconds))
    if ":succeeded" not in sets:
        del named[":succeeded"]
    update = {
        "TableName": db.table,
        "Key": {"pk": {"S": payload_pk(record.key)}},
        "UpdateExpression": sets + removes,
        "ConditionExpression": condition,
        "ExpressionAttributeValues": named,
    }
    if names:
        update["ExpressionAttributeNames"] = names
    return update
