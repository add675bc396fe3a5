"""``sluice status``: the overview, or one payload's record and execution history."""

from __future__ import annotations

import sys
import time
from typing import Any

from sluice.cli.context import Context
from sluice.cli.rates import rate_line
from sluice.cli.render import EXIT_OK, EXIT_PARTIAL, duration, lane_max, plural, table, until_fewer, when
from sluice.cli.room import room_lines
from sluice.features.lanes import DEFAULT_LANE
from sluice.features.receipts import Receipt, read_receipt, wait_for
from sluice.ops.awaits import awaits_status, tree_lines
from sluice.ops.keys import key_status, payload_place
from sluice.ops.rates import rate_status
from sluice.ops.room import Room, read_room
from sluice.ops.status import overview, payload_history

EXIT_TIMEOUT = 2  # sluice wait: no receipt within --timeout
NO_RECORD = (
    "not received by the launcher yet (still in a queue, or in flight), never enqueued, or expired "
    "(records are kept retentionDays)"
)
NO_QUEUE = "SLUICE_TABLE_NAME alone names no queue: set SLUICE_QUEUE_URL, or let the stack be read"


def cmd_status(ctx: Context) -> int:
    lane = ctx.args.lane
    if lane is not None and (lane != DEFAULT_LANE or ctx.lanes()):
        ctx.lane(lane)  # an unknown lane: a configuration error naming the lanes there are
    if ctx.args.payload_id is None:
        return _overview(ctx)
    key = ctx.args.payload_id
    data = payload_history(ctx.runtime, key)
    waits = awaits_status(ctx.runtime, key, tree=getattr(ctx.args, "tree", False))
    place = payload_place(ctx.runtime, key)
    if data is None and (waits["waiting"] or waits.get("awaited_by") or place):
        return _not_received_yet(ctx, key, waits, place)
    if data is None:
        return _no_record(ctx, key, waits)
    data["awaits"] = waits
    data["line"] = place
    narrowed = _narrowed_room(ctx)
    if narrowed is not None:
        data["room"] = narrowed.as_dict()
    lines = _record_lines(data)
    lines.extend(_execution_lines(data["executions"]))
    lines.extend(_await_lines(waits))
    lines.extend(_place_lines(place))
    lines.extend(room_lines(narrowed))
    ctx.out("\n".join(lines), data)
    return EXIT_OK


def _not_received_yet(ctx: Context, key: str, waits: dict[str, Any], place: dict[str, Any] | None) -> int:
    """No record, but the payload is parked: waiting for its awaited keys, or in a concurrency key's line."""
    narrowed = _narrowed_room(ctx)
    ctx.out(
        "\n".join([f"payload     {key}", *_await_lines(waits), *_place_lines(place), *room_lines(narrowed)]),
        {
            "payload": None,
            "awaits": waits,
            "line": place,
            **({"room": narrowed.as_dict()} if narrowed else {}),
        },
    )
    return EXIT_OK


def _record_lines(data: dict[str, Any]) -> list[str]:
    """The payload's record and its receipt."""
    p = data["payload"]
    expires = when(p["expires_at"]) if p["expires_at"] else ("never while it runs" if p["holder"] else "-")
    lines = [
        f"payload     {p['key']}",
        f"state       {p['state']}"
        + (f"  (lease held by {p['holder']})" if p["holder"] else "")
        + (f"; Step Functions: {data['holder_status']}" if data.get("holder_status") else ""),
        f"attempts    {p['attempts']}    duplicates suppressed {p['duplicates']}",
        f"updated     {when(p['updated_at'])}    record expires {expires}",
    ]
    if p["reason"]:
        lines.append(f"reason      {p['reason']}")
    if p["already_done"]:
        lines.append(
            f"once        {plural(p['already_done'], 'run-once message')} acknowledged as already done"
        )
    if p.get("once_unknown"):
        lines.append(
            f"once        outcome of run {p['once_unknown']} unknown: run-once messages dead-lettered"
        )
    receipt = data["receipt"]
    if receipt is None:
        lines.append("receipt     none yet")
    else:
        lines.extend(_receipt_lines(receipt))
        lines.extend(_effects_lines(data.get("effects")))
    return lines


