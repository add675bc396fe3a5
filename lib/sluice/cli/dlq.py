"""``sluice dlq list | redrive | delete``."""

from __future__ import annotations

import sys

from sluice.cli.context import Context
from sluice.cli.render import EXIT_AWS, EXIT_OK, EXIT_PARTIAL, plural, preview, usage, when
from sluice.ops.dlq import DlqReport, dlq_delete, dlq_list, dlq_redrive


def cmd_dlq_list(ctx: Context) -> int:
    listing = dlq_list(ctx.runtime, limit=ctx.args.limit)
    data = {
        "messages": [m.as_dict() for m in listing.messages],
        "visible": listing.visible,
        "in_flight": listing.in_flight,
    }
    if not listing.messages:
        human = (
            "the DLQ is empty"
            if not listing.in_flight
            else f"no visible message ({listing.in_flight} in flight)"
        )
        ctx.out(human, data)
        return EXIT_OK
    lines: list[str] = []
    width = ctx.args.width
    for m in listing.messages:
        lines.append(
            f"{m.message_id}  group {m.group_id or '-'}  receives {m.receive_count}  sent {when(m.sent_at)}"
        )
        if m.source_message_id != m.message_id:
            lines.append(f"  source   {m.source_message_id}")
        if m.key:
            lines.append(f"  key      {preview(m.key, width)}")
        if m.lane:
            lines.append(f"  lane     {m.lane}")
        lines.append(f"  reason   {preview(m.reason, width)}")
        lines.append(f"  body     {preview(m.body, width)}")
    lines.append(
        f"{len(listing.messages)} listed of about {listing.visible} visible"
        + (f" and {listing.in_flight} in flight (not shown)" if listing.in_flight else "")
        + ". A FIFO queue shows at most the first 10 messages of each group; `--json` gives full bodies."
    )
    lines.append(
        "Fix the cause first: a redriven payload that is still invalid comes straight back here. "
        "Then: sluice dlq redrive --id ID (or --all)"
    )
    ctx.out("\n".join(lines), data)
    return EXIT_OK


def cmd_dlq_redrive(ctx: Context) -> int:
    if not ctx.args.all and not ctx.args.ids:
        return usage(
            "say which messages to redrive: --id MESSAGE_ID (repeat it; ids from `sluice dlq list`) or --all"
        )
    lane = ctx.args.lane
    if lane is not None:
        ctx.lane_queue_url(lane)  # an unknown lane: nothing is received
    elif ctx.stack:
        ctx.lanes()  # the lanes' queues, from the launcher when the stack's outputs lack them
    report = dlq_redrive(
        ctx.runtime, None if ctx.args.all else ctx.args.ids, lane=lane, new_name=ctx.args.new_name
    )
    if lane is not None:
        where = f"lane {lane}'s queue"
    elif ctx.settings.lane_queue_urls or any("lane" in d for d in report.done):
        where = "their lanes' queues"
    else:
        where = "the main queue"
    lines = [f"redrove {plural(len(report.done), 'message')} to {where}"]
    for d in report.done:
        lines.append(
            f"  {d['dlq_message_id']} → {d['message_id']}" + (f" (lane {d['lane']})" if "lane" in d else "")
        )
    lines.append(
        "A payload that was invalid comes back to the DLQ unless it was fixed; the others run on the next "
        "launcher tick under their own execution names (not at all if that name already ran; --new-name "
        "runs them under new ones), or are suppressed as duplicates while the same key is running."
    )
    return _finish_dlq(ctx, report, lines)


def cmd_dlq_delete(ctx: Context) -> int:
    report = dlq_delete(ctx.runtime, ctx.args.ids)
    lines = [f"deleted {plural(len(report.done), 'message')} from the DLQ"]
    lines.extend(f"  {d['dlq_message_id']}" for d in report.done)
    return _finish_dlq(ctx, report, lines)


def _finish_dlq(ctx: Context, report: DlqReport, lines: list[str]) -> int:
    for f in report.failed:
        print(f"sluice dlq: {f['dlq_message_id']}: {f['reason']}", file=sys.stderr)
    for missing in report.not_found:
        print(
            f"sluice dlq: {missing}: not found among the visible DLQ messages (already handled, in flight, "
            "or behind earlier messages of its FIFO group)",
            file=sys.stderr,
        )
    if report.interrupted:
        print(
            f"sluice dlq: stopped early, AWS is unavailable or throttling: {report.interrupted}",
            file=sys.stderr,
        )
    if report.failed:
        lines.append(f"{len(report.failed)} failed (see above)")
    ctx.out("\n".join(lines), report.as_dict())
    if report.interrupted:
        return EXIT_AWS
    return EXIT_OK if report.ok else EXIT_PARTIAL
