"""Producer side: read payloads (one JSON object, a JSON array, or JSON Lines), validate each, and
send the valid ones to the FIFO queue in batches of 10.

Every item is checked with the launcher's own rules first, so an item the launcher would
dead-letter is refused here with the line it came from. Valid items are sent even when others
fail; the report says which failed and why.

With a ``LauncherWake``, the stack's launcher is woken once the payloads are sent (an asynchronous
invoke): a payload enqueued while slots are free starts in about a second, not at the next scheduled
tick, without a launcher that lingers between ticks.

A payload whose body is over the threshold (``sluice.features.pointers.DEFAULT_THRESHOLD`` unless given) is
stored in the stack's payload bucket first, and the message carries its pointer instead, with the
key, group and deduplication id the payload itself would have had.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sluice.adapters.aws.deployment import Functions
from sluice.adapters.errors import translated
from sluice.core.errors import InvalidPayload, SluiceError
from sluice.core.events import WAKE_EVENT
from sluice.core.validation import (
    KEY_ATTRIBUTE,
    MAX_INPUT_BYTES,
    check_key,
    content_hash,
    json_structure,
    parse_object,
    payload_key,
)
from sluice.features.awaits import (
    AWAITS_ATTRIBUTE,
    ON_FAILURE_ATTRIBUTE,
    RUN_ANYWAY,
    check_awaits,
)
from sluice.features.fair import UNKEYED
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE
from sluice.features.lanes import DEFAULT_LANE, LANE_ATTRIBUTE
from sluice.features.pointers import DEFAULT_THRESHOLD, MAX_STORED_BYTES, PayloadObjects, store
from sluice.features.receipts import ONCE_ATTRIBUTE

BATCH = 10
BATCH_BYTES = MAX_INPUT_BYTES  # SendMessageBatch: the sum of the bodies
GROUP_ID = re.compile(r"^[!-~]{1,128}$")  # SQS: 1-128 printable ASCII characters


@dataclass(frozen=True, slots=True)
class Item:
    """One payload read from the input. ``where`` names it for error messages ("line 3")."""

    where: str
    body: str


@dataclass(frozen=True, slots=True)
class Prepared:
    where: str
    body: str
    key: str
    group_id: str
    dedup_id: str
    size: int = 0  # of the body, in bytes of UTF-8
    ckey: str | None = None  # its concurrency key (sluice.features.keys)


@dataclass(frozen=True, slots=True)
class LauncherWake:
    """Wake the stack's launcher (its name or ARN: the stack output ``LauncherFunctionArn``) after a
    send. The woken launcher receives only while slots are free, so a wake while every slot is held
    costs one short invocation, one read and its turn's two writes (``sluice.features.wake``). Needs
    ``lambda:InvokeFunction`` on it (the stack's producer policy has it)."""

    functions: Functions
    function: str

    @classmethod
    def of(cls, lambda_client: Any, function: str) -> LauncherWake:
        return cls(Functions(lambda_client), function)

    def __call__(self) -> None:
        self.functions.invoke_async(self.function, WAKE_EVENT)


@dataclass
class EnqueueReport:
    sent: list[tuple[str, str, str]] = field(default_factory=list)  # (where, key, message id)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (where, reason)
    stored: dict[str, str] = field(default_factory=dict)  # where → s3:// URI, for payloads sent as pointers
    woken: int = 0  # wakes the launcher accepted
    wake_failed: str = ""  # why the last wake failed: the payloads wait for the next scheduled tick
    stopped: SluiceError | None = None  # AWS refused a send: nothing from ``unsent_from`` on was sent
    unsent_from: str = ""  # the first item not sent (``where``), when ``stopped``

    @property
    def ok(self) -> bool:
        return not self.failed


def read_items(text: str) -> Iterator[Item]:
    """Split input into items: a JSON array gives its elements, one JSON value gives itself,
    anything else is read as JSON Lines (blank lines skipped). Parsing errors surface in ``prepare``,
    item by item: an element Python cannot build (a number of more than 4,300 digits, nesting past
    the recursion limit) is one bad item, its neighbours are sent."""
    stripped = text.strip()
    if not stripped:
        return
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        pass
    except (ValueError, RecursionError):
        # Well-formed as far as the parser went, but one value cannot be built: split by structure.
        if _one_value(stripped):
            elements = _elements(stripped)
            if elements is None:
                yield Item("line 1", stripped)
            else:
                yield from (Item(f"item {i}", body) for i, body in enumerate(elements, start=1))
            return
    else:
        if isinstance(whole, list):
            for i, element in enumerate(whole, start=1):
                yield Item(f"item {i}", json.dumps(element, ensure_ascii=False, separators=(",", ":")))
        else:
            yield Item("line 1", stripped)
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield Item(f"line {lineno}", line.strip())


def _one_value(text: str) -> bool:
    """Whether ``text`` (stripped) is one bracketed value, its first bracket closed by its last character."""
    if text[:1] not in ("[", "{"):
        return False
    for i, depth, c in json_structure(text):
        if depth == 0 and c in "]}":
            return i == len(text) - 1
    return False


def _elements(text: str) -> list[str] | None:
    """The elements of a JSON array (``text``, one value) as written, split at its top-level commas;
    None when it is not an array."""
    if not text.startswith("["):
        return None
    out: list[str] = []
    start = 1
    for i, depth, c in json_structure(text):
        if (c == "," and depth == 1) or (c == "]" and depth == 0):
            out.append(text[start:i].strip())
            start = i + 1
    if out == [""]:
        return []
    # A body JSON can read again is written compactly, as for an array read whole.
    return [_compact(body) for body in out]


def _compact(body: str) -> str:
    try:
        return json.dumps(json.loads(body), ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):
        return body


def prepare(
    item: Item,
    *,
    key_field: str | None = None,
    group_by: str | None = None,
    dedup_id: str | None = None,
    max_bytes: int = MAX_INPUT_BYTES,
    concurrency_key: str | None = None,
    concurrency_key_field: str | None = None,
    fair_lane: str | None = None,
) -> Prepared:
    try:
        obj = parse_object(item.body, max_bytes=max_bytes)
    except InvalidPayload as exc:
        if max_bytes == MAX_INPUT_BYTES and exc.reason.startswith("payload is "):
            exc.reason += (
                " (with the stack's payload bucket, SLUICE_PAYLOAD_BUCKET, it would be stored there)"
            )
        raise
    key = payload_key(obj, key_field=key_field)
    ckey = _concurrency_key(obj, concurrency_key, concurrency_key_field)
    if fair_lane is not None and group_by is None:
        # A fair lane's tenant in one group: SQS skips it while its messages are in hand, so the
        # launcher's next receive surfaces another tenant (sluice.features.fair).
        group = _safe_group(ckey or UNKEYED + fair_lane)
    else:
        group = _group_id(obj, key, group_by)
    size = len(item.body.encode("utf-8"))
    return Prepared(item.where, item.body, key, group, dedup_id or content_hash(obj), size, ckey)


def _concurrency_key(obj: dict[str, Any], given: str | None, field_name: str | None) -> str | None:
    if given is not None:
        return check_key(given, source="--concurrency-key")
    if field_name is None:
        return None
    value = obj.get(field_name)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)) or value == "":
        raise InvalidPayload(
            f"field {field_name!r} (--concurrency-key-field) is {'missing' if value is None else repr(value)[:60]}; "
            "it needs a non-empty string or a number"
        )
    return check_key(value if isinstance(value, str) else json.dumps(value), source=f"field {field_name!r}")


