"""Make moto's DynamoDB as atomic as DynamoDB.

moto's in-process ``transact_write_items`` deep-copies the table to roll back on failure; a
second thread writing meanwhile breaks the copy ("dictionary changed size during iteration").
DynamoDB serialises conflicting writes, so tests that run launchers in threads serialise moto's
item operations with one lock. Only the emulator is changed; Sluice's code is not.
"""

from __future__ import annotations

import functools
import threading

from moto.dynamodb.models import DynamoDBBackend

_LOCK = threading.RLock()
_OPERATIONS = ("put_item", "get_item", "update_item", "delete_item", "transact_write_items", "query", "scan")


def serialise_dynamodb() -> None:
    for name in _OPERATIONS:
        original = getattr(DynamoDBBackend, name)
        if getattr(original, "_sluice_serialised", False):
            continue

        @functools.wraps(original)
        def locked(self, *args, __original=original, **kwargs):
            with _LOCK:
                return __original(self, *args, **kwargs)

        locked._sluice_serialised = True  # type: ignore[attr-defined]
        setattr(DynamoDBBackend, name, locked)
