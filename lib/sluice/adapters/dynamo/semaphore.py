"""The semaphore's records (``sluice.semaphore.step``) in the Sluice table (partition key ``pk`` only).

    SEMA#<name>#<holder>   the acquisition: semaphore, execution_arn, acquisition_id, token, gen, state,
                           ticket, requested_at; granted_at, delivered_at, delivery; released_at, reason
                           and expires_at (TTL) once RELEASED
    SEMQ#<name>            the line: head (last ticket served), tail (last ticket issued)
    SEMW#<name>#<n>        ticket n: holder, gen, execution_arn, acquisition_id, enqueued_at, expires_at;
                           a tombstone (a ticket passed over before its item came): tombstone, expires_at
    SEMHELD#<hash>         per execution (``holder`` up to the colon): execution_arn, entries (a string
                           set of ``<name>|<acquisition id>``)
    SLOTS#sem:<name>[#i]   the permits (``sluice.adapters.dynamo.slots``)

Each step is one conditional write or one transaction:

    take_ticket  SET head = if_not_exists(head, 0) ADD tail 1                 → the new tail
    open         TransactWriteItems  Put SEMW#n        IF attribute_not_exists(pk)
                                     Put SEMA          IF attribute_not_exists(pk)
                                                          OR (state = RELEASED AND gen = :previous)
                                     Update SEMHELD    ADD entries
    refresh      SET token                             IF gen AND state <> RELEASED
    grant        SET state = GRANTED, granted_at       IF gen AND state = WAITING AND ticket = :n
    ungrant      SET state = WAITING REMOVE granted_at  IF gen AND state = GRANTED AND granted_at = :mine
    take_over    SET granted_at = :now                 IF gen AND state = GRANTED AND granted_at = :old
                                                          AND attribute_not_exists(delivered_at)
    delivered    SET delivered_at, delivery            IF gen AND state = GRANTED
    end          SET state = RELEASED, released_at, reason, expires_at
                                                       IF gen AND state <> RELEASED [AND token AND granted_at]
    free         TransactWriteItems  [slot release (dynamo_slots.release_item)]
                                     Update SEMHELD    DELETE entries
                                     ConditionCheck    SEMA state = RELEASED
                 then DeleteItem SEMHELD IF attribute_not_exists(entries)  (the execution holds nothing)
    advance      SET head = :n IF head = :n - 1; then DeleteItem SEMW#n when the ticket was served
    tombstone    Put SEMW#n IF attribute_not_exists(pk)

A ticket item keeps an expiry of ``TICKET_TTL`` (a standard workflow waits at most a year); a served
ticket is deleted at once, a tombstone stays until it expires so that a late ``open`` of that ticket
fails instead of landing behind the head.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from sluice.adapters.dynamo.codec import item, plain, values
from sluice.adapters.dynamo.slots import DynamoSlots, release_item
from sluice.adapters.dynamo.table import DEFAULT_RETENTION, Table
from sluice.adapters.errors import translated
from sluice.core.errors import ConditionFailed
from sluice.primitives.slots import DEFAULT_PER_SHARD
from sluice.semaphore.model import (
    Acquisition,
    Freed,
    Opened,
    State,
    Ticket,
    acquisition_of,
    check_name,
    execution_hash,
    pool_of,
)

__all__ = [
    "TICKET_TTL",
    "DynamoSemaphoreStore",
    "acquisition_pk",
    "held_pk",
    "line_pk",
    "ticket_pk",
    "to_acquisition",
]

TICKET_TTL = 400 * 86_400
_PLACEHOLDER = re.compile(r"#\w+")


def acquisition_pk(name: str, holder: str) -> str:
    return f"SEMA#{check_name(name)}#{holder}"


def line_pk(name: str) -> str:
    return f"SEMQ#{check_name(name)}"


def ticket_pk(name: str, number: int) -> str:
    return f"SEMW#{check_name(name)}#{number}"


def held_pk(holder: str) -> str:
    return f"SEMHELD#{holder.partition(':')[0]}"


def _entry(name: str, holder: str) -> str:
    return f"{name}|{acquisition_of(holder)}"


def _opt(raw: dict[str, Any], key: str) -> float | None:
    value = raw.get(key)
    return None if value is None else float(value)


def to_acquisition(raw: dict[str, Any] | None) -> Acquisition | None:
    if not raw:
        return None
    return Acquisition(
        semaphore=str(raw["semaphore"]),
        execution_arn=str(raw["execution_arn"]),
        acquisition_id=str(raw["acquisition_id"]),
        token=str(raw["token"]),
        gen=int(raw["gen"]),
        state=State(raw["state"]),
        ticket=int(raw.get("ticket", 0)),
        requested_at=float(raw.get("requested_at", 0)),
        granted_at=_opt(raw, "granted_at"),
        delivered_at=_opt(raw, "delivered_at"),
        released_at=_opt(raw, "released_at"),
        reason=raw.get("reason"),
    )


def to_ticket(name: str, number: int, raw: dict[str, Any] | None) -> Ticket | None:
    if not raw:
        return None
    if raw.get("tombstone"):
        return Ticket(name, number)
    return Ticket(
        semaphore=name,
        number=number,
        holder=str(raw["holder"]),
        gen=int(raw["gen"]),
        execution_arn=str(raw["execution_arn"]),
        acquisition_id=str(raw["acquisition_id"]),
        enqueued_at=float(raw.get("enqueued_at", 0)),
    )


def _names(*expressions: str) -> dict[str, str]:
    """The attribute-name placeholders the expressions use (DynamoDB refuses unused ones)."""
    found = {p for e in expressions for p in _PLACEHOLDER.findall(e)}
    return {p: p[1:] for p in sorted(found)}


class DynamoSemaphoreStore(Table):
    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        retention_seconds: int = DEFAULT_RETENTION,
        per_shard: int = DEFAULT_PER_SHARD,
        rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(client, table_name, retention_seconds=retention_seconds, sleep=sleep)
        self.slots = DynamoSlots(client, table_name, per_shard=per_shard, rng=rng, sleep=sleep)

    # -- plumbing ---------------------------------------------------------------------------------

    def _write(
        self, pk: str, expression: str, condition: str, named: dict[str, Any], *, returning: bool = False
    ) -> dict[str, Any] | None:
        """One conditional UpdateItem: the item after it (``returning``) or ``{}``; None when refused."""
        request: dict[str, Any] = {
            "TableName": self.table,
            "Key": {"pk": {"S": pk}},
            "UpdateExpression": expression,
            "ConditionExpression": condition,
            "ExpressionAttributeValues": values(**named),
        }
        names = _names(expression, condition)
        if names:
            request["ExpressionAttributeNames"] = names
        if returning:
            request["ReturnValues"] = "ALL_NEW"
        try:
            with translated("UpdateItem"):
                answer = self.client.update_item(**request)
        except ConditionFailed:
            return None
        return plain(answer.get("Attributes") or {})

    def _record(
        self, name: str, holder: str, expression: str, condition: str, **named: Any
    ) -> Acquisition | None:
        return to_acquisition(
            self._write(acquisition_pk(name, holder), expression, condition, named, returning=True)
        )

    # -- records ------------------------------------------------------------------------------------

    def acquisition(self, name: str, holder: str) -> Acquisition | None:
        return to_acquisition(self._get(acquisition_pk(name, holder)))

    def acquisitions(self, name: str, holders: Sequence[str]) -> dict[str, Acquisition]:
        if not holders:
            return {}
        found = (to_acquisition(raw) for raw in self._batch_get([acquisition_pk(name, h) for h in holders]))
        return {a.holder: a for a in found if a is not None}

    def open(self, acquisition: Acquisition, previous_gen: int | None, now: float) -> Opened:
        a = acquisition
        name, holder = a.semaphore, a.holder
        if previous_gen is None:
            record_condition: dict[str, Any] = {"ConditionExpression": "attribute_not_exists(pk)"}
        else:
            record_condition = {
                "ConditionExpression": "#state = :released AND #gen = :previous",
                "ExpressionAttributeNames": {"#state": "state", "#gen": "gen"},
                "ExpressionAttributeValues": values(released=State.RELEASED.value, previous=previous_gen),
            }
        fields = {
            "semaphore": name,
            "execution_arn": a.execution_arn,
            "acquisition_id": a.acquisition_id,
            "gen": a.gen,
        }
        ticket = item(
            pk=ticket_pk(name, a.ticket),
            holder=holder,
            enqueued_at=now,
            expires_at=int(now) + TICKET_TTL,
            **fields,
        )
        record = item(
            pk=acquisition_pk(name, holder),
            token=a.token,
            state=a.state.value,
            ticket=a.ticket,
            requested_at=a.requested_at,
            **fields,
        )
        index = {
            "TableName": self.table,
            "Key": {"pk": {"S": held_pk(holder)}},
            "UpdateExpression": "ADD entries :entry SET execution_arn = :arn",
            "ExpressionAttributeValues": values(entry={_entry(name, holder)}, arn=a.execution_arn),
        }
        reasons = self._transact(
            [
                {
                    "Put": {
                        "TableName": self.table,
                        "Item": ticket,
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {"Put": {"TableName": self.table, "Item": record, **record_condition}},
                {"Update": index},
            ]
        )
        if reasons is None:
            return Opened.OPENED
        if len(reasons) > 1 and reasons[1].get("Code") == "ConditionalCheckFailed":
            return Opened.RECORD_CHANGED
        return Opened.TICKET_TAKEN

    def refresh(self, name: str, holder: str, gen: int, token: str) -> Acquisition | None:
        return self._record(
            name,
            holder,
            "SET #token = :token",
            "#gen = :gen AND #state <> :released",
            token=token,
            gen=gen,
            released=State.RELEASED.value,
        )

    def grant(self, name: str, holder: str, gen: int, ticket: int, now: float) -> Acquisition | None:
        return self._record(
            name,
            holder,
            "SET #state = :granted, granted_at = :now",
            "#gen = :gen AND #state = :waiting AND #ticket = :ticket",
            granted=State.GRANTED.value,
            now=now,
            gen=gen,
            waiting=State.WAITING.value,
            ticket=ticket,
        )

    def ungrant(self, name: str, holder: str, gen: int, granted_at: float) -> bool:
        answer = self._write(
            acquisition_pk(name, holder),
            "SET #state = :waiting REMOVE granted_at",
            "#gen = :gen AND #state = :granted AND granted_at = :mine",
            {"waiting": State.WAITING.value, "gen": gen, "granted": State.GRANTED.value, "mine": granted_at},
        )
        return answer is not None

    def take_over(
        self, name: str, holder: str, gen: int, granted_at: float, now: float
    ) -> Acquisition | None:
        return self._record(
            name,
            holder,
            "SET granted_at = :now",
            "#gen = :gen AND #state = :granted AND granted_at = :old AND attribute_not_exists(delivered_at)",
            now=now,
            gen=gen,
            granted=State.GRANTED.value,
            old=granted_at,
        )

    def delivered(self, name: str, holder: str, gen: int, now: float, *, sure: bool) -> None:
        self._write(
            acquisition_pk(name, holder),
            "SET delivered_at = :now, delivery = :how",
            "#gen = :gen AND #state = :granted",
            {"now": now, "how": "sure" if sure else "unsure", "gen": gen, "granted": State.GRANTED.value},
        )

    def end(
        self,
        name: str,
        holder: str,
        gen: int,
        now: float,
        reason: str,
        *,
        token: str | None = None,
        granted_at: float | None = None,
    ) -> bool:
        condition = "#gen = :gen AND #state <> :released"
        named: dict[str, Any] = {
            "released": State.RELEASED.value,
            "now": now,
            "why": reason,
            "ttl": int(now) + self.retention_seconds,
            "gen": gen,
        }
        if token is not None:
            condition += " AND #token = :token"
            named["token"] = token
        if granted_at is not None:
            condition += " AND granted_at = :granted_at"
            named["granted_at"] = granted_at
        expression = "SET #state = :released, released_at = :now, #reason = :why, expires_at = :ttl"
        return self._write(acquisition_pk(name, holder), expression, condition, named) is not None

    def free(self, name: str, holder: str, shard: int | None) -> Freed:
        items: list[dict[str, Any]] = []
        if shard is not None:
            items.append(release_item(self.table, pool_of(name), shard, holder))
        items.append(
            {
                "Update": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": held_pk(holder)}},
                    "UpdateExpression": "DELETE entries :entry",
                    "ExpressionAttributeValues": values(entry={_entry(name, holder)}),
                }
            }
        )
        items.append(
            {
                "ConditionCheck": {
                    "TableName": self.table,
                    "Key": {"pk": {"S": acquisition_pk(name, holder)}},
                    "ConditionExpression": "#state = :released",
                    "ExpressionAttributeNames": {"#state": "state"},
                    "ExpressionAttributeValues": values(released=State.RELEASED.value),
                }
            }
        )
        reasons = self._transact(items)
        if reasons is None:
            self._forget_index(holder)
            return Freed.FREED
        if reasons[-1].get("Code") == "ConditionalCheckFailed":
            return Freed.NOT_RELEASED
        return Freed.MOVED

    def _forget_index(self, holder: str) -> None:
        try:
            with translated("DeleteItem"):
                self.client.delete_item(
                    TableName=self.table,
                    Key={"pk": {"S": held_pk(holder)}},
                    ConditionExpression="attribute_not_exists(entries)",
                )
        except ConditionFailed:
            pass  # the execution holds or waits for something else

    def held_by(self, execution_arn: str) -> list[tuple[str, str]]:
        raw = self._get(f"SEMHELD#{execution_hash(execution_arn)}") or {}
        pairs = (str(e).partition("|") for e in raw.get("entries") or ())
        return sorted((name, acquisition_id) for name, _, acquisition_id in pairs)

    # -- the line -----------------------------------------------------------------------------------

    def take_ticket(self, name: str) -> int:
        with translated("UpdateItem"):
            answer = self.client.update_item(
                TableName=self.table,
                Key={"pk": {"S": line_pk(name)}},
                UpdateExpression="SET #head = if_not_exists(#head, :zero) ADD #tail :one",
                ExpressionAttributeNames={"#head": "head", "#tail": "tail"},
                ExpressionAttributeValues=values(zero=0, one=1),
                ReturnValues="UPDATED_NEW",
            )
        return int(plain(answer["Attributes"])["tail"])

    def line(self, name: str) -> tuple[int, int]:
        raw = self._get(line_pk(name)) or {}
        return int(raw.get("head", 0)), int(raw.get("tail", 0))

    def ticket(self, name: str, number: int) -> Ticket | None:
        return to_ticket(name, number, self._get(ticket_pk(name, number)))

    def tickets(self, name: str, first: int, last: int) -> list[Ticket]:
        if last < first:
            return []
        raws = self._batch_get([ticket_pk(name, n) for n in range(first, last + 1)])
        found = [to_ticket(name, int(str(r["pk"]).rsplit("#", 1)[1]), r) for r in raws]
        return sorted((t for t in found if t is not None), key=lambda t: t.number)

    def tombstone(self, name: str, number: int, now: float) -> bool:
        try:
            with translated("PutItem"):
                self.client.put_item(
                    TableName=self.table,
                    Item=item(
                        pk=ticket_pk(name, number),
                        semaphore=name,
                        tombstone=True,
                        expires_at=int(now) + TICKET_TTL,
                    ),
                    ConditionExpression="attribute_not_exists(pk)",
                )
        except ConditionFailed:
            return False
        return True

    def advance(self, name: str, number: int, *, drop: bool) -> bool:
        moved = self._write(
            line_pk(name), "SET #head = :n", "#head = :previous", {"n": number, "previous": number - 1}
        )
        if moved is not None and drop:
            with translated("DeleteItem"):
                self.client.delete_item(TableName=self.table, Key={"pk": {"S": ticket_pk(name, number)}})
        return moved is not None
