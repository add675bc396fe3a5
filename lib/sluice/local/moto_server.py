"""The embedded AWS's server: moto on 127.0.0.1 and a free port, in this process or in a child of its own.

``python -m sluice.local.moto_server`` is the child: it prints the endpoint, then serves until its
standard input closes (the parent stopped or died).

moto is not atomic under concurrent requests: a cancelled DynamoDB transaction restores a copy of the
whole table (undoing other requests' writes), and two concurrent receives can take messages of one
FIFO group. The child runs with ``make_moto_atomic`` (and ``make_sqs_clock_cheap``, a speed fix); a
server in the calling process is left as moto ships it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from datetime import datetime
from typing import Any

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account

_servers: dict[str, Any] = {}


def start_server() -> str:
    """A ThreadedMotoServer on 127.0.0.1 and a free port; returns its endpoint."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    _servers[endpoint] = server
    return endpoint


def stop_server(endpoint: str) -> None:
    server = _servers.pop(endpoint, None)
    if server is not None:
        server.stop()


# Every item and queue operation moto serves; make_moto_atomic runs each under its service's lock.
_DYNAMODB_OPERATIONS = (
    "put_item",
    "get_item",
    "update_item",
    "delete_item",
    "query",
    "scan",
    "batch_get_item",
    "batch_write_item",
    "transact_write_items",
    "transact_get_items",
)
_SQS_OPERATIONS = (
    "get_queue_attributes",
    "send_message",
    "send_message_batch",
    "receive_message",
    "delete_message",
    "delete_message_batch",
    "change_message_visibility",
    "change_message_visibility_batch",
    "purge_queue",
)


def make_moto_atomic() -> None:
    """Make moto's DynamoDB and SQS as atomic as the real services, for a server that takes
    concurrent requests (moto serves each request in a thread of its own, without locks).

    * DynamoDB: a cancelled TransactWriteItems rolls back by putting back a copy of the whole table
      taken when it began, which undoes the writes other requests committed in between (claims vanish,
      ledger slots outlive their records). Every item operation runs under one lock here, and a
      cancelled transaction puts back only the items it touched (copying the whole table for every
      transaction also makes each claim slower as the table grows).
    * SQS: two ReceiveMessage calls at once can both take messages of one FIFO group, since each
      reads the in-flight groups before either marks its own; SQS never hands out a group twice. Every
      queue operation runs under one lock here, released while a long poll waits (which polls every
      50 ms instead of spinning while the only visible messages belong to groups in flight).

    Sluice's code is unchanged; this only makes the emulator behave as AWS documents.
    """
    import moto.dynamodb.models as ddb_models

    if getattr(ddb_models.DynamoDBBackend, "_sluice_atomic", False):
        return
    _atomic_dynamodb()
    _atomic_sqs()
    ddb_models.DynamoDBBackend._sluice_atomic = True  # type: ignore[attr-defined]


def _locked(lock: Any, function: Any) -> Any:
    @functools.wraps(function)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        with lock:
            return function(self, *args, **kwargs)

    return run


def _atomic_dynamodb() -> None:
    """Every item operation under one lock; a cancelled transaction puts back only the items it touched."""
    import copy
    import threading

    import moto.dynamodb.models as ddb_models
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    lock = threading.RLock()
    original_transact = ddb_models.DynamoDBBackend.transact_write_items

    class TableCopyIsFree:
        """``copy`` as moto.dynamodb.models sees it: a table "copies" to itself, items really copy."""

        def deepcopy(self, value: Any, memo: Any = None) -> Any:
            return value if isinstance(value, Table) else copy.deepcopy(value, memo)

        def __getattr__(self, name: str) -> Any:
            return getattr(copy, name)

    def transact(self: Any, transact_items: list[dict[str, Any]]) -> None:
        saved: list[tuple[Any, Any, Any]] = []
        for entry in transact_items:
            _, op = next(iter(entry.items()))
            table = self.tables.get(op.get("TableName"))
            key = op.get("Key") or op.get("Item") or {}
            if table is None or table.range_key_attr or table.hash_key_attr not in key:
                continue  # rejected before anything is written, or not a table Sluice has
            hash_value = DynamoType(key[table.hash_key_attr])
            saved.append((table, hash_value, copy.deepcopy(table.get_item(hash_value))))
        try:
            original_transact(self, transact_items)
        except BaseException:
            for table, hash_value, before in reversed(saved):
                if before is None:
                    table.items.pop(hash_value, None)
                else:
                    table.items[hash_value] = before
            raise

    ddb_models.copy = TableCopyIsFree()  # type: ignore[assignment]
    ddb_models.DynamoDBBackend.transact_write_items = transact  # type: ignore[method-assign]
    for name in _DYNAMODB_OPERATIONS:
        setattr(ddb_models.DynamoDBBackend, name, _locked(lock, getattr(ddb_models.DynamoDBBackend, name)))


def _atomic_sqs() -> None:
    """Every queue operation under one lock, released while a long poll waits (50 ms at a time)."""
    import threading

    import moto.sqs.models as sqs_models

    lock = threading.RLock()

    def wait_for_messages(self: Any, timeout: int) -> None:
        lock.release()
        try:
            time.sleep(0.05)
        finally:
            lock.acquire()

    sqs_models.Queue.wait_for_messages = wait_for_messages  # type: ignore[method-assign]
    for name in _SQS_OPERATIONS:
        setattr(sqs_models.SQSBackend, name, _locked(lock, getattr(sqs_models.SQSBackend, name)))


def make_sqs_clock_cheap() -> None:
    """moto's SQS asks the clock through datetime arithmetic for every message each time it scans a
    queue (visibility, delay), so a FIFO send or a queue-depth read costs O(backlog) slow calls:
    200 sends take seconds. Its two clock functions read ``time.time()`` here instead (same values)."""
    import moto.sqs.models as sqs_models

    original_seconds, original_millis = sqs_models.unix_time, sqs_models.unix_time_millis

    def unix_time(dt: datetime | None = None) -> float:
        return time.time() if dt is None else original_seconds(dt)

    def unix_time_millis(dt: datetime | None = None) -> float:
        return time.time() * 1000.0 if dt is None else original_millis(dt)

    sqs_models.unix_time = unix_time  # type: ignore[assignment]
    sqs_models.unix_time_millis = unix_time_millis  # type: ignore[assignment]


def serve() -> None:
    """Child process mode: print the endpoint, serve until stdin closes (the parent stopped or died)."""
    make_moto_atomic()
    make_sqs_clock_cheap()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    logging.getLogger("moto").setLevel(logging.CRITICAL)
    import warnings

    warnings.filterwarnings("ignore", message="Tried to parse AWS::", category=UserWarning)
    endpoint = start_server()
    # Step Functions' service integrations (an sqs:sendMessage task) call back into the server at
    # localhost:MOTO_PORT: this server's port, not moto's default 5000.
    os.environ["MOTO_PORT"] = endpoint.rsplit(":", 1)[1]
    print(endpoint, flush=True)
    try:
        sys.stdin.read()
    finally:
        stop_server(endpoint)


if __name__ == "__main__":
    serve()
