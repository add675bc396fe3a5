"""``sluice enqueue``: send payloads in chunks, say exactly where sending stopped."""

from __future__ import annotations

import functools
import os
import re
import sys
from typing import Any

from sluice.cli.context import Context
from sluice.cli.render import EXIT_AWS, EXIT_CONFIG, EXIT_OK, EXIT_PARTIAL, progress_bar, usage
from sluice.core.errors import SluiceError, TransientError
from sluice.core.validation import content_hash, parse_object
from sluice.enqueue import EnqueueReport, LauncherWake, enqueue, read_items
from sluice.features.lanes import DEFAULT_LANE
from sluice.features.pointers import MAX_STORED_BYTES
from sluice.ops.awaits import known_waiters

ENQUEUE_CHUNK = 100  # items per enqueue call: a failure names the first item not sent
PROGRESS_FROM = 50  # items; fewer are sent without a progress bar
DEDUP_ID = re.compile(r"^[!-~]{1,128}$")
LAUNCHER_ENV = "SLUICE_LAUNCHER_FUNCTION"  # the launcher to wake: its name or ARN
LAUNCHER_ARN_OUTPUT = "LauncherFunctionArn"  # the stack's output naming it


def cmd_enqueue(ctx: Context) -> int:
    args = ctx.args
    ctx.settings.require("queue_url")
    queue_url = ctx.lane_queue_url(args.lane)  # an unknown lane: nothing is read, nothing sent
    if args.file == "-":
        text = sys.stdin.read()
    else:
        with open(args.file, encoding="utf-8") as handle:
            text = handle.read()
    items = list(read_items(text))
    refused = _dedup_id_refused(args.dedup_id, len(items))
    if refused:
        return usage(refused)
    report, unsent, error = _send(ctx, queue_url, items)
    for where, reason in report.failed:
        print(f"sluice enqueue: {where}: {reason}", file=sys.stderr)
    if unsent:
        print(f"sluice enqueue: {unsent}", file=sys.stderr)
    if report.wake_failed:
        print(
            f"sluice enqueue: the launcher was not woken ({report.wake_failed}); the payloads sent start "
            "at its next scheduled tick",
            file=sys.stderr,
        )
    repeats = _repeats(items, {w for w, _, _ in report.sent}) if args.dedup_id is None else 0
    ctx.out(
        _human(report, len(items), args.lane, repeats, ctx.settings.payload_bucket),
        {
            "total": len(items),
            "sent": [
                {
                    "where": w,
                    "key": k,
                    "message_id": m,
                    **({"stored": report.stored[w]} if w in report.stored else {}),
                }
                for w, k, m in report.sent
            ],
            "failed": [{"where": w, "reason": r} for w, r in report.failed],
            "unsent": unsent or None,
            "repeats": repeats,
            "woken": report.woken,
            "wake_failed": report.wake_failed or None,
            **({"lane": args.lane} if args.lane != DEFAULT_LANE else {}),
        },
    )
    if unsent:
        return EXIT_AWS if isinstance(error, TransientError) else EXIT_CONFIG
    return EXIT_OK if report.ok else EXIT_PARTIAL


def _fair(ctx: Context, lane: str) -> bool:
    """Whether ``lane`` is fair, when the stack's lanes can be read. A producer allowed to send and
    nothing more cannot read them: its messages keep one group per payload, which a fair lane still
    shares out, only later (``--group-by`` a tenant field does what this does)."""
    try:
        return any(one.fair and one.name == lane for one in ctx.lanes())
    except SluiceError:
        return False


def _dedup_id_refused(dedup_id: str | None, count: int) -> str | None:
    """Why ``--dedup-id`` cannot be used here, or None."""
    if dedup_id is None:
        return None
    if not DEDUP_ID.match(dedup_id):
        return "--dedup-id must be 1 to 128 printable ASCII characters without spaces"
    if count > 1:
        return (
            f"--dedup-id gives every payload the same deduplication id, so SQS would keep only the first "
            f"of these {count}; use it with a single payload"
        )
    return None


