"""Every adjustment the tests make to in-process moto, and why. Each one changes the emulator only, to
behave as AWS documents; Sluice's code is never patched here.

* **Serialised DynamoDB items** (``serialise_dynamodb``: for the whole test session, from
  tests/conftest.py). moto runs item operations without a lock, and ``TransactWriteItems`` deep-copies
  the table to roll a cancelled transaction back: a second thread writing meanwhile breaks the copy
  ("dictionary changed size during iteration"), and the restored copy would undo that thread's write.
  DynamoDB serialises conflicting writes, so every item operation (put, get, update, delete, query,
  scan, transaction) runs under one lock. A Scan is then one instant, which the contract suites' racing
  tests read as a snapshot (tests/contract/slots_fixtures.py).
* **Atomic requests** (``atomic_fast_moto``: around one moto session, for the reliability suite).
  Whole requests run under the same lock, SQS and Step Functions included, so each AWS call is atomic,
  as it is in AWS. Threads still interleave between calls, which is where the races a launcher must
  survive live.
* **Cheap rollbacks** (``cheap_rollbacks``: for the whole test session). moto deep-copies the whole
  table once per item of every transaction, so a claim costs O(table size) three times over. Instead,
  the items a transaction touches are copied before it runs and put back if it is cancelled. The outcome is the same: a
  cancelled transaction leaves every item as it was (checked in tests/reliability/test_harness.py).
* **Projected scans** (``projected_scans``: for the whole test session). moto's Scan deep-copies every
  matching item, then converts the whole item to plain JSON once per attribute of the
  ProjectionExpression, only to keep those attributes: a payload's long history is copied and
  converted over and over to read its ``state``. With a projection, each item is projected from the
  stored one (the projection builds new objects; the scan runs under the lock above), and only the
  attributes named are converted. Same items, pages and counts; the reliability suite's invariants
  scan the table after every action.
* **Response keys looked up once** (``cached_response_keys``: for the whole test session). moto's
  response serializer asks six alias providers, for every member of every structure it writes, which
  keys of the Python object may hold it: for a plain dict those keys depend only on the member and
  its shape, so each response works them out once per member (a DynamoDB item's every attribute
  value is such a structure), then reads the dict directly. The same keys are tried in the same
  order, and the first one present gives the value, as in moto.
* **ListExecutions' redriveFilter** (``redrive_filter``: for the whole test session). moto ignores it
  and lists every execution; AWS lists only the redriven ones (``REDRIVEN``) or only the others.
  moto has no RedriveExecution either: the tests' redrive (``tests/reliability/actors.py``) counts
  ``redrive_count`` on moto's execution, and the listing is filtered by it.

* **A moved message's source queue** (``dead_letter_source``: for the whole test session). moto moves
  a message to the dead-letter queue after ``maxReceiveCount`` receives but does not say from where;
  SQS answers the system attribute ``DeadLetterQueueSourceArn`` on such a message (the queue it came
  from), which ``sluice dlq`` reads (``sluice.adapters.aws.sqs_dead_letters``).

Not here, and why:

* ``sluice.local.moto_server`` makes its moto server atomic (DynamoDB and SQS under locks, the same
  cheap rollbacks) and its SQS clock cheap, for the demo's server in a process of its own. It stays in
  the package: the demo runs without the tests, and ``lib`` never imports ``tests``.
* moto raises ``ValueError`` on ``size()`` of a missing attribute where DynamoDB fails the condition.
  ``sluice.adapters.dynamo.slots`` tests ``attribute_exists(holders)`` first, a condition that reads
  the same on DynamoDB; it stays in Sluice's code because the demo's moto needs it too.
"""

from __future__ import annotations

