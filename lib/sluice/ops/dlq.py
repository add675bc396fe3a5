"""The dead-letter queue: list, redrive, delete.

Listing receives with a short visibility timeout and makes every listed message visible again at the
end: nothing is consumed. A FIFO queue hides the rest of a message group while any of its messages is
in flight, so a listing sees at most the first 10 messages of each group. Redrive sends the original
body back to the main queue (same group, same attributes less Sluice's annotations) with the
deduplication id ``redrive-<DLQ message id>``, and deletes the DLQ message only once the send
succeeded. Run twice within SQS's 5-minute deduplication window (say after a crash between send and
delete), the second send is dropped by SQS. A copy sent back runs under the execution name of the
message it came from (``sluice.adapters.aws.sqs_dead_letters.logical_id``): it runs at most once,
however often it is redriven; ``new_name`` sends it as a new message.

With lanes (``sluice.features.lanes``), each message goes back to its lane's queue: the queue SQS moved it
from (``DeadLetterQueueSourceArn``), else its ``sluice-lane`` attribute (Sluice's own dead letters
and the messages ``sluice enqueue --lane`` sent carry it), else the default lane's. A lane whose
queue is not known here (a lane removed from the stack, or SLUICE_* variables without
SLUICE_LANE_QUEUES) is not guessed: the message stays in the DLQ, unless ``lane`` names the lane to
send it to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from sluice.adapters.aws.sqs_dead_letters import (
    MOVED_BY_SQS,
    DeadLetterQueue,
    DlqMessage,
    Resend,
    queue_name,
    redrive_dedup_id,
)
from sluice.core.errors import ConfigurationError, TransientError
from sluice.features.lanes import DEFAULT_LANE
from sluice.launch.settings import Settings
from sluice.runtime import Runtime

__all__ = [
    "MOVED_BY_SQS",
    "DlqListing",
    "DlqMessage",
    "DlqReport",
    "dlq_counts",
    "dlq_delete",
    "dlq_list",
    "dlq_redrive",
    "redrive_dedup_id",
    "redrive_lane",
]


def dlq_counts(rt: Runtime) -> tuple[int, int]:
    """The DLQ's approximate (visible, in flight) message counts."""
    counts = rt.dead_letters().counts()
    return counts.visible, counts.in_flight


@dataclass
class DlqListing:
    messages: list[DlqMessage]
    visible: int  # ApproximateNumberOfMessages before listing
    in_flight: int  # ApproximateNumberOfMessagesNotVisible before listing (hidden from this listing)


def dlq_list(rt: Runtime, *, limit: int = 100) -> DlqListing:
    rt.settings.require("dlq_url")
    dlq = rt.dead_letters()
    counts = dlq.counts()
    seen: dict[str, DlqMessage] = {}
    received: list[DlqMessage] = []
    try:
        while len(seen) < limit:
            got = dlq.peek(limit - len(seen))
            if not got:
                break
            received.extend(got)
            for m in got:
                seen.setdefault(m.message_id, m)
    finally:
        dlq.show_again(received)
    messages = sorted(seen.values(), key=lambda m: (m.sent_at or 0, m.message_id))
    return DlqListing(messages=messages, visible=counts.visible, in_flight=counts.in_flight)


@dataclass
class DlqReport:
    done: list[dict[str, str]] = field(default_factory=list)  # redriven or deleted
    failed: list[dict[str, str]] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    interrupted: str | None = None  # a transient AWS error stopped the run

    @property
    def ok(self) -> bool:
        return not (self.failed or self.not_found or self.interrupted)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def dlq_redrive(
    rt: Runtime, ids: Iterable[str] | None = None, *, lane: str | None = None, new_name: bool = False
) -> DlqReport:
    """Send DLQ messages back to their lanes' queues (the main queue without lanes): those named in
    ``ids``, or every one when ``ids`` is None; with ``lane``, all to that lane's queue. Each runs
    under the execution name of the message it came from; with ``new_name``, under its own."""
    rt.settings.require("queue_url", "dlq_url")
    if lane is not None and lane != DEFAULT_LANE and lane not in rt.settings.lane_queue_urls:
        raise ConfigurationError(f"no queue known for lane {lane!r}")
    return _drain(
        rt, ids, lambda dlq, batch, report: _send_back(rt.settings, dlq, batch, report, lane, new_name)
    )