def _send(ctx: Context, queue_url: str, items: list[Any]) -> tuple[EnqueueReport, str, SluiceError | None]:
    """Send ``items`` in chunks: the report, and where sending stopped (with why) if it did."""
    args = ctx.args
    # A body over the threshold goes to the stack's payload bucket, and its pointer to the queue.
    payloads = ctx.runtime.payload_objects()
    threshold = ctx.settings.pointer_threshold if args.pointer_threshold is None else args.pointer_threshold
    send = functools.partial(
        enqueue,
        key_field=args.key_field,
        group_by=args.group_by,
        dedup_id=args.dedup_id,
        payloads=payloads,
        threshold=threshold,
        once=args.once,
        after=tuple(args.after),
        run_anyway=args.on_await_failure == "run",
        known=_known_awaits(ctx) if args.after else {},
        concurrency_key=args.concurrency_key,
        concurrency_key_field=args.concurrency_key_field,
        lane=args.lane,
        fair=_fair(ctx, args.lane),
        wake=_launcher_wake(ctx),
    )
    report = EnqueueReport()
    with progress_bar(len(items), quiet=args.json or len(items) < PROGRESS_FROM) as advance:
        for start in range(0, len(items), ENQUEUE_CHUNK):
            chunk = items[start : start + ENQUEUE_CHUNK]
            try:
                part = send(ctx.runtime.client("sqs"), queue_url, chunk, progress=advance)
            except SluiceError as exc:
                # Earlier chunks went; say exactly where sending stopped. Re-sending the whole input
                # within 5 minutes is safe: SQS drops what it already has (same deduplication ids).
                return report, f"{chunk[0].where} and after were not sent: {exc}", exc
            report.sent.extend(part.sent)
            report.failed.extend(part.failed)
            report.stored.update(part.stored)
            report.woken += part.woken
            if part.sent:  # the last wake is the one that counts: it also wakes for earlier chunks
                report.wake_failed = part.wake_failed
            if part.stopped is not None:
                return report, f"{part.unsent_from} and after were not sent: {part.stopped}", part.stopped
    return report, "", None


def _launcher_wake(ctx: Context) -> LauncherWake | None:
    """What wakes the launcher after each chunk sent: ``SLUICE_LAUNCHER_FUNCTION``, else the stack's
    output; None with ``--no-wake`` or when neither names it (a producer that named its queue alone)."""
    if not ctx.args.wake:
        return None
    function = os.environ.get(LAUNCHER_ENV, "").strip() or ctx.outputs.get(LAUNCHER_ARN_OUTPUT, "")
    return LauncherWake.of(ctx.runtime.client("lambda"), function) if function else None


def _human(report: EnqueueReport, total: int, lane: str, repeats: int, bucket: str | None) -> str:
    human = f"sent {len(report.sent)} of {total} payloads"
    if lane != DEFAULT_LANE:
        human += f" to lane {lane}"
    stored = [(w, report.stored[w]) for w, _, _ in report.sent if w in report.stored]
    if stored:
        human += f"; {len(stored)} stored in s3://{bucket} and sent as pointers"
    if report.woken:
        human += "; the launcher was woken"
    if report.failed:
        human += f"; {len(report.failed)} refused (see above)"
    if repeats:
        human += (
            f"; {repeats} repeated an earlier payload of this input, so SQS accepted and dropped them "
            "(same deduplication id within 5 minutes)"
        )
    return human


def _known_awaits(ctx: Context) -> dict[str, list[str]]:
    """What the parked waiters await, by key: ``sluice enqueue --after`` refuses a cycle through them."""
    if not ctx.settings.table_name:
        return {}
    edges: dict[str, list[str]] = {}
    for w in known_waiters(ctx.runtime):
        edges.setdefault(w.key, []).extend(w.awaits)
    return edges


def _repeats(items: list[Any], sent: set[str]) -> int:
    """How many sent items have the content of an earlier one: same deduplication id, one message."""
    seen: set[str] = set()
    repeats = 0
    for item in items:
        if item.where not in sent:
            continue
        digest = content_hash(parse_object(item.body, max_bytes=MAX_STORED_BYTES))
        repeats += digest in seen
        seen.add(digest)
    return repeats