import base64
import copy
import functools
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import moto.dynamodb.models as ddb_models
import moto.dynamodb.models.table as ddb_table
import moto.sqs.models as sqs_models
import moto.sqs.responses as sqs_responses
import moto.stepfunctions.responses as sfn_responses
from botocore.utils import merge_dicts
from moto.core import DEFAULT_ACCOUNT_ID
from moto.core import serialize as moto_serialize
from moto.core.botocore_stubber import BotocoreStubber
from moto.core.utils import MISSING
from moto.core.utils import get_value as moto_get_value
from moto.dynamodb.models.dynamo_type import DynamoType, Item, deserializer, serializer
from moto.dynamodb.models.table import Table
from moto.dynamodb.models.utilities import find_nested_key

REGION = "us-east-1"  # tests.support.aws's
_LOCK = threading.RLock()  # one lock for every adjustment: re-entered, never nested in another

# -- serialised DynamoDB items ------------------------------------------------------------------------

_OPERATIONS = (
    "put_item",
    "get_item",
    "batch_get_item",
    "update_item",
    "delete_item",
    "transact_write_items",
    "query",
    "scan",
)
# Operations whose answer holds the stored items (UpdateItem and PutItem answer the item they wrote).
_ANSWER_STORED_ITEMS = ("get_item", "put_item", "update_item", "batch_get_item", "query", "scan")


def serialise_dynamodb() -> None:
    """Run moto's DynamoDB item operations under one lock, from now on (idempotent)."""
    for name in _OPERATIONS:
        original = getattr(ddb_models.DynamoDBBackend, name)
        if getattr(original, "_sluice_serialised", False):
            continue

        @functools.wraps(original)
        def locked(
            self: Any,
            *args: Any,
            __original: Any = original,
            __copy: bool = name in _ANSWER_STORED_ITEMS,
            **kwargs: Any,
        ) -> Any:
            with _LOCK:
                found = __original(self, *args, **kwargs)
                # These answer the stored items themselves, written out after the lock is let go: a
                # copy, so a write from another thread cannot change one mid-answer ("dictionary
                # changed size during iteration" in Item.to_json). One thread needs none.
                if __copy and found is not None and threading.active_count() > 1:
                    return copy.deepcopy(found)
                return found

        locked._sluice_serialised = True  # type: ignore[attr-defined]
        setattr(ddb_models.DynamoDBBackend, name, locked)


# -- projected scans ------------------------------------------------------------------------------------

_LIST_ELEMENT = re.compile(r"(.+)\[(\d+)\]$")  # find_nested_key's 'name[3]'


class _ItemCopyIsTheItem:
    """``copy`` as ``moto.dynamodb.models.table`` sees it during a projected scan: an item "copies"
    to itself (the projection then builds new objects from it)."""

    def deepcopy(self, value: Any, memo: Any = None) -> Any:
        if isinstance(value, Item):
            return value
        return copy.deepcopy(value, memo)

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)


def _project(self: Item, projection_expressions: list[list[str]]) -> Item:
    """``Item.project``, converting only the attribute each path starts with (``find_nested_key``
    reads nothing else of the item), each time afresh as moto does."""
    result: dict[str, Any] = {}
    for expr in projection_expressions:
        match = _LIST_ELEMENT.match(expr[0])
        top = match.group(1) if match else expr[0]
        attribute = self.attrs.get(top)
        plain = {} if attribute is None else {top: deserializer.deserialize(attribute.to_regular_json())}
        merge_dicts(result, find_nested_key(expr, plain))
    return Item(hash_key=self.hash_key, range_key=self.range_key, attrs=serializer.serialize(result)["M"])


def projected_scans() -> None:
    """Project a scan's items from the stored ones, from now on (idempotent)."""
    original = Table.scan
    if getattr(original, "_sluice_projected", False):
        return

    @functools.wraps(original)
    def scan(
        self: Table,
        filters: Any,
        limit: Any,
        exclusive_start_key: Any,
        filter_expression: Any = None,
        index_name: str | None = None,
        consistent_read: bool = False,
        projection_expression: Any = None,
        segments: Any = (None, None),
    ) -> Any:
        args = (filters, limit, exclusive_start_key, filter_expression, index_name, consistent_read)
        if not projection_expression or index_name:
            return original(self, *args, projection_expression, segments)
        with _LOCK:
            saved, ddb_table.copy = ddb_table.copy, _ItemCopyIsTheItem()  # type: ignore[assignment]
            try:
                return original(self, *args, projection_expression, segments)
            finally:
                ddb_table.copy = saved  # type: ignore[assignment]

    scan._sluice_projected = True  # type: ignore[attr-defined]
    Table.scan = scan  # type: ignore[method-assign]
    Item.project = _project  # type: ignore[method-assign]


