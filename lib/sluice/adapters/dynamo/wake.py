"""The woken launchers' turn (``sluice.features.wake``) in the ledger table: the item ``WAKE``.

    take       PutItem    IF attribute_not_exists(pk) OR expires_at <= :now OR holder = :me
    note       UpdateItem SET again = true    IF expires_at > :now + margin
    again      UpdateItem SET again = false   IF holder = :me
    give back  DeleteItem IF holder = :me AND again = false   (IF holder = :me when the invocation fails)

``expires_at`` is the table's TTL attribute: a turn never given back (its holder crashed) is deleted
by DynamoDB some time after it ended; until then the conditions judge it ended.
"""

from __future__ import annotations

from typing import Any

from sluice.adapters.dynamo.codec import item
from sluice.adapters.dynamo.table import TableRef
from sluice.adapters.errors import translated
from sluice.core.errors import ConditionFailed

WAKE_PK = "WAKE"
KEY = {"pk": {"S": WAKE_PK}}


class DynamoWakeTurns:
    """``WakeTurns`` on the ledger table."""

    def __init__(self, db: TableRef) -> None:
        self.db = db

    def take(self, holder: str, *, now: float, expires_at: float) -> bool:
        return self._conditional(
            "PutItem",
            Item=item(pk=WAKE_PK, holder=holder, again=False, expires_at=int(expires_at) + 1),
            ConditionExpression="attribute_not_exists(pk) OR expires_at <= :now OR holder = :me",
            ExpressionAttributeValues={":now": {"N": str(int(now))}, ":me": {"S": holder}},
        )

    def note(self, *, now: float, margin: float = 0.0) -> bool:
        values = {":yes": {"BOOL": True}, ":now": {"N": str(int(now + margin))}}
        return self.db.update_if(WAKE_PK, "SET again = :yes", "expires_at > :now", values, {})

    def again(self, holder: str) -> bool:
        return self.db.update_if(
            WAKE_PK, "SET again = :no", "holder = :me", {":no": {"BOOL": False}, ":me": {"S": holder}}, {}
        )

    def give_back(self, holder: str, *, noted_or_not: bool = False) -> bool:
        values: dict[str, Any] = {":me": {"S": holder}}
        condition = "holder = :me"
        if not noted_or_not:
            condition += " AND again = :no"
            values[":no"] = {"BOOL": False}
        return self._conditional(
            "DeleteItem", Key=KEY, ConditionExpression=condition, ExpressionAttributeValues=values
        )

    def _conditional(self, operation: str, **request: Any) -> bool:
        call = self.db.client.put_item if operation == "PutItem" else self.db.client.delete_item
        try:
            with translated(operation):
                call(TableName=self.db.table, **request)
        except ConditionFailed:
            return False
        return True
