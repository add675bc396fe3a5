"""Items of the Sluice table to and from records, and the table's definition."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from sluice.core.model import EffectsLog, ExecutionRecord, ParkedMessage, PayloadRecord, PayloadState
from sluice.core.records import ReceiptOutput

TTL_ATTRIBUTE = "expires_at"

_ser = TypeSerializer()
_de = TypeDeserializer()


def payload_pk(key: str) -> str:
    return f"PAYLOAD#{key}"


def execution_pk(name: str) -> str:
    return f"EXEC#{name}"


def effects_pk(name: str) -> str:
    return f"EFFECTS#{name}"


def effects_item(log: EffectsLog, *, expires_at: int) -> dict[str, Any]:
    return item(
        pk=effects_pk(log.name),
        name=log.name,
        key=log.key,
        count=log.count,
        sent=json.dumps(list(log.sent), ensure_ascii=False),
        rejected=json.dumps([list(r) for r in log.rejected], ensure_ascii=False),
        sent_at=log.sent_at,
        expires_at=expires_at,
    )


def to_effects(raw: dict[str, Any]) -> EffectsLog:
    return EffectsLog(
        name=str(raw["name"]),
        key=str(raw.get("key", "")),
        count=int(raw.get("count", 0)),
        sent=tuple(json.loads(raw.get("sent") or "[]")),
        rejected=tuple((int(i), str(r)) for i, r in json.loads(raw.get("rejected") or "[]")),
        sent_at=float(raw.get("sent_at", 0)),
    )


def park_pk(entry: str) -> str:
    return f"PARK#{entry}"


def create_table(client: Any, table_name: str) -> None:
    """The table as the stack defines it; for local runs and tests."""
    client.create_table(
        TableName=table_name,
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.update_time_to_live(
        TableName=table_name, TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE}
    )


def values(**named: Any) -> dict[str, Any]:
    return {f":{k}": _ser.serialize(_dynamo(v)) for k, v in named.items()}


def item(**named: Any) -> dict[str, Any]:
    return {k: _ser.serialize(_dynamo(v)) for k, v in named.items() if v is not None}


def plain(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: _de.deserialize(v) for k, v in raw.items()}


def _dynamo(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, list):
        return [_dynamo(v) for v in value]
    if isinstance(value, dict):
        return {k: _dynamo(v) for k, v in value.items()}
    return value


def opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def refused(reason: dict[str, Any]) -> bool:
    """A transaction's cancellation reason for one item: its condition failed."""
    return reason.get("Code") == "ConditionalCheckFailed"


def output_terms(receipt: ReceiptOutput, named: dict[str, Any], names: dict[str, str]) -> str:
    """EXEC#<name>'s SET clauses of the run's output (inline, or a pointer to it), with their values."""
    sets = ", output_size = :osize"
    named[":osize"] = {"N": str(receipt.size or 0)}
    if receipt.inline is not None:
        sets += ", #output = :output"
        named[":output"] = {"S": receipt.inline}
        names["#output"] = "output"
    if receipt.pointer is not None:
        sets += ", output_ref = :oref"
        named[":oref"] = {"S": receipt.pointer}
    return sets


def reasons_from_message(exc: ClientError, count: int) -> list[dict[str, Any]]:
    """Older servers put the reasons only in the message: "... [ConditionalCheckFailed, None]"."""
    message = str(exc.response.get("Error", {}).get("Message", ""))
    if "[" in message:
        codes = [c.strip() for c in message[message.rfind("[") + 1 : message.rfind("]")].split(",")]
        return [{"Code": c} for c in codes]
    return [{"Code": "Unknown"}] * count


def is_payload(raw: dict[str, Any] | None) -> bool:
    """A ``PAYLOAD#`` item that is a payload record: not only the ``awaited`` flag a waiter's park
    writes on a key never claimed yet (``sluice.adapters.dynamo.awaits``)."""
    return bool(raw) and bool(set(raw) - {"pk", "awaited"})  # type: ignore[arg-type]


