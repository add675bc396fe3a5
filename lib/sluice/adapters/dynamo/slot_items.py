"""The slot pools' items in the Sluice table (``sluice.adapters.dynamo.slots``): their keys, and each
holder write as a TransactWriteItems item.

``holders`` is a map, not a set: a map may be empty, and one update can REMOVE one entry and SET
another (the swap). Each holder write is one UpdateItem on one shard, conditioned on that shard
alone; the same writes are offered as TransactWriteItems items (``claim_item``, ``release_item``,
``swap_item``) for a caller that moves a slot together with its own records:

    claim    SET holders.#n = :now                     IF size(holders) < cap AND no holders.#n
    take     SET holders.#n = :now                     IF no holders.#n  (no cap: already running;
                                                          an adoption, with the pool frozen first,
                                                          and the pool's version moved with it)
    release  REMOVE holders.#n                         IF holders.#n exists
    swap     REMOVE holders.#old SET holders.#new      IF holders.#old exists AND no holders.#new
                                                          AND size(holders) <= cap

Shard size. DynamoDB counts attribute names and strings in UTF-8 bytes, a number as about one byte
per two significant digits plus one, and a map as 3 bytes plus, per entry, 1 byte, its name and its
value. With ``per_shard`` = 8 holders of 80-character names, claimed at 1800000000.123456 (16
digits, 9 bytes):

    pk        2 + len("SLOTS#" + pool + "#" + i)     ≤ 2 + 6 + 64 + 1 + 5 =  78
    cap       3 + 2                                                       =   5
    holders   7 + 3 + 8 × (1 + 80 + 9)                                    = 730
                                                                     total ≤ 813 bytes

so a claim, release or swap (billed on the larger of the item's images, at most ``cap`` holders)
costs one write unit, two inside a transaction. The launcher's names are at most 73 characters.
"""

from __future__ import annotations

from typing import Any

from sluice.adapters.dynamo.codec import values
from sluice.primitives.slots import check_pool

# moto raises on size() of a missing attribute instead of failing the condition; testing that the
# attribute exists first keeps a claim on a shard that was never written a plain refusal.
HAS_HOLDERS = "attribute_exists(holders) AND "


def pool_pk(pool: str) -> str:
    return f"SLOTS#{check_pool(pool)}"


def shard_pk(pool: str, shard: int) -> str:
    if shard < 0:
        raise ValueError(f"shard index {shard}")
    return f"{pool_pk(pool)}#{shard}"


def item_key(pk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}}


def claim_item(table: str, pool: str, shard: int, name: str, now: float) -> dict[str, Any]:
    """A TransactWriteItems item: ``name`` takes a slot on ``shard`` if it has room. On failure the
    reason carries the shard as it was (``Item``): ``name`` among its holders means held already."""
    return {
        "Update": {
            "TableName": table,
            "Key": item_key(shard_pk(pool, shard)),
            "UpdateExpression": "SET holders.#n = :now",
            "ConditionExpression": HAS_HOLDERS + "size(holders) < cap AND attribute_not_exists(holders.#n)",
            "ExpressionAttributeNames": {"#n": _name(name)},
            "ExpressionAttributeValues": values(now=now),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def take_item(table: str, pool: str, shard: int, name: str, now: float) -> dict[str, Any]:
    """A TransactWriteItems item: ``name`` takes a slot on ``shard`` whatever its cap. Only for a
    holder that runs already (an adoption): it counts against the limit, past it if need be."""
    return {
        "Update": {
            "TableName": table,
            "Key": item_key(shard_pk(pool, shard)),
            "UpdateExpression": "SET holders.#n = :now",
            "ConditionExpression": "attribute_exists(holders) AND attribute_not_exists(holders.#n)",
            "ExpressionAttributeNames": {"#n": _name(name)},
            "ExpressionAttributeValues": values(now=now),
        }
    }


def release_item(table: str, pool: str, shard: int, name: str) -> dict[str, Any]:
    """A TransactWriteItems item: ``name`` gives its slot on ``shard`` back (fails if it holds none)."""
    return {
        "Update": {
            "TableName": table,
            "Key": item_key(shard_pk(pool, shard)),
            "UpdateExpression": "REMOVE holders.#n",
            "ConditionExpression": "attribute_exists(holders.#n)",
            "ExpressionAttributeNames": {"#n": _name(name)},
        }
    }


def swap_item(table: str, pool: str, shard: int, old: str, new: str, now: float) -> dict[str, Any]:
    """A TransactWriteItems item: ``old``'s slot on ``shard`` goes to ``new`` in one update. Refused
    when the shard is over its cap (lowered or frozen): a swap admits nothing a claim would not."""
    if _name(old) == _name(new):
        raise ValueError(f"swap of {old!r} with itself")
    return {
        "Update": {
            "TableName": table,
            "Key": item_key(shard_pk(pool, shard)),
            "UpdateExpression": "REMOVE holders.#old SET holders.#new = :now",
            "ConditionExpression": (
                HAS_HOLDERS
                + "attribute_exists(holders.#old) AND attribute_not_exists(holders.#new) AND size(holders) <= cap"
            ),
            "ExpressionAttributeNames": {"#old": old, "#new": new},
            "ExpressionAttributeValues": values(now=now),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
    }


def _name(name: str) -> str:
    if not name:
        raise ValueError("a holder needs a name")
    return name
