"""Concurrency keys in the Sluice table (``sluice.features.keys.KeyStore``).

    CKEY#<key>             holders (string set), cap (absent: the default), tickets, woken,
                           inflight (string set of "<ticket>@<ms>"), landed (entries whose
                           claim landed before their wake noted them: ``sluice.features.keys``)
    KWAIT#<key>#<ticket>   a waiter: message_id, key, body, group_id, attributes (JSON), parked_at
    KEYS_WAITING           keys: string set of the keys with waiters
    KWAITOF#<payload key>  ckey, ticket, message_id, parked_at, expires_at: for ``sluice status``

A keyed claim, release or adoption writes ``CKEY#<key>`` in its own transaction (``key_claim_item``,
``key_release_item``, ``key_adopt_item``). A park is one transaction (CKEY# tickets t → t+1 if t,
KWAIT#, KWAITOF#, KEYS_WAITING); moving the head is another (CKEY# woken if as read, and the waiters' items
deleted). The key leaves KEYS_WAITING only while its line is empty (a condition on CKEY#), so a
park that lands in between keeps it there. Why this cannot lose a waiter: ``sluice.features.keys``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sluice.adapters.dynamo.codec import item, values
from sluice.adapters.dynamo.table import TableRef
from sluice.adapters.errors import translated
from sluice.core.errors import ConditionFailed
from sluice.core.records import KeyState, ticket_number
from sluice.features.keys import DEFAULT_KEY_CONCURRENCY, FAIR_UNCAPPED, KeyWaiter, check_cap, entry

KEYS_WAITING_PK = "KEYS_WAITING"
NAMES = {
    "#holders": "holders",
    "#cap": "cap",
    "#tickets": "tickets",
    "#woken": "woken",
    "#ckey": "ckey",
    "#inflight": "inflight",
    "#fair": "fair",
    "#landed": "landed",
}
# Room, in one condition: the key's own cap when it has one, else the default (``:kdefault``; for a
# claim from a fair lane, ``FAIR_UNCAPPED``: its lane's MAX holds its tenants, ``sluice.features.fair``).
ROOM = (
    "((attribute_not_exists(#cap) AND (attribute_not_exists(#holders) OR size(#holders) < :kdefault)) "
    "OR (#cap > :kzero AND (attribute_not_exists(#holders) OR size(#holders) < #cap)))"
)
NOBODY_WAITING = "(attribute_not_exists(#tickets) OR #woken = #tickets) AND attribute_not_exists(#inflight)"


def key_pk(ckey: str) -> str:
    return f"CKEY#{ckey}"


def waiter_pk(ckey: str, ticket: int) -> str:
    return f"KWAIT#{ckey}#{ticket}"


def wait_of_pk(key: str) -> str:
    return f"KWAITOF#{key}"


def to_key_state(ckey: str, raw: dict[str, Any] | None) -> KeyState:
    if raw is None:
        return KeyState(ckey)
    return KeyState(
        key=ckey,
        holders=frozenset(raw.get("holders", ())),
        cap=None if raw.get("cap") is None else int(raw["cap"]),
        tickets=int(raw.get("tickets", 0)),
        woken=int(raw.get("woken", 0)),
        inflight=frozenset(raw.get("inflight", ())),
        fair=None if raw.get("fair") is None else str(raw["fair"]),
        landed=frozenset(raw.get("landed", ())),
    )


class KeysTable:
    def __init__(self, db: TableRef, key_concurrency: int = DEFAULT_KEY_CONCURRENCY) -> None:
        self.db = db
        self.key_concurrency = key_concurrency  # the default cap; an operator may change it

    # -- in other transactions -----------------------------------------------------------------------

    def key_claim_item(
        self, ckey: str, name: str, *, ticket: str | None, uncapped: bool = False, landed: bool = False
    ) -> dict[str, Any]:
        """Take a slot of ``ckey`` for ``name``: if it has room and (unless woken) nobody waits.
        ``uncapped``: no default cap (a fair lane's tenant, not marked yet: ``sluice.features.fair``).
        A woken waiter (``ticket``) takes its entry out of ``inflight``: only while it is there;
        ``landed``: it is not (its wake has not noted it yet), so it is recorded as landed."""
        condition = ROOM if ticket is not None else f"{ROOM} AND {NOBODY_WAITING}"
        expression = "SET #ckey = :ckey ADD #holders :name"
        if ticket is not None and landed:
            expression += ", #landed :ticket"
        elif ticket is not None:
            expression += " DELETE #inflight :ticket"  # its slot was kept for it: now it holds it
            condition += " AND contains(#inflight, :entry)"
        names = {k: v for k, v in NAMES.items() if k in condition or k in expression}
        return {
            "Update": {
                "TableName": self.db.table,
                "Key": {"pk": {"S": key_pk(ckey)}},
                "UpdateExpression": expression,
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": {
                    **values(
                        ckey=ckey, kdefault=FAIR_UNCAPPED if uncapped else self.key_concurrency, kzero=0
                    ),
                    ":name": {"SS": [name]},
                    **({":ticket": {"SS": [ticket]}} if ticket is not None else {}),
                    **({":entry": {"S": ticket}} if ticket is not None and not landed else {}),
                },
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def nobody_waiting_item(self) -> dict[str, Any]:
        """A claim's check that no concurrency key has waiters: ``KEYS_WAITING`` has none (a string
        set is never empty: its last key removed, the attribute goes)."""
        return {
            "ConditionCheck": {
                "TableName": self.db.table,
                "Key": {"pk": {"S": KEYS_WAITING_PK}},
                "ConditionExpression": "attribute_not_exists(#keys)",
                "ExpressionAttributeNames": {"#keys": "keys"},
            }
        }

    def key_release_item(self, ckey: str, name: str) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": self.db.table,
                "Key": {"pk": {"S": key_pk(ckey)}},
                "UpdateExpression": "DELETE #holders :name",
                "ExpressionAttributeNames": {"#holders": "holders"},
                "ExpressionAttributeValues": {":name": {"SS": [name]}},
            }
        }

    def key_adopt_item(self, ckey: str, name: str) -> dict[str, Any]:
        """A redriven run of ``ckey`` runs already: it holds a slot whatever the key's cap."""
        return {
            "Update": {
                "TableName": self.db.table,
                "Key": {"pk": {"S": key_pk(ckey)}},
                "UpdateExpression": "SET #ckey = :ckey ADD #holders :name",
                "ExpressionAttributeNames": {"#holders": "holders", "#ckey": "ckey"},
                "ExpressionAttributeValues": {**values(ckey=ckey), ":name": {"SS": [name]}},
            }
        }

    # -- KeyStore ----------------------------------------------------------------------------------

    def key_state(self, ckey: str) -> KeyState:
        return to_key_state(ckey, self.db.get(key_pk(ckey)))

    def key_states(self, ckeys: Sequence[str]) -> dict[str, KeyState]:
        found = {
            str(raw["ckey"]): raw for raw in self.db.batch_get([key_pk(k) for k in ckeys]) if "ckey" in raw
        }
        return {k: to_key_state(k, found.get(k)) for k in ckeys}

    def park_for_key(
        self, waiter: KeyWaiter, *, tickets: int, replaces: str | None = None, fair: str | None = None
    ) -> bool:
        items: list[dict[str, Any]] = [
            self._line_item(waiter.ckey, tickets, replaces=replaces, fair=fair),
            {
                "Put": {
                    "TableName": self.db.table,
                    "Item": item(
                        pk=waiter_pk(waiter.ckey, tickets),
                        ckey=waiter.ckey,
                        ticket=tickets,
                        message_id=waiter.message_id,
                        key=waiter.key,
                        body=waiter.body,
                        group_id=waiter.group_id,
                        attributes=json.dumps(waiter.attributes, sort_keys=True),
                        parked_at=waiter.parked_at,
                    ),
                }
            },
            {
                "Put": {
                    "TableName": self.db.table,
                    "Item": item(
                        pk=wait_of_pk(waiter.key),
                        ckey=waiter.ckey,
                        ticket=tickets,
                        message_id=waiter.message_id,
                        parked_at=waiter.parked_at,
                        expires_at=int(waiter.parked_at) + self.db.retention_seconds,
                    ),
                }
            },
            {
                "Update": {
                    "TableName": self.db.table,
                    "Key": {"pk": {"S": KEYS_WAITING_PK}},
                    "UpdateExpression": "ADD #keys :k",
                    "ExpressionAttributeNames": {"#keys": "keys"},
                    "ExpressionAttributeValues": {":k": {"SS": [waiter.ckey]}},
                }
            },
        ]
        return self.db.transact(items) is None

    def _line_item(
        self, ckey: str, tickets: int, *, replaces: str | None, fair: str | None
    ) -> dict[str, Any]:
        """CKEY#<ckey>'s next ticket, taken if the line is as read (``tickets``)."""
        condition = "attribute_not_exists(#tickets)" if tickets == 0 else "#tickets = :t"
        expression = "SET #ckey = :ckey, #tickets = :next, #woken = if_not_exists(#woken, :zero)"
        named = values(ckey=ckey, next=tickets + 1, zero=0, **({"t": tickets} if tickets else {}))
        names = {"#tickets": "tickets", "#woken": "woken", "#ckey": "ckey"}
        if fair is not None:
            expression += (
                ", #fair = :fair"  # a tenant of a fair lane (sluice.features.fair): its waker wakes it
            )
            names["#fair"] = "fair"
            named[":fair"] = {"S": fair}
        if replaces is not None:
            # A woken waiter back in line keeps no slot; noted landed too, in case its wake has not
            # noted it yet (``sluice.features.keys``, the wake's timeline).
            expression += " DELETE #inflight :replaces ADD #landed :replaces"
            names["#inflight"], names["#landed"] = "inflight", "landed"
            named[":replaces"] = {"SS": [replaces]}
        return {
            "Update": {
                "TableName": self.db.table,
                "Key": {"pk": {"S": key_pk(ckey)}},
                "UpdateExpression": expression,
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": named,
            }
        }

    def key_waiters(self, ckey: str, tickets: Sequence[int]) -> list[KeyWaiter]:
        found = self.db.batch_get([waiter_pk(ckey, t) for t in tickets])
        waiters = [
            KeyWaiter(
                ckey=ckey,
                ticket=int(raw["ticket"]),
                message_id=str(raw["message_id"]),
                key=str(raw["key"]),
                body=str(raw["body"]),
                group_id=str(raw.get("group_id", "")),
                attributes=json.loads(raw.get("attributes") or "{}"),
                parked_at=float(raw.get("parked_at", 0)),
            )
            for raw in found
        ]
        return sorted(waiters, key=lambda w: w.ticket)

    def advance_key(self, ckey: str, *, woken: int, to: int, now: float, drop: Sequence[str] = ()) -> bool:
        added = [entry(t, now) for t in range(woken, to)]
        expression = "SET #woken = :to" + (" ADD #inflight :added" if added else "")
        items: list[dict[str, Any]] = [
            {
                "Update": {
                    "TableName": self.db.table,
                    "Key": {"pk": {"S": key_pk(ckey)}},
                    "UpdateExpression": expression,
                    "ConditionExpression": "#woken = :woken",
                    "ExpressionAttributeNames": {
                        "#woken": "woken",
                        **({"#inflight": "inflight"} if added else {}),
                    },
                    "ExpressionAttributeValues": {
                        **values(to=to, woken=woken),
                        **({":added": {"SS": added}} if added else {}),
                    },
                }
            },
            *(
                {"Delete": {"TableName": self.db.table, "Key": {"pk": {"S": waiter_pk(ckey, t)}}}}
                for t in range(woken, to)
            ),
        ]
        if self.db.transact(items) is not None:
            return False
        if drop:
            # Entries past INFLIGHT_SECONDS: a set cannot be added to and taken from in one update.
            with translated("UpdateItem"):
                self.db.client.update_item(
                    TableName=self.db.table,
                    Key={"pk": {"S": key_pk(ckey)}},
                    UpdateExpression="DELETE #inflight :drop, #landed :drop",
                    ExpressionAttributeNames={"#inflight": "inflight", "#landed": "landed"},
                    ExpressionAttributeValues={":drop": {"SS": list(drop)}},
                )
        return True

    def keep_inflight(self, ckey: str, entries: Sequence[str]) -> None:
        with translated("UpdateItem"):
            self.db.client.update_item(
                TableName=self.db.table,
                Key={"pk": {"S": key_pk(ckey)}},
                UpdateExpression="ADD #inflight :keep DELETE #landed :keep",
                ExpressionAttributeNames={"#inflight": "inflight", "#landed": "landed"},
                ExpressionAttributeValues={":keep": {"SS": list(entries)}},
            )

    def drop_inflight(self, ckey: str, entries: Sequence[str]) -> None:
        for e in entries:
            # Noted landed only while its wake may not have noted it yet: its ticket not behind
            # ``woken`` (the wake moves ``woken`` and notes it at once) and in the line, which then
            # has waiters, so a wake comes and drops it from both sets. Else (noted already, or a
            # forged ticket) out of inflight only: a forged one on an idle key would stay for good.
            # A key with no item is not created.
            for expression, condition in (
                (
                    "DELETE #inflight :e ADD #landed :e",
                    "attribute_exists(pk) AND #woken <= :t AND #tickets > :t",
                ),
                ("DELETE #inflight :e", "attribute_exists(pk)"),
            ):
                try:
                    with translated("UpdateItem"):
                        self.db.client.update_item(
                            TableName=self.db.table,
                            Key={"pk": {"S": key_pk(ckey)}},
                            UpdateExpression=expression,
                            ConditionExpression=condition,
                            ExpressionAttributeNames={
                                k: v for k, v in NAMES.items() if k in expression or k in condition
                            },
                            ExpressionAttributeValues={
                                ":e": {"SS": [e]},
                                **({":t": {"N": str(ticket_number(e))}} if ":t" in condition else {}),
                            },
                        )
                    break
                except ConditionFailed:
                    continue

    def forget_key(self, ckey: str) -> None:
        # Off the sweep's list once nobody waits or is on the way; a park that landed meanwhile
        # keeps it there (and keeps it its fair lane's tenant). Its ``landed`` entries go too: with
        # nobody in the line no wake is half done (one that sent a waiter finds ``woken`` moved
        # and notes nothing), and no wake would come to drop them (a forged ticket parked again).
        self.db.transact(
            [
                {
                    "Update": {
                        "TableName": self.db.table,
                        "Key": {"pk": {"S": key_pk(ckey)}},
                        "UpdateExpression": "REMOVE #fair, #landed",
                        "ConditionExpression": "#woken = #tickets AND attribute_not_exists(#inflight)",
                        "ExpressionAttributeNames": {
                            "#woken": "woken",
                            "#tickets": "tickets",
                            "#inflight": "inflight",
                            "#fair": "fair",
                            "#landed": "landed",
                        },
                    }
                },
                {
                    "Update": {
                        "TableName": self.db.table,
                        "Key": {"pk": {"S": KEYS_WAITING_PK}},
                        "UpdateExpression": "DELETE #keys :k",
                        "ExpressionAttributeNames": {"#keys": "keys"},
                        "ExpressionAttributeValues": {":k": {"SS": [ckey]}},
                    }
                },
            ]
        )

    def key_wait_of(self, key: str) -> KeyWaiter | None:
        raw = self.db.get(wait_of_pk(key))
        if raw is None:
            return None
        return KeyWaiter(
            ckey=str(raw["ckey"]),
            ticket=int(raw["ticket"]),
            message_id=str(raw.get("message_id", "")),
            key=key,
            body="",
            group_id="",
            attributes={},
            parked_at=float(raw.get("parked_at", 0)),
        )

    def keys_waiting(self) -> frozenset[str]:
        raw = self.db.get(KEYS_WAITING_PK)
        return frozenset(raw.get("keys", ())) if raw else frozenset()

    def set_key_cap(self, ckey: str, cap: int | None) -> None:
        request: dict[str, Any] = {
            "TableName": self.db.table,
            "Key": {"pk": {"S": key_pk(ckey)}},
            "UpdateExpression": "SET #ckey = :ckey" + (" REMOVE #cap" if cap is None else ", #cap = :cap"),
            "ExpressionAttributeNames": {"#ckey": "ckey", "#cap": "cap"},
            "ExpressionAttributeValues": values(
                ckey=ckey, **({} if cap is None else {"cap": check_cap(cap)})
            ),
        }
        with translated("UpdateItem"):
            self.db.client.update_item(**request)
