"""What holds starts, in words: ``sluice status KEY`` for a payload with no record, and why
``sluice tick`` stopped (``sluice.ops.room``)."""

from __future__ import annotations

from sluice.cli.render import lane_max, plural
from sluice.features.lanes import DEFAULT_LANE
from sluice.ops.room import Held, Hold, Room

CONTENDED = (
    "other launchers kept changing the slot pool, so MAX is not in the caps yet; the next tick starts them"
)
NOTHING_HOLDS = "nothing: slots are free; the next tick, or a completion's refill, receives what waits"


def room_lines(room: Room | None) -> list[str]:
    """MAX, the slots, each lane's (or the stack's) queue and pool, a key's line, and what holds starts."""
    if room is None:
        return []
    if room.max_error:
        mx = f"INVALID: {room.max_error}"
    elif room.paused:
        mx = "0, PAUSED" + (
            f" (sluice resume restores {room.resume_max})" if room.resume_max is not None else ""
        )
    else:
        mx = str(room.max if room.max is not None else "unknown")
    lines = [f"MAX         {mx}"]
    if room.limit is not None:
        lines.append(f"slots       {room.running} running of {room.limit} ({room.free} free)")
    for q in room.queues:
        queue = f"{q.waiting} waiting, {q.in_flight} in flight, {q.delayed} delayed" + (
            f", {q.in_key_lines} in concurrency keys' lines" if q.in_key_lines else ""
        )
        if room.lanes and q.state is not None:
            pool = f"{q.running} running" + (
                f" of {q.limit} ({q.free} free)" if q.limit is not None else " (no limit in force yet)"
            )
            lines.append(f"lane        {q.lane}  {lane_max(q.state)}: {pool}; queue {queue}")
        else:
            lines.append(f"queue       {queue}")
    k = room.key
    if k is not None:
        lines.append(
            f"key         {k['key']}: {k['running']} of {k['cap']} running, {k['waiting']} waiting in its line"
            + (f", {k['on_the_way']} on the way" if k["on_the_way"] else "")
        )
    holds = room.holds()
    lines.append("holds       " + ("; ".join(hold_text(room, h) for h in holds) if holds else NOTHING_HOLDS))
    return lines


def hold_text(room: Room, held: Held) -> str:
    """One reason in words, with its figures (``sluice.ops.room``)."""
    q = room.queue(held.lane or DEFAULT_LANE)  # without lanes, the stack's queue
    where = f"lane {held.lane}'s queue" if held.lane is not None and room.lanes else "the queue"
    waiting = f", {q.waiting} waiting" if q is not None and q.waiting else ""
    match held.hold:
        case Hold.MAX_INVALID:
            return "MAX is invalid: nothing starts until it is fixed (sluice set-max N)"
        case Hold.PAUSED:
            return "MAX is 0 (paused): nothing starts until `sluice resume`"
        case Hold.FULL:
            return f"every slot is taken ({room.running} running of {room.limit})"
        case Hold.LANE_PAUSED:
            return f"lane {held.lane} is paused{waiting} (sluice resume --lane {held.lane})"
        case Hold.LANE_FULL if q is not None:
            return f"lane {held.lane} is full ({q.running} running of {q.limit}{waiting})"
        case Hold.KEY_FULL if room.key is not None:
            k = room.key
            if k["cap"] == 0:
                return f"concurrency key {k['key']} is paused (cap 0)"
            return f"concurrency key {k['key']} is at its cap ({k['running']} of {k['cap']} running)"
        case Hold.NOT_RECEIVED if q is not None:
            return (
                f"{where}: {plural(q.waiting, 'message')} not received (behind messages of their FIFO "
                "groups in flight, or sent after the tick's receive)"
            )
        case Hold.KEY_LINES if q is not None:
            return f"{where} is empty; {q.in_key_lines} wait in concurrency keys' lines (keys at their caps)"
        case Hold.EMPTY:
            return f"{where} is empty"
        case Hold.TIME:
            return "the time limit was reached"
        case Hold.TRANSIENT:
            return "AWS throttled or failed; the rest returns to the queue"
        case Hold.CONTENDED:
            return CONTENDED
    return held.hold.value