def enqueue(
    sqs: Any,
    queue_url: str,
    items: list[Item],
    *,
    key_field: str | None = None,
    group_by: str | None = None,
    dedup_id: str | None = None,
    progress: Callable[[int], None] | None = None,
    payloads: PayloadObjects | None = None,
    threshold: int = DEFAULT_THRESHOLD,
    once: bool = False,
    after: tuple[str, ...] = (),
    run_anyway: bool = False,
    known: Mapping[str, Iterable[str]] | None = None,
    concurrency_key: str | None = None,
    concurrency_key_field: str | None = None,
    lane: str = DEFAULT_LANE,
    fair: bool = False,
    wake: Callable[[], None] | None = None,
) -> EnqueueReport:
    """Send ``items``. With ``payloads`` (the stack's bucket), a body over ``threshold`` bytes is stored
    there and sent as a pointer; without it, such a body is sent as it is, up to 262,144 bytes.

    ``queue_url`` is the queue of ``lane`` (``sluice.features.lanes``); a message of a lane other than the
    default carries ``sluice-lane`` too. The launcher goes by the queue, not the attribute, but a
    message SQS moves to the dead-letter queue keeps it, and ``sluice dlq redrive`` sends it back
    to its lane's queue by it. ``fair``: ``lane`` is fair, so each message goes in its tenant's
    message group (its concurrency key, else ``lane:<lane>``) unless ``group_by`` says otherwise.

    When AWS refuses a send (throttling past the SDK's retries, a queue that went away), sending
    stops there: ``report.stopped`` says why and ``report.unsent_from`` names the first item not
    sent; the report holds what was sent before it. ``wake`` (a ``LauncherWake``) is called once
    after the sends when any payload was sent, also then. A wake that fails fails nothing: the
    payloads are in the queue and start at the next scheduled tick; ``report.wake_failed`` says why."""
    report = EnqueueReport()
    ready = _prepare_all(
        items,
        report,
        key_field=key_field,
        group_by=group_by,
        dedup_id=dedup_id,
        max_bytes=MAX_STORED_BYTES if payloads is not None else MAX_INPUT_BYTES,
        concurrency_key=concurrency_key,
        concurrency_key_field=concurrency_key_field,
        fair_lane=lane if fair else None,
    )
    if after:
        ready = _acyclic(ready, after, known or {}, report)
    extra = _shared_attributes(after, run_anyway, lane)
    if payloads is not None:
        ready = [_stored(p, payloads, report) if p.size > threshold else p for p in ready]
    _send_all(sqs, queue_url, ready, once, extra, report, progress)
    if wake is not None and report.sent:
        _wake(wake, report)
    return report