def redrive_lane(settings: Settings, m: DlqMessage) -> str:
    """The lane a DLQ message belongs to: its source queue's, else its ``sluice-lane``, else the default."""
    if m.source_queue:
        urls = {DEFAULT_LANE: settings.queue_url, **settings.lane_queue_urls}
        for name, url in urls.items():
            if queue_name(url) == m.source_queue:
                return name
    return m.lane or DEFAULT_LANE


def dlq_delete(rt: Runtime, ids: Iterable[str]) -> DlqReport:
    """Delete the named DLQ messages (once their payload was fixed and enqueued again, say)."""
    rt.settings.require("dlq_url")
    return _drain(rt, ids, lambda dlq, batch, report: [(m, {"dlq_message_id": m.message_id}) for m in batch])


Action = Callable[[DeadLetterQueue, list[DlqMessage], DlqReport], list[tuple[DlqMessage, dict[str, str]]]]


def _drain(rt: Runtime, ids: Iterable[str] | None, act: Action) -> DlqReport:
    """Receive DLQ messages and ``act`` on the selected ones; ``act`` returns those that may now be
    deleted, each with its report entry. Every other received message is made visible again, also
    when the run stops half-way (an interrupt between send and delete: a second redrive within
    5 minutes is dropped by SQS deduplication)."""
    report = DlqReport()
    dlq = rt.dead_letters()
    wanted = None if ids is None else set(ids)
    held: list[DlqMessage] = []  # received and kept: not selected, or not done
    pending: list[DlqMessage] = []  # selected and not yet deleted
    try:
        while wanted is None or wanted:
            got = dlq.peek(10)
            if not got:
                break
            pending = [m for m in got if wanted is None or m.message_id in wanted]
            chosen = {m.message_id for m in pending}
            held.extend(m for m in got if m.message_id not in chosen)
            if wanted is not None:
                wanted -= chosen
            if not pending:
                continue
            try:
                done = act(dlq, pending, report)
                deleted = dlq.delete([m for m, _ in done])
            except TransientError as exc:
                report.interrupted = str(exc)
                break
            for m, entry in done:
                if m.message_id in deleted:
                    report.done.append(entry)
                else:
                    report.failed.append({**entry, "reason": "not deleted from the DLQ: it is listed again"})
            held.extend(m for m in pending if m.message_id not in deleted)
            pending = []
    finally:
        dlq.show_again(held + pending)
    report.not_found = sorted(wanted or ())
    return report


def _send_back(
    settings: Settings,
    dlq: DeadLetterQueue,
    batch: list[DlqMessage],
    report: DlqReport,
    lane: str | None,
    new_name: bool,
) -> list[tuple[DlqMessage, dict[str, str]]]:
    by_queue: dict[str, list[Resend]] = {}  # queue URL -> its messages, in order
    for m in batch:
        target = lane or redrive_lane(settings, m)
        url = settings.queue_url if target == DEFAULT_LANE else settings.lane_queue_urls.get(target)
        if url is None:
            report.failed.append(
                {
                    "dlq_message_id": m.message_id,
                    "reason": f"its lane {target!r} has no queue known here (stack output LaneQueueUrls or "
                    "SLUICE_LANE_QUEUES): it stays in the DLQ; --lane NAME sends it to another lane's queue",
                }
            )
            continue
        by_queue.setdefault(url, []).append(Resend(m, target, new_name))
    done: list[tuple[DlqMessage, dict[str, str]]] = []
    for url, resends in by_queue.items():
        sent, refused = dlq.send_back(url, resends)
        report.failed.extend({"dlq_message_id": r.message.message_id, "reason": r.reason} for r in refused)
        for r in sent:
            entry = {"dlq_message_id": r.message.message_id, "message_id": r.message_id}
            done.append((r.message, {**entry, "lane": r.lane} if r.lane != DEFAULT_LANE else entry))
    return done
