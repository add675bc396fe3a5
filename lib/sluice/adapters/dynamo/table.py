"""Plumbing of the one Sluice table: consistent reads, conditional writes, transactions.

``TableRef`` is the table as each part of a store reaches it (the client, the table's name, the
retention of ended records, the sleep between retries): one frozen value, held by every part.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from sluice.adapters.dynamo.codec import plain, reasons_from_message
from sluice.adapters.errors import error_code, translated
from sluice.core.errors import ConditionFailed, TransientError

CONFLICT_RETRIES = 5
CONFLICT_BACKOFF = 0.02  # seconds, doubled per retry
DEFAULT_RETENTION = 30 * 86_400


@dataclass(frozen=True)
class TableRef:
    client: Any
    table: str
    retention_seconds: int = DEFAULT_RETENTION
    sleep: Callable[[float], None] = time.sleep

    def get(self, pk: str) -> dict[str, Any] | None:
        with translated("GetItem"):
            raw = self.client.get_item(TableName=self.table, Key={"pk": {"S": pk}}, ConsistentRead=True).get(
                "Item"
            )
        return plain(raw) if raw else None

    def batch_get(self, pks: list[str]) -> list[dict[str, Any]]:
        pending = [{"pk": {"S": pk}} for pk in pks]
        found: list[dict[str, Any]] = []
        while pending:
            chunk, pending = pending[:100], pending[100:]
            request: dict[str, Any] = {self.table: {"Keys": chunk, "ConsistentRead": True}}
            while request:
                with translated("BatchGetItem"):
                    response = self.client.batch_get_item(RequestItems=request)
                found.extend(plain(raw) for raw in response.get("Responses", {}).get(self.table, []))
                request = response.get("UnprocessedKeys") or {}
        return found

    def update_if(
        self,
        pk: str,
        expression: str,
        condition: str,
        named_values: dict[str, Any],
        names: dict[str, str] | None = None,
    ) -> bool:
        """One conditional UpdateItem. False when the condition failed."""
        request: dict[str, Any] = {
            "TableName": self.table,
            "Key": {"pk": {"S": pk}},
            "UpdateExpression": expression,
            "ConditionExpression": condition,
        }
        if named_values:
            request["ExpressionAttributeValues"] = named_values
        names = {"#state": "state"} if names is None else names
        if names:
            request["ExpressionAttributeNames"] = names
        try:
            with translated("UpdateItem"):
                self.client.update_item(**request)
        except ConditionFailed:
            return False
        return True

    def update(self, pk: str, expression: str, named_values: dict[str, Any], **more: Any) -> dict[str, Any]:
        """One unconditional UpdateItem (``more``: ExpressionAttributeNames, ReturnValues…)."""
        with translated("UpdateItem"):
            return self.client.update_item(
                TableName=self.table,
                Key={"pk": {"S": pk}},
                UpdateExpression=expression,
                ExpressionAttributeValues=named_values,
                **more,
            )

    def transact(self, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """Run a transaction. None when it committed; the cancellation reasons when a condition failed.

        Conflicts with another writer are asked again with backoff through the injected ``sleep``.
        """
        operation = "TransactWriteItems"
        for attempt in range(CONFLICT_RETRIES):
            with translated(operation):
                try:
                    self.client.transact_write_items(TransactItems=items)
                    return None
                except ClientError as exc:
                    if error_code(exc) != "TransactionCanceledException":
                        raise
                    reasons = exc.response.get("CancellationReasons") or reasons_from_message(exc, len(items))
            codes = {r.get("Code") for r in reasons}
            if "ConditionalCheckFailed" in codes:
                return reasons
            retryable = codes & {"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded"}
            if not retryable or attempt + 1 == CONFLICT_RETRIES:
                raise TransientError(
                    f"{operation} cancelled: {sorted(c for c in codes if c)}",
                    operation=operation,
                    code="TransactionCanceledException",
                )
            self.sleep(CONFLICT_BACKOFF * 2**attempt)  # another writer held an item for a moment
        raise AssertionError("unreachable")


class Table:
    """The plumbing as methods, for the slot pools, the leases and the semaphore store."""

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        retention_seconds: int = DEFAULT_RETENTION,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.db = TableRef(client, table_name, retention_seconds, sleep)
        self.client = client
        self.table = table_name
        self.retention_seconds = retention_seconds
        self.sleep = sleep

    def _get(self, pk: str) -> dict[str, Any] | None:
        return self.db.get(pk)

    def _batch_get(self, pks: list[str]) -> list[dict[str, Any]]:
        return self.db.batch_get(pks)

    def _update_if(
        self,
        pk: str,
        expression: str,
        condition: str,
        named_values: dict[str, Any],
        names: dict[str, str] | None = None,
    ) -> bool:
        return self.db.update_if(pk, expression, condition, named_values, names)

    def _transact(self, items: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        return self.db.transact(items)