def _execution_lines(executions: list[dict[str, Any]]) -> list[str]:
    lines = [f"executions  {len(executions)}, oldest first"]
    for run in executions:
        lines.append(f"  {run['state']:<10} {run['name']}")
        lines.append(
            f"             message {run['message_id']}, claimed {when(run['claimed_at'])}"
            + (f", lane {run['lane']}" if run.get("lane") else "")
        )
        if run["started_at"] or run["ended_at"]:
            lines.append(f"             started {when(run['started_at'])}, ended {when(run['ended_at'])}")
        if run["arn"]:
            lines.append(f"             {run['arn']}")
        if run["error"]:
            lines.append(
                f"             error: {run['error']}" + (f": {run['cause']}" if run["cause"] else "")
            )
    return lines


def _room(ctx: Context) -> Room:
    return read_room(
        ctx.runtime,
        ctx.lanes(),
        lane=ctx.args.lane,
        concurrency_key=ctx.args.concurrency_key,
        deployed_default=ctx.deployed_default,
    )


def _narrowed_room(ctx: Context) -> Room | None:
    """With ``--lane`` or ``--concurrency-key``, a payload's answer also shows that lane's or key's room."""
    if ctx.args.lane is None and ctx.args.concurrency_key is None:
        return None
    return _room(ctx)


def _no_record(ctx: Context, key: str, waits: dict[str, Any]) -> int:
    """No record of the payload: what is known instead (exit 1, as any "not found")."""
    print(f"sluice status: no record for payload {key!r}", file=sys.stderr)
    head = [f"payload     {key}", f"record      none yet: {NO_RECORD}"]
    data: dict[str, Any] = {"payload": None, "payload_id": key, "found": False, "awaits": waits, "line": None}
    if not ctx.settings.queue_url:  # the environment named the table alone: no queue to look at
        data["room"] = None
        ctx.out("\n".join([*head, f"room        unknown: {NO_QUEUE}"]), data)
        return EXIT_PARTIAL
    room = _room(ctx)
    data["room"] = room.as_dict()
    ctx.out("\n".join([*head, *room_lines(room)]), data)
    return EXIT_PARTIAL


def _place_lines(place: dict[str, Any] | None) -> list[str]:
    """Its place in a concurrency key's line (``sluice.features.keys``)."""
    if place is None:
        return []
    k = place["key"]
    key = f"concurrency key {place['concurrency_key']!r} ({k['running']} of {k['cap']} running)"
    if place["waiting"]:
        return [
            f"line        waiting for {key} since {when(place['parked_at'])}: "
            f"{plural(place['ahead'], 'payload')} ahead of it (message {place['message_id']})"
        ]
    return [f"line        parked for {key} at {when(place['parked_at'])}; sent back to the queue since"]


def _await_lines(waits: dict[str, Any]) -> list[str]:
    lines = []
    for w in waits["waiting"]:
        lines.append(
            f"waiting     parked since {when(w['parked_at'])} (message {w['message_id']}), on failure: {w['on_failure']}"
        )
        for a in w["awaits"]:
            lines.append(
                f"  awaits    {a['key']}  {a['state']}" + ("  (missing)" if a["key"] in w["missing"] else "")
            )
    if "tree" in waits:
        lines.append("tree")
        lines.extend("  " + line for line in tree_lines(waits["tree"]))
        if waits["awaited_by"]:
            lines.append("awaited by  " + ", ".join(f"{k} (WAITING)" for k in waits["awaited_by"]))
    return lines


