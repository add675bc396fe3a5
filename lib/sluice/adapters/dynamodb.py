"""The ledger, payload leases and execution records in one DynamoDB table (partition key ``pk``).

    LEDGER            holders (string set of execution names holding a slot), external, drift
    PAYLOAD#<key>     the lease (holder), latest state, execution names, attempts, duplicates
    EXEC#<name>       one claim / execution: key, message id, state, times, ARN, error

A claim is one TransactWriteItems over LEDGER, PAYLOAD#<key> and EXEC#<name>:

    LEDGER          ADD holders {name}   IF holders absent OR (size(holders) < limit AND NOT contains)
    PAYLOAD#<key>   SET holder = name    IF holder absent          (ALL_OLD returned on failure)
    EXEC#<name>     PUT CLAIMED, claim_expires_at

and a release is the mirror image, conditional on ``name`` still holding both. Two launchers
claiming the last slot at once: DynamoDB serialises the transactions, one condition fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from sluice.adapters.errors import error_code, translate_client_error, translated
from sluice.errors import LeaseHeld, SlotsFull, TransientError
from sluice.model import ExecutionRecord, Ledger, PayloadRecord, PayloadState, StartedExecution

LEDGER_PK = "LEDGER"
LIVE = (PayloadState.CLAIMED.value, PayloadState.RUNNING.value)
CONFLICT_RETRIES = 5
MARKS_PER_TRANSACTION = 50  # two items each; TransactWriteItems takes 100
TTL_ATTRIBUTE = "expires_at"

_ser = TypeSerializer()
_de = TypeDeserializer()


def payload_pk(key: str) -> str:
    return f"PAYLOAD#{key}"


def execution_pk(name: str) -> str:
    return f"EXEC#{name}"


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


class DynamoStore:
    def __init__(self, client: Any, table_name: str) -> None:
        self.client = client
        self.table = table_name

    # -- reads ---------------------------------------------------------------------------------

    def ledger(self) -> Ledger:
        item = self._get(LEDGER_PK)
        if item is None:
            return Ledger()
        return Ledger(
            holders=frozenset(item.get("holders", ())),
            external=int(item.get("external", 0)),
            reconciled_at=_float(item.get("reconciled_at")),
            drift=int(item.get("drift", 0)),
        )

    def payload(self, key: str) -> PayloadRecord | None:
        item = self._get(payload_pk(key))
        return _payload(item) if item else None

    def execution(self, name: str) -> ExecutionRecord | None:
        item = self._get(execution_pk(name))
        return _execution(item) if item else None

    def executions(self, names: Iterable[str]) -> dict[str, ExecutionRecord]:
        pending = [{"pk": {"S": execution_pk(n)}} for n in sorted(set(names))]
        found: dict[str, ExecutionRecord] = {}
        while pending:
            chunk, pending = pending[:100], pending[100:]
            request: dict[str, Any] = {self.table: {"Keys": chunk, "ConsistentRead": True}}
            while request:
                with translated("BatchGetItem"):
                    response = self.client.batch_get_item(RequestItems=request)
                for raw in response.get("Responses", {}).get(self.table, []):
                    record = _execution(_plain(raw))
                    found[record.name] = record
                request = response.get("UnprocessedKeys") or {}
        return found

    # -- the claim ------------------------------------------------------------------------------

    def claim(
        self,
        *,
        key: str,
        name: str,
        message_id: str,
        limit: int,
        now: float,
        claim_expires_at: float,
        expires_at: int,
    ) -> None:
        if limit <= 0:
            # "holders absent" would admit into an empty ledger: never ask with no slot to give.
            raise SlotsFull(limit)
        items = [
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": LEDGER_PK}},
                    "UpdateExpression": "ADD holders :names",
                    "ConditionExpression": (
                        "attribute_not_exists(holders) OR (size(holders) < :limit AND NOT contains(holders, :name))"
                    ),
                    "ExpressionAttributeValues": {
                        ":names": {"SS": [name]},
                        ":limit": {"N": str(limit)},
                        ":name": {"S": name},
                    },
                }
            },
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": payload_pk(key)}},
                    "UpdateExpression": (
                        "SET #key = :key, #state = :claimed, holder = :name, updated_at = :now, "
                        "expires_at = :expires, executions = list_append(if_not_exists(executions, :empty), :list) "
                        "ADD attempts :one REMOVE reason"
                    ),
                    "ConditionExpression": "attribute_not_exists(holder)",
                    "ExpressionAttributeNames": {"#key": "key", "#state": "state"},
                    "ExpressionAttributeValues": _values(
                        key=key,
                        claimed=PayloadState.CLAIMED.value,
                        name=name,
                        now=now,
                        expires=expires_at,
                        empty=[],
                        list=[name],
                        one=1,
                    ),
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            },
            {
                "Put": {
                    "TableName": self.table,
                    "Item": _item(
                        pk=execution_pk(name),
                        name=name,
                        key=key,
                        message_id=message_id,
                        state=PayloadState.CLAIMED.value,
                        claimed_at=now,
                        claim_expires_at=claim_expires_at,
                        expires_at=expires_at,
                    ),
                }
            },
        ]
        reasons = self._transact(items, "TransactWriteItems(claim)")
        if reasons is None:
            return
        ledger_reason, lease_reason = reasons[0], reasons[1]
        if lease_reason.get("Code") == "ConditionalCheckFailed":
            raise LeaseHeld(_payload(_plain(lease_reason.get("Item", {})), default_key=key))
        if ledger_reason.get("Code") == "ConditionalCheckFailed":
            raise SlotsFull(limit)
        raise TransientError(f"claim cancelled: {reasons}", operation="TransactWriteItems", code="Cancelled")

    def mark_running(self, *, key: str, name: str, arn: str, started_at: float, now: float) -> bool:
        items = self._mark_items(StartedExecution(key, name, arn, started_at), now)
        return self._transact(items, "TransactWriteItems(mark)") is None

    def mark_running_many(self, started: Sequence[StartedExecution], *, now: float) -> int:
        if len(started) == 1:
            s = started[0]
            return int(self.mark_running(key=s.key, name=s.name, arn=s.arn, started_at=s.started_at, now=now))
        marked = 0
        for i in range(0, len(started), MARKS_PER_TRANSACTION):
            chunk = started[i : i + MARKS_PER_TRANSACTION]
            items = [item for s in chunk for item in self._mark_items(s, now)]
            if self._transact(items, "TransactWriteItems(mark)") is None:
                marked += len(chunk)
                continue
            # One of them ended (and was released) before we marked it: mark the others one by one.
            marked += sum(
                self.mark_running(key=s.key, name=s.name, arn=s.arn, started_at=s.started_at, now=now)
                for s in chunk
            )
        return marked

    def _mark_items(self, s: StartedExecution, now: float) -> list[dict[str, Any]]:
        return [
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": payload_pk(s.key)}},
                    "UpdateExpression": "SET #state = :running, updated_at = :now",
                    "ConditionExpression": "holder = :name",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": _values(
                        running=PayloadState.RUNNING.value, now=now, name=s.name
                    ),
                }
            },
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": execution_pk(s.name)}},
                    "UpdateExpression": "SET #state = :running, arn = :arn, started_at = :started",
                    "ConditionExpression": "#state = :claimed",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": _values(
                        running=PayloadState.RUNNING.value,
                        arn=s.arn,
                        started=s.started_at,
                        claimed=PayloadState.CLAIMED.value,
                    ),
                }
            },
        ]

    # -- the release ------------------------------------------------------------------------------

    def release(
        self,
        *,
        name: str,
        state: PayloadState,
        now: float,
        error: str | None = None,
        cause: str | None = None,
        ended_at: float | None = None,
    ) -> ExecutionRecord | None:
        record = self.execution(name)
        if record is None or not record.state.holds_lease:
            return None
        payload_set = "SET #state = :state, updated_at = :now"
        exec_set = "SET #state = :state, ended_at = :ended"
        payload_values = _values(state=state.value, now=now, name=name)
        exec_values = _values(
            state=state.value, ended=ended_at if ended_at is not None else now, live0=LIVE[0], live1=LIVE[1]
        )
        if error:
            payload_set += ", reason = :reason"
            payload_values[":reason"] = {"S": error}
            exec_set += ", #error = :error"
            exec_values[":error"] = {"S": error}
        if cause:
            exec_set += ", #cause = :cause"
            exec_values[":cause"] = {"S": cause[:4_000]}
        items = [
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": LEDGER_PK}},
                    "UpdateExpression": "DELETE holders :names",
                    "ConditionExpression": "contains(holders, :name)",
                    "ExpressionAttributeValues": {":names": {"SS": [name]}, ":name": {"S": name}},
                }
            },
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": payload_pk(record.key)}},
                    "UpdateExpression": payload_set + " REMOVE holder",
                    "ConditionExpression": "holder = :name",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": payload_values,
                }
            },
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": execution_pk(name)}},
                    "UpdateExpression": exec_set,
                    "ConditionExpression": "#state IN (:live0, :live1)",
                    "ExpressionAttributeNames": {
                        "#state": "state",
                        **({"#error": "error"} if error else {}),
                        **({"#cause": "cause"} if cause else {}),
                    },
                    "ExpressionAttributeValues": exec_values,
                }
            },
        ]
        if self._transact(items, "TransactWriteItems(release)") is not None:
            return None  # someone released it first
        return record

    # -- small records ----------------------------------------------------------------------------

    def record_duplicate(self, *, key: str, message_id: str, now: float) -> None:
        with translated("UpdateItem"):
            self.client.update_item(
                TableName=self.table,
                Key={"pk": {"S": payload_pk(key)}},
                UpdateExpression="SET updated_at = :now, last_duplicate = :mid ADD duplicates :one",
                ExpressionAttributeValues=_values(now=now, mid=message_id, one=1),
            )

    def record_invalid(self, *, key: str, reason: str, now: float, expires_at: int) -> None:
        try:
            with translated("UpdateItem"):
                self.client.update_item(
                    TableName=self.table,
                    Key={"pk": {"S": payload_pk(key)}},
                    UpdateExpression=(
                        "SET #key = :key, #state = :invalid, reason = :reason, updated_at = :now, expires_at = :exp"
                    ),
                    # A live lease keeps its state: the running payload is not the invalid message.
                    ConditionExpression="attribute_not_exists(holder)",
                    ExpressionAttributeNames={"#key": "key", "#state": "state"},
                    ExpressionAttributeValues=_values(
                        key=key, invalid=PayloadState.INVALID.value, reason=reason, now=now, exp=expires_at
                    ),
                )
        except Exception as exc:
            if not _is_condition_failure(exc.__cause__):
                raise

    def save_reconciliation(self, *, external: int, drift: int, now: float) -> None:
        with translated("UpdateItem"):
            self.client.update_item(
                TableName=self.table,
                Key={"pk": {"S": LEDGER_PK}},
                UpdateExpression="SET #external = :external, drift = :drift, reconciled_at = :now",
                ExpressionAttributeNames={"#external": "external"},
                ExpressionAttributeValues=_values(external=external, drift=drift, now=now),
            )

    # -- plumbing ---------------------------------------------------------------------------------

    def _get(self, pk: str) -> dict[str, Any] | None:
        with translated("GetItem"):
            item = self.client.get_item(TableName=self.table, Key={"pk": {"S": pk}}, ConsistentRead=True).get(
                "Item"
            )
        return _plain(item) if item else None

    def _transact(self, items: list[dict[str, Any]], operation: str) -> list[dict[str, Any]] | None:
        """Run a transaction. None when it committed; the cancellation reasons when a condition failed."""
        for attempt in range(CONFLICT_RETRIES):
            try:
                self.client.transact_write_items(TransactItems=items)
                return None
            except ClientError as exc:
                if error_code(exc) != "TransactionCanceledException":
                    raise translate_client_error(exc, operation) from exc
                reasons = exc.response.get("CancellationReasons") or _reasons_from_message(exc, len(items))
                codes = {r.get("Code") for r in reasons}
                if "ConditionalCheckFailed" in codes:
                    return reasons
                retryable = codes & {
                    "TransactionConflict",
                    "ThrottlingError",
                    "ProvisionedThroughputExceeded",
                }
                if retryable and attempt + 1 < CONFLICT_RETRIES:
                    continue  # another writer held an item for a moment: ask again
                raise TransientError(
                    f"{operation} cancelled: {sorted(c for c in codes if c)}",
                    operation=operation,
                    code="TransactionCanceledException",
                ) from exc
        raise AssertionError("unreachable")


def _reasons_from_message(exc: ClientError, count: int) -> list[dict[str, Any]]:
    """Older servers put the reasons only in the message: "... [ConditionalCheckFailed, None]"."""
    message = str(exc.response.get("Error", {}).get("Message", ""))
    if "[" in message:
        codes = [c.strip() for c in message[message.rfind("[") + 1 : message.rfind("]")].split(",")]
        return [{"Code": c} for c in codes]
    return [{"Code": "Unknown"}] * count


def _is_condition_failure(exc: BaseException | None) -> bool:
    return isinstance(exc, ClientError) and error_code(exc) == "ConditionalCheckFailedException"


def _values(**values: Any) -> dict[str, Any]:
    return {f":{k}": _ser.serialize(_dynamo(v)) for k, v in values.items()}


def _item(**values: Any) -> dict[str, Any]:
    return {k: _ser.serialize(_dynamo(v)) for k, v in values.items() if v is not None}


def _dynamo(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(repr(value))
    if isinstance(value, list):
        return [_dynamo(v) for v in value]
    return value


def _plain(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _de.deserialize(v) for k, v in item.items()}


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _payload(item: dict[str, Any], default_key: str = "") -> PayloadRecord:
    return PayloadRecord(
        key=str(item.get("key", default_key)),
        state=PayloadState(item.get("state", PayloadState.RELEASED.value)),
        holder=item.get("holder"),
        executions=tuple(item.get("executions", ())),
        attempts=int(item.get("attempts", 0)),
        duplicates=int(item.get("duplicates", 0)),
        updated_at=float(item.get("updated_at", 0)),
        expires_at=int(item.get("expires_at", 0)),
        reason=item.get("reason"),
    )


def _execution(item: dict[str, Any]) -> ExecutionRecord:
    return ExecutionRecord(
        name=str(item["name"]),
        key=str(item["key"]),
        message_id=str(item.get("message_id", "")),
        state=PayloadState(item["state"]),
        claimed_at=float(item.get("claimed_at", 0)),
        claim_expires_at=float(item.get("claim_expires_at", 0)),
        arn=item.get("arn"),
        started_at=_float(item.get("started_at")),
        ended_at=_float(item.get("ended_at")),
        error=item.get("error"),
        cause=item.get("cause"),
        expires_at=int(item.get("expires_at", 0)),
    )