def _prepare_all(items: list[Item], report: EnqueueReport, **options: Any) -> list[Prepared]:
    """Each item ``prepare``d with ``options``; one that is not valid goes to ``report.failed``."""
    ready: list[Prepared] = []
    for item in items:
        try:
            ready.append(prepare(item, **options))
        except InvalidPayload as exc:
            report.failed.append((item.where, exc.reason))
    return ready


def _send_all(
    sqs: Any,
    queue_url: str,
    ready: list[Prepared],
    once: bool,
    extra: dict[str, dict[str, str]],
    report: EnqueueReport,
    progress: Callable[[int], None] | None,
) -> None:
    """Send ``ready`` in batches until AWS refuses one (``report.stopped``); ``extra``: the attributes
    every message carries."""
    for batch in _batches(ready):
        try:
            _send(sqs, queue_url, batch, [_entry(i, p, once, extra) for i, p in enumerate(batch)], report)
        except SluiceError as exc:
            report.stopped, report.unsent_from = exc, batch[0].where
            return
        if progress:
            progress(len(batch))


def _wake(wake: Callable[[], None], report: EnqueueReport) -> None:
    try:
        wake()
    except Exception as exc:  # the payloads are sent whatever the wake does: say why, fail nothing
        report.wake_failed = str(exc) if isinstance(exc, SluiceError) else f"{type(exc).__name__}: {exc}"
    else:
        report.woken += 1


def _shared_attributes(after: tuple[str, ...], run_anyway: bool, lane: str) -> dict[str, dict[str, str]]:
    """The message attributes every message of the call carries: the keys it awaits (sluice.features.awaits),
    whether it runs anyway when one fails, its lane (sluice.features.lanes)."""
    extra: dict[str, dict[str, str]] = {}
    if after:
        extra[AWAITS_ATTRIBUTE] = {
            "DataType": "String",
            "StringValue": json.dumps(list(dict.fromkeys(after))),
        }
        if run_anyway:
            extra[ON_FAILURE_ATTRIBUTE] = {"DataType": "String", "StringValue": RUN_ANYWAY}
    if lane != DEFAULT_LANE:
        extra[LANE_ATTRIBUTE] = {"DataType": "String", "StringValue": lane}
    return extra


