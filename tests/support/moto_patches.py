"""Two adjustments to in-process moto for the reliability suite: atomic requests and cheap rollbacks.

* **Atomic requests.** moto runs each request without a lock, and ``TransactWriteItems`` rolls a
  cancelled transaction back by putting a copy of the whole table back in place. Two launchers in
  two threads could then undo each other's committed claims, a fault DynamoDB never has. Every
  request to moto runs under one lock, so each AWS call is atomic, as it is in AWS. Threads still
  interleave between calls, which is where the races a launcher must survive live.
* **Cheap rollbacks.** moto deep-copies the whole table once per item of every transaction, so a
  claim costs O(table size) three times over. Instead, the items a transaction touches are copied
  before it runs and put back if it is cancelled. The outcome is the same: a cancelled transaction
  leaves every item as it was (checked in ``tests/reliability/test_harness.py``).

Used as a context manager around one moto session; nothing outside it changes.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import moto.dynamodb.models as ddb_models
from moto.core.botocore_stubber import BotocoreStubber
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table

_LOCK = threading.RLock()
_depth = 0
_original: dict[str, Any] = {}  # what was in place when the first block was entered


class _TableCopyIsFree:
    """``copy`` as ``moto.dynamodb.models`` sees it: a whole table "copies" to itself."""

    def deepcopy(self, value: Any, memo: Any = None) -> Any:
        if isinstance(value, Table):
            return value
        return copy.deepcopy(value, memo)

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)


def _serialized_call(self: BotocoreStubber, event_name: str, request: Any, **kwargs: Any) -> Any:
    with _LOCK:
        return _original["call"](self, event_name, request, **kwargs)


def _transact_with_item_snapshots(self: Any, transact_items: list[dict[str, Any]]) -> None:
    saved: list[tuple[Table, DynamoType, DynamoType | None, Any]] = []
    for entry in transact_items:
        _, op = next(iter(entry.items()))
        table = self.tables.get(op.get("TableName"))
        key = op.get("Key") or op.get("Item") or {}
        if table is None or table.hash_key_attr not in key:
            continue  # moto rejects it before writing anything
        hash_value = DynamoType(key[table.hash_key_attr])
        range_value = DynamoType(key[table.range_key_attr]) if table.range_key_attr else None
        if table.range_key_attr and range_value is None:
            continue
        saved.append((table, hash_value, range_value, copy.deepcopy(table.get_item(hash_value, range_value))))
    try:
        _original["transact"](self, transact_items)
    except BaseException:
        for table, hash_value, range_value, before in reversed(saved):
            if range_value is None:
                if before is None:
                    table.items.pop(hash_value, None)
                else:
                    table.items[hash_value] = before
            elif before is None:
                table.items.get(hash_value, {}).pop(range_value, None)
            else:
                table.items[hash_value][range_value] = before
        raise


@contextmanager
def atomic_fast_moto() -> Iterator[None]:
    """Serialise moto requests and make transaction rollbacks cheap, for the duration of the block."""
    global _depth
    with _LOCK:
        if _depth == 0:
            _original.update(
                call=BotocoreStubber.__call__,
                transact=ddb_models.DynamoDBBackend.transact_write_items,
                copy=ddb_models.copy,
            )
            BotocoreStubber.__call__ = _serialized_call  # type: ignore[method-assign]
            ddb_models.DynamoDBBackend.transact_write_items = _transact_with_item_snapshots  # type: ignore[method-assign]
            ddb_models.copy = _TableCopyIsFree()  # type: ignore[assignment]
        _depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _depth -= 1
            if _depth == 0:
                BotocoreStubber.__call__ = _original["call"]  # type: ignore[method-assign]
                ddb_models.DynamoDBBackend.transact_write_items = _original["transact"]  # type: ignore[method-assign]
                ddb_models.copy = _original["copy"]  # type: ignore[assignment]
