"""The rate books (``sluice.features.rate_limits``) in the ledger table: the stack's, ``RATES``, and
each concurrency key's with a rate, ``RATES#key:<key>``.

``load`` is one consistent GetItem; ``save`` one PutItem fenced by the version read:

    IF attribute_not_exists(pk) (version 0, never written) / IF version = :expected

Each scope's window is kept as text, ``ms:count ms:count …``: one attribute, whatever its length; its
spans of dropped entries likewise, ``first:last …``.
"""

from __future__ import annotations

from typing import Any

from sluice.adapters.dynamo.codec import item
from sluice.adapters.dynamo.table import TableRef
from sluice.adapters.errors import translated
from sluice.core.errors import ConditionFailed
from sluice.features.rate_limits import MAIN, RateBook

RATES_PK = "RATES"


def pk_of(where: str) -> str:
    return RATES_PK if where == MAIN else f"{RATES_PK}#{where}"


def _window_text(window: tuple[tuple[int, int], ...]) -> str:
    return " ".join(f"{at}:{n}" for at, n in window)


def _window(text: str) -> tuple[tuple[int, int], ...]:
    pairs = (part.split(":") for part in text.split())
    return tuple((int(at), int(n)) for at, n in pairs)


def to_book(raw: dict[str, Any] | None) -> RateBook:
    if raw is None:
        return RateBook()
    return RateBook(
        version=int(raw.get("version", 0)),
        overrides={str(k): str(v) for k, v in (raw.get("overrides") or {}).items()},
        windows={str(k): _window(str(v)) for k, v in (raw.get("windows") or {}).items()},
        dropped={str(k): _window(str(v)) for k, v in (raw.get("dropped") or {}).items()},
    )


class DynamoRates:
    """``RatePersistence`` on the ledger table."""

    def __init__(self, db: TableRef) -> None:
        self.db = db

    def load(self, where: str = MAIN) -> RateBook:
        return to_book(self.db.get(pk_of(where)))

    def save(self, book: RateBook, expected: int, where: str = MAIN) -> bool:
        request: dict[str, Any] = {
            "TableName": self.db.table,
            "Item": item(
                pk=pk_of(where),
                version=expected + 1,
                overrides=dict(book.overrides),
                windows={scope: _window_text(w) for scope, w in book.windows.items() if w},
                dropped={scope: _window_text(spans) for scope, spans in book.dropped.items() if spans},
            ),
        }
        if expected == 0:
            request["ConditionExpression"] = "attribute_not_exists(pk)"
        else:
            request["ConditionExpression"] = "version = :expected"
            request["ExpressionAttributeValues"] = {":expected": {"N": str(expected)}}
        try:
            with translated("PutItem"):
                self.db.client.put_item(**request)
        except ConditionFailed:
            return False
        return True