def to_payload(raw: dict[str, Any], default_key: str = "") -> PayloadRecord:
    return PayloadRecord(
        key=str(raw.get("key", default_key)),
        state=PayloadState(raw.get("state", PayloadState.RELEASED.value)),
        holder=raw.get("holder"),
        executions=tuple(raw.get("executions", ())),
        attempts=int(raw.get("attempts", 0)),
        duplicates=int(raw.get("duplicates", 0)),
        updated_at=float(raw.get("updated_at", 0)),
        expires_at=int(raw.get("expires_at", 0)),
        reason=raw.get("reason"),
        receipt=raw.get("receipt"),
        succeeded_by=raw.get("succeeded_by"),
        already_done=int(raw.get("already_done", 0)),
        receipt_state=PayloadState(raw["receipt_state"]) if raw.get("receipt_state") else None,
        redriven=raw.get("redriven"),
        redriven_more=frozenset(raw.get("redriven_more") or ()),
        redriven_at=opt_float(raw.get("redriven_at")),
        redriven_by=raw.get("redriven_by") if isinstance(raw.get("redriven_by"), str) else None,
        once_by=raw.get("once_by"),
        once_unknown=raw.get("once_unknown"),
    )


def _sightings(raw: Any) -> tuple[tuple[str, float, float], ...]:
    """An adoption's sightings (clock → [the adoption's ``adopted_at``, when, by that clock]); none
    when absent (adopted by an older version)."""
    if not isinstance(raw, dict):
        return ()
    return tuple(
        sorted(
            (str(who), float(seen[0]), float(seen[1]))
            for who, seen in raw.items()
            if isinstance(seen, list) and len(seen) == 2
        )
    )


def to_execution(raw: dict[str, Any]) -> ExecutionRecord:
    return ExecutionRecord(
        name=str(raw["name"]),
        key=str(raw["key"]),
        message_id=str(raw.get("message_id", "")),
        state=PayloadState(raw["state"]),
        claimed_at=float(raw.get("claimed_at", 0)),
        claim_expires_at=float(raw.get("claim_expires_at", 0)),
        arn=raw.get("arn"),
        started_at=opt_float(raw.get("started_at")),
        ended_at=opt_float(raw.get("ended_at")),
        error=raw.get("error"),
        cause=raw.get("cause"),
        expires_at=int(raw.get("expires_at", 0)),
        claim_version=int(raw.get("claim_version", 0)),
        suspect_since=opt_float(raw.get("suspect_since")),
        suspect_by=raw.get("suspect_by"),
        parked=frozenset(raw.get("parked", ())),
        adopted_at=opt_float(raw.get("adopted_at")),
        adoptions=int(raw.get("adoptions", 0)),
        adoption_seen=_sightings(raw.get("adoption_seen")),
        earlier_end_at=opt_float(raw.get("earlier_end_at")),
        redriven_at=opt_float(raw.get("redriven_at")),
        blocked_by=raw.get("blocked_by"),
        starting_at=opt_float(raw.get("starting_at")),
        copy_id=raw.get("copy_id"),
        shard=None if raw.get("shard") is None else int(raw["shard"]),
        once=bool(raw.get("once", False)),
        output=raw.get("output"),
        output_ref=raw.get("output_ref"),
        output_size=None if raw.get("output_size") is None else int(raw["output_size"]),
        ckey=raw.get("ckey"),
        lane=raw.get("lane"),
        lane_shard=None if raw.get("lane_shard") is None else int(raw["lane_shard"]),
        outcome_unknown=bool(raw.get("outcome_unknown", False)),
    )


def parked_item(parked: ParkedMessage) -> dict[str, Any]:
    return item(
        pk=park_pk(parked.entry),
        message_id=parked.message_id,
        key=parked.key,
        holder=parked.holder,
        body=parked.body,
        group_id=parked.group_id,
        attributes=json.dumps(parked.attributes, sort_keys=True),
        parked_at=parked.parked_at,
        copy_id=parked.copy_id or None,
    )


def to_parked(raw: dict[str, Any]) -> ParkedMessage:
    return ParkedMessage(
        message_id=str(raw["message_id"]),
        key=str(raw["key"]),
        holder=str(raw["holder"]),
        body=str(raw["body"]),
        group_id=str(raw.get("group_id", "")),
        attributes=json.loads(raw.get("attributes") or "{}"),
        parked_at=float(raw.get("parked_at", 0)),
        copy_id=str(raw.get("copy_id", "")),
        by_message_id=raw["pk"] == park_pk(str(raw["message_id"])),
    )


def only_once(items: list[dict[str, Any]]) -> None:
    """Make a claim's items (``_claim_items``) those of a run-once message: the payload's update is
    refused when the key has SUCCEEDED already, or a run-once run of it has an unknown outcome
    (``once_unknown``), in the claim's own transaction (``sluice.features.receipts``), and the execution
    record remembers it."""
    update = items[1]["Update"]
    update["ConditionExpression"] = (
        f"({update['ConditionExpression']}) AND attribute_not_exists(succeeded_by)"
        " AND attribute_not_exists(once_unknown)"
    )
    items[2]["Put"]["Item"]["once"] = {"BOOL": True}