def _overview(ctx: Context) -> int:
    lanes = ctx.lanes()
    if ctx.args.lane is not None:
        lanes = tuple(lane for lane in lanes if lane.name == ctx.args.lane)
    data = overview(ctx.runtime, deployed_default=ctx.deployed_default, lanes=lanes)
    data["stack"] = ctx.stack
    if ctx.args.concurrency_key is not None:
        data["keys"] = [key_status(ctx.runtime, ctx.args.concurrency_key)]
    age = data["oldest_message_age"]
    rows = [
        ("stack", ctx.stack or "(from SLUICE_* environment variables)"),
        ("MAX", _max_line(data)),
        ("running", _running_line(data)),
        ("external", f"{data['external']} RUNNING executions not started by Sluice (they count against MAX)"),
        (
            "queue",
            f"{data['queue_visible']} waiting, {data['queue_in_flight']} in flight, "
            f"{data['queue_delayed']} delayed" + ("  (lane default)" if data.get("lanes") else ""),
        ),
        (
            "oldest",
            (duration(age) if age is not None else "unknown") + f"  ({data['oldest_message_age_source']})",
        ),
        (
            "DLQ",
            plural(data["dlq"], "message")
            + (f", {data['dlq_in_flight']} in flight" if data["dlq_in_flight"] else "")
            + ("  → sluice dlq list" if data["dlq"] else ""),
        ),
        (
            "drift",
            f"{data['drift']} at the last reconciliation"
            + (
                f", {duration(data['reconciled_ago'])} ago"
                if data["reconciled_ago"] is not None
                else " (never ran)"
            ),
        ),
    ]
    rows.extend(("lane", _lane_row(lane)) for lane in data.get("lanes", ()))
    rows.extend(("key", _key_row(k)) for k in data["keys"])
    data["rates"] = rate_status(ctx.runtime)
    rows.extend(("rate", f"{r['scope']}  {rate_line(r)}") for r in data["rates"])
    ctx.out(table(rows), data)
    return EXIT_OK


def _max_line(data: dict[str, Any]) -> str:
    """MAX in force and where it comes from: ``4  (parameter /sluice/dev/max)``."""
    mx = data["max"]
    if data["max_error"]:
        max_line = (
            f"INVALID: {data['max_error']}. The launcher starts nothing until it is fixed: sluice set-max N"
        )
    elif mx == 0:
        back = data["resume_max"]
        max_line = "0, PAUSED" + (f" (sluice resume restores {back})" if back is not None else "")
    else:
        max_line = f"{mx if mx is not None else 'unknown'}"
    return (
        max_line
        + f"  ({data['max_source']}"
        + (f" {data['max_parameter']})" if data["max_parameter"] else ")")
    )


def _running_line(data: dict[str, Any]) -> str:
    """The slots held against the limit, and what Step Functions lists."""
    running = f"{data['running']} holding slots"
    if data["max"] == 0:
        running += " (paused: a freed slot is not refilled)"
    elif data["limit"] is not None and data["running"] > data["limit"]:
        running += f" of {data['limit']} (over the limit: no new start {until_fewer(data['limit'])})"
    elif data["limit"] is not None:
        running += f" of {data['limit']} ({data['free']} free)"
    if data["limit_next_tick"] is not None:
        running += f" (the next tick moves the limit to {data['limit_next_tick']})"
    running += f"; Step Functions lists {data['sfn_running']} RUNNING"
    if data["running_not_in_ledger"] or data["ledger_not_running"]:
        running += (
            f" ({data['running_not_in_ledger']} not in the ledger, "
            f"{data['ledger_not_running']} in the ledger but not listed)"
        )
    return running


def _key_row(k: dict[str, Any]) -> str:
    return (
        f"{k['key']}: {k['running']} "
        + ("running" if k.get("fair_lane") and k["own_cap"] is None else f"of {k['cap']} running")
        + f", {k['waiting']} waiting"
        + (f", {k['on_the_way']} on the way" if k["on_the_way"] else "")
        + (f" (tenant of fair lane {k['fair_lane']})" if k.get("fair_lane") else "")
    )