def _entry(i: int, p: Prepared, once: bool, extra: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The SendMessageBatch entry of ``p``, the batch's ``i``-th."""
    return {
        "Id": str(i),
        "MessageBody": p.body,
        "MessageGroupId": p.group_id,
        "MessageDeduplicationId": p.dedup_id,
        "MessageAttributes": {
            KEY_ATTRIBUTE: {"DataType": "String", "StringValue": p.key},
            # run the key successfully at most once (sluice.features.receipts)
            **({ONCE_ATTRIBUTE: {"DataType": "String", "StringValue": "true"}} if once else {}),
            **extra,  # the keys it awaits (sluice.features.awaits), its lane (sluice.features.lanes)
            # how many of its concurrency key run at once (sluice.features.keys)
            **(
                {CONCURRENCY_KEY_ATTRIBUTE: {"DataType": "String", "StringValue": p.ckey}}
                if p.ckey is not None
                else {}
            ),
        },
    }


def _send(
    sqs: Any, queue_url: str, batch: list[Prepared], entries: list[dict[str, Any]], report: EnqueueReport
) -> None:
    """Send one batch (``entries``, one for each of ``batch``); each message goes to ``report`` as
    sent, or as failed with SQS's reason."""
    with translated("SendMessageBatch"):
        response = sqs.send_message_batch(QueueUrl=queue_url, Entries=entries)
    for ok in response.get("Successful", []):
        p = batch[int(ok["Id"])]
        report.sent.append((p.where, p.key, ok["MessageId"]))
    for bad in response.get("Failed", []):
        p = batch[int(bad["Id"])]
        report.failed.append((p.where, f"SQS refused it: {bad.get('Code')}: {bad.get('Message', '')}"))


def _acyclic(
    ready: list[Prepared], after: tuple[str, ...], known: Mapping[str, Iterable[str]], report: EnqueueReport
) -> list[Prepared]:
    """Refuse each payload whose awaits would close a cycle, among the keys enqueued here and the
    waiters already parked (``known``): it could never start."""
    edges: dict[str, list[str]] = {k: list(v) for k, v in known.items()}
    for p in ready:
        edges.setdefault(p.key, []).extend(after)
    kept = []
    for p in ready:
        try:
            check_awaits(list(after), key=p.key)
        except InvalidPayload as exc:
            report.failed.append((p.where, exc.reason))
            continue
        cycle = find_cycle(edges, p.key)
        if cycle is not None:
            report.failed.append((p.where, "awaits cycle: " + " → ".join(cycle) + "; it could never start"))
            continue
        kept.append(p)
    return kept


def _stored(p: Prepared, payloads: PayloadObjects, report: EnqueueReport) -> Prepared:
    """Store the payload in the bucket (under its SHA-256: a repeat writes the same object) and
    send its pointer, with the payload's key, group and deduplication id."""
    pointer = store(payloads, p.body.encode("utf-8"))
    report.stored[p.where] = pointer.uri
    body = pointer.body(p.key)
    return replace(p, body=body, size=len(body.encode("utf-8")))


def _group_id(obj: dict[str, Any], key: str, group_by: str | None) -> str:
    if group_by is not None:
        value = obj.get(group_by)
        if value is None or isinstance(value, dict | list) or value == "":
            raise InvalidPayload(f"group field {group_by!r} is missing or not a string or number")
        group = str(value)
    else:
        group = key
    return _safe_group(group)


def _safe_group(group: str) -> str:
    """SQS group ids are 1-128 printable ASCII characters; anything else maps to a stable hash."""
    return group if GROUP_ID.match(group) else hashlib.sha256(group.encode("utf-8")).hexdigest()


def _batches(items: list[Prepared]) -> Iterator[list[Prepared]]:
    batch: list[Prepared] = []
    size = 0
    for p in items:
        n = p.size or len(p.body.encode("utf-8"))
        if batch and (len(batch) == BATCH or size + n > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(p)
        size += n
    if batch:
        yield batch


def find_cycle(edges: Mapping[str, Iterable[str]], start: str) -> list[str] | None:
    """A path start → … → start through ``edges`` (key → the keys it awaits), or None."""
    stack: list[tuple[str, list[str]]] = [(a, [start, a]) for a in edges.get(start, ())]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        if node == start:
            return path
        if node in seen:
            continue
        seen.add(node)
        stack.extend((a, [*path, a]) for a in edges.get(node, ()))
    return None