# -- response keys looked up once ---------------------------------------------------------------------


def cached_response_keys() -> None:
    """Work out the keys a response's plain dicts may hold a member under once per response and
    member, from now on (idempotent)."""
    serializer = moto_serialize.ResponseSerializer
    original = serializer._serialize_structure_member
    if getattr(original, "_sluice_cached", False):
        return

    @functools.wraps(original)
    def member(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        picker = self._value_picker
        if type(value) is not dict or type(picker) is not XFormed or picker.response_transformers:
            return original(self, serialized, value, shape, key)
        cache = picker.__dict__.setdefault("_sluice_keys", {})
        entry = cache.get((id(shape), key))
        if entry is None or entry[0] is not shape:
            context = moto_serialize.AttributePickerContext(
                obj=value,
                key=key,
                shape=shape,
                operation_model=self.operation_model,
                service_model=self.operation_model.service_model,
                key_path=".".join(self.path),
            )
            entry = (shape, tuple(picker.get_possible_keys(context)))  # the shape kept: its id stays its own
            cache[(id(shape), key)] = entry
        member_value = None
        for possible_key in entry[1]:
            found = (
                moto_get_value(value, possible_key, MISSING)
                if "." in possible_key
                else value.get(possible_key, MISSING)
            )
            if found is not MISSING:
                member_value = found
                break
        if member_value is not None:
            self._serialize(serialized, member_value, shape, key)

    XFormed = moto_serialize.XFormedAttributePicker
    member._sluice_cached = True  # type: ignore[attr-defined]
    serializer._serialize_structure_member = member  # type: ignore[method-assign]


def redrive_filter() -> None:
    """Answer ListExecutions' ``redriveFilter`` as AWS does, from now on (idempotent)."""
    original = sfn_responses.StepFunctionResponse.list_executions
    if getattr(original, "_sluice_redrive_filter", False):
        return

    @functools.wraps(original)
    def listed(self: Any) -> Any:
        answer = original(self)
        wanted = self._get_param("redriveFilter")
        if wanted in ("REDRIVEN", "NOT_REDRIVEN"):
            machine = self.stepfunction_backend.describe_state_machine(self._get_param("stateMachineArn"))
            count = {e.execution_arn: getattr(e, "redrive_count", 0) for e in machine.executions}
            answer.result["executions"] = [
                e
                for e in answer.result["executions"]
                if (count.get(e["executionArn"], 0) > 0) == (wanted == "REDRIVEN")
            ]
        return answer

    listed._sluice_redrive_filter = True  # type: ignore[attr-defined]
    sfn_responses.StepFunctionResponse.list_executions = listed  # type: ignore[method-assign]


def dead_letter_source() -> None:
    """Tag a message moved to a dead-letter queue with its source queue's ARN and answer it as
    ``DeadLetterQueueSourceArn``, as SQS does, from now on (idempotent)."""
    original = sqs_models.SQSBackend.receive_message
    if getattr(original, "_sluice_source", False):
        return

    @functools.wraps(original)
    def receive(self: Any, queue_name: str, *args: Any, **kwargs: Any) -> Any:
        queue = self.get_queue(queue_name)
        before = list(queue._messages)
        got = original(self, queue_name, *args, **kwargs)
        dlq = queue.dead_letter_queue
        if dlq is not None:
            moved = {id(m) for m in dlq._messages}
            for message in before:
                if id(message) in moved and not hasattr(message, "sluice_source_arn"):
                    message.sluice_source_arn = queue.queue_arn
        return got

    answer_original = sqs_responses.SQSResponse.receive_message

    @functools.wraps(answer_original)
    def answered(self: Any) -> Any:
        answer = answer_original(self)
        wanted = set(
            self._get_param("AttributeNames", []) + self._get_param("MessageSystemAttributeNames", [])
        )
        if not wanted & {"All", "DeadLetterQueueSourceArn"}:
            return answer
        queue = self.sqs_backend.get_queue(self._get_queue_name())
        sources = {m.id: getattr(m, "sluice_source_arn", None) for m in queue._messages}
        for msg in answer.result.get("Messages", []):
            if sources.get(msg["MessageId"]):
                msg.setdefault("Attributes", {})["DeadLetterQueueSourceArn"] = sources[msg["MessageId"]]
        return answer

    receive._sluice_source = True  # type: ignore[attr-defined]
    sqs_models.SQSBackend.receive_message = receive  # type: ignore[method-assign]
    sqs_responses.SQSResponse.receive_message = answered  # type: ignore[method-assign]


# -- atomic requests and cheap rollbacks --------------------------------------------------------------

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


_MOTO_TRANSACT = ddb_models.DynamoDBBackend.transact_write_items


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
        _MOTO_TRANSACT(self, transact_items)
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


def cheap_rollbacks() -> None:
    """From now on, a transaction copies the items it touches, not its table (idempotent). Called
    before ``serialise_dynamodb``, whose lock then holds the copies and the transaction together."""
    installed = ddb_models.DynamoDBBackend.transact_write_items
    assert not getattr(installed, "_sluice_serialised", False), (
        "cheap_rollbacks() before serialise_dynamodb()"
    )
    ddb_models.DynamoDBBackend.transact_write_items = _transact_with_item_snapshots  # type: ignore[method-assign]
    ddb_models.copy = _TableCopyIsFree()  # type: ignore[assignment]


@contextmanager
def atomic_fast_moto() -> Iterator[None]:
    """Serialise moto requests for the duration of the block (rollbacks are cheap for the whole
    session: ``cheap_rollbacks``)."""
    global _depth
    with _LOCK:
        if _depth == 0:
            _original.update(call=BotocoreStubber.__call__)
            BotocoreStubber.__call__ = _serialized_call  # type: ignore[method-assign]
        _depth += 1
    try:
        yield
    finally:
        with _LOCK:
            _depth -= 1
            if _depth == 0:
                BotocoreStubber.__call__ = _original["call"]  # type: ignore[method-assign]


# -- reading a table in place ---------------------------------------------------------------------------


def _as_scanned(value: DynamoType) -> dict[str, Any]:
    """One attribute value as boto3's Scan returns it (numbers as text, binaries as bytes)."""
    kind, raw = value.type, value.value
    if kind == "L":
        return {"L": [_as_scanned(v) for v in raw]}
    if kind == "M":
        return {"M": {k: _as_scanned(v) for k, v in raw.items()}}
    if kind == "B":
        return {"B": raw if isinstance(raw, bytes) else base64.b64decode(raw)}
    if kind == "BS":
        return {"BS": [v if isinstance(v, bytes) else base64.b64decode(v) for v in raw]}
    if kind in ("SS", "NS"):
        return {kind: list(raw)}
    return {kind: raw}


def scanned_items(table_name: str, attributes: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """What a consistent Scan of ``table_name`` (on moto, default account and region) returns, every
    page, with only ``attributes`` when given, read from moto's table at one instant (under the lock
    every DynamoDB operation takes) instead of through a request: a test's observation of the table,
    made after every action of the reliability suite, without the request's serialisation."""
    wanted = set(attributes)
    with _LOCK:
        table = ddb_models.dynamodb_backends[DEFAULT_ACCOUNT_ID][REGION].get_table(table_name)
        return [
            {k: _as_scanned(v) for k, v in item.attrs.items() if not wanted or k in wanted}
            for item in table.all_items()
        ]