def _lane_row(lane: dict[str, Any]) -> str:
    """``gpu  MAX 2 (configured), priority 1, weight 1: 2 running of 2 (0 free), 8 waiting, 0 in flight``."""
    order = f"priority {lane['priority']}, weight {lane['weight']}" + (", fair" if lane["fair"] else "")
    running = f"{lane['running']} running"
    if lane["limit"] is None:
        running += " (no limit in force yet: the next tick sets it)"
    elif lane["running"] > lane["limit"]:
        running += f" of {lane['limit']} (over the limit: no new start there until fewer run)"
    else:
        running += f" of {lane['limit']} ({lane['free']} free)"
    if lane["limit"] is not None and lane["limit"] != lane["wanted"]:
        running += f" (the next tick moves the limit to {lane['wanted']})"
    queue = f"{lane['waiting']} waiting, {lane['in_flight']} in flight" + (
        f", {lane['delayed']} delayed" if lane["delayed"] else ""
    )
    if lane["fair"]:
        queue += f", {lane['in_lines']} in the lines of its {lane['tenants']} tenants"
    parked = lane["parked"]
    if parked["total"] or lane["parked_partial"]:
        rooms = [
            f"{parked[room]} {what}"
            for room, what in (
                ("in_key_lines", "in key lines"),
                ("deferred", "deferred duplicates"),
                ("awaiting", "awaiting keys"),
            )
            if parked[room]
        ]
        queue += f", {'at least ' if lane['parked_partial'] else ''}{parked['total']} parked" + (
            f" ({', '.join(rooms)})" if rooms else ""
        )
    return f"{lane['lane']}  {lane_max(lane)}, {order}: {running}, {queue}"


def _effects_lines(e: dict[str, Any] | None) -> list[str]:
    if not e:
        return []
    lines = [f"effects     {len(e['sent'])} sent of {e['count']}: {', '.join(e['sent']) or '-'}"]
    lines.extend(f"            refused: {reason}" for _, reason in e["rejected"])
    return lines


def _receipt_lines(r: dict[str, Any]) -> list[str]:
    lines = [
        f"receipt     {r['outcome']}  {r['execution']}",
        f"            started {when(r['started_at'])}, stopped {when(r['stopped_at'])}",
    ]
    if r["arn"]:
        lines.append(f"            {r['arn']}")
    if r["error"]:
        lines.append(f"            error: {r['error']}" + (f": {r['cause']}" if r["cause"] else ""))
    if r["output"] is not None:
        lines.append(f"            output: {r['output']}")
    elif r["output_pointer"]:
        lines.append(f"            output: {r['output_size']} bytes at {r['output_pointer']['uri']}")
    elif r["output_size"]:
        lines.append(f"            output: {r['output_size']} bytes, not kept (no payload bucket)")
    if r["succeeded_by"] and r["succeeded_by"] != r["execution"]:
        lines.append(f"            succeeded before: {r['succeeded_by']}")
    return lines


def cmd_wait(ctx: Context) -> int:
    """Block until the key has a receipt: 0 SUCCEEDED, 1 FAILED/TIMED_OUT/ABORTED, 2 timeout."""
    ctx.settings.require("table_name")
    store = ctx.runtime.store()
    key = ctx.args.payload_id
    clock = ctx.runtime.clock
    sleep = ctx.runtime.sleep or getattr(clock, "sleep", time.sleep)
    found: Receipt | None = wait_for(
        lambda: read_receipt(store, key), timeout=ctx.args.timeout, now=clock.now, sleep=sleep
    )
    if found is None:
        print(f"sluice wait: no receipt for {key!r} within {ctx.args.timeout:g} s", file=sys.stderr)
        if ctx.args.json:
            ctx.out("", {"key": key, "receipt": None, "timed_out": True})
        return EXIT_TIMEOUT
    ctx.out("\n".join(_receipt_lines(found.as_dict())), found.as_dict())
    return EXIT_OK if found.succeeded else EXIT_PARTIAL
