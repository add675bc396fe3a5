"""``sluice tick``: one launcher tick here, with the deployed launcher's settings."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict

from sluice.cli.context import Context, local_env, stack_env
from sluice.cli.render import EXIT_AWS, EXIT_OK, lane_max, table
from sluice.cli.room import CONTENDED, hold_text
from sluice.core.errors import SluiceError
from sluice.core.summary import TickSummary
from sluice.launch.settings import Settings
from sluice.ops.local_tick import tick
from sluice.ops.room import QueueRoom, Room, read_room
from sluice.runtime import Runtime

DEFAULT_TICK_SECONDS = 120  # the stack's default launcherTimeout


def cmd_tick(ctx: Context) -> int:
    if ctx.args.verbose:
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
    launcher = ctx.launcher()
    deployed, source = launcher.environment, launcher.source
    settings = Settings.from_env({**deployed, **stack_env(ctx.outputs), **local_env()})
    overrides = sorted(k for k in local_env() if deployed.get(k) != os.environ[k])
    rt = Runtime(settings, session=ctx.runtime.session)
    # As long as the deployed launcher may run: longer, and a message could reappear while in hand.
    time_limit = ctx.args.time_limit or launcher.timeout or DEFAULT_TICK_SECONDS
    with _logs_shown(ctx.args.verbose):
        summary = tick(rt, time_limit=time_limit)
    data = summary.as_dict()
    data["settings_source"] = source
    data["time_limit"] = time_limit
    data["overrides"] = overrides
    data["launcher_stopped"] = summary.stopped
    # What holds starts, read after the tick: the launcher's own word is its last loop's, and on a
    # stack with lanes that loop may have been an empty lane's while another is full.
    try:
        room = read_room(rt, settings.lanes, deployed_default=ctx.deployed_default)
    except SluiceError as exc:  # the tick is done: say what it did, and that the rest is unknown
        data.update(stop_reasons=None, room=None, room_error=str(exc))
        rows = [("slots", _launcher_slots(summary)), ("stopped", _launcher_stopped(summary, exc))]
    else:
        reasons = room.stop_reasons(summary.stopped)
        data.update(
            stopped=reasons[0].hold.value, stop_reasons=[asdict(r) for r in reasons], room=room.as_dict()
        )
        rows = [
            ("slots", _slots(summary, room)),
            *(("lane", _lane(q, summary.lanes.get(q.lane, {}))) for q in (room.queues if room.lanes else ())),
            ("stopped", "; ".join(hold_text(room, r) for r in reasons)),
        ]
    outcomes = ", ".join(f"{k} {v}" for k, v in summary.outcomes.items() if v) or "nothing received"
    rows = [
        ("outcomes", outcomes),
        *rows,
        (
            "reconciled",
            f"released {summary.released_by_reconcile}, drift {summary.drift}"
            if summary.reconciled
            else "no",
        ),
        ("settings", source + (f"; overridden here: {', '.join(overrides)}" if overrides else "")),
    ]
    ctx.out(table(rows), data)
    return EXIT_AWS if summary.stopped == "transient" else EXIT_OK


LAUNCHER_WORDS = {
    "full": "every slot is taken",
    "empty": "the queue is empty",
    "paused": "MAX is 0",
    "time": "the time limit was reached",
    "transient": "AWS throttled or failed; the rest returns to the queue",
    "contended": CONTENDED,
}


def _launcher_slots(summary: TickSummary) -> str:
    mx = summary.max_concurrency if summary.max_concurrency is not None else "unknown"
    return (
        f"MAX {mx} (limit {summary.limit}): running {summary.running_before} → {summary.running_after}, "
        f"{summary.free_after} free"
    )


def _launcher_stopped(summary: TickSummary, unread: Exception) -> str:
    word = LAUNCHER_WORDS.get(summary.stopped, summary.stopped)
    return f"{word}, as the launcher's last admission loop saw it (what holds starts could not be read: {unread})"


def _slots(summary: TickSummary, room: Room) -> str:
    """``MAX 5 (limit 5): running 0 → 3, 2 free``, the figures read after the tick (MAX as the
    parameter holds it: a tick with lanes that found no room reads none)."""
    if room.max_error:
        mx = "INVALID"
    elif room.paused:
        mx = "0, PAUSED"
    else:
        mx = str(room.max if room.max is not None else summary.max_concurrency)
    limit = room.limit if room.limit is not None else summary.limit
    free = room.free if room.free is not None else summary.free_after
    return f"MAX {mx} (limit {limit}): running {summary.running_before} → {room.running}, {free} free"


def _lane(q: QueueRoom, figures: dict[str, int]) -> str:
    """``gpu  MAX 2 (configured): 2 running of 2 (0 free), 2 waiting; started 2 this tick``."""
    assert q.state is not None
    pool = f"{q.running} running" + (f" of {q.limit} ({q.free} free)" if q.limit is not None else "")
    waiting = f"{q.waiting} waiting" + (
        f", {q.in_key_lines} in concurrency keys' lines" if q.in_key_lines else ""
    )
    return f"{q.lane}  {lane_max(q.state)}: {pool}, {waiting}; started {figures.get('started', 0)} this tick"


@contextmanager
def _logs_shown(verbose: bool) -> Iterator[None]:
    """Without ``-v`` the tick logs nothing: its summary says what it did (a warning would otherwise
    reach standard error through logging's last-resort handler, or a handler set up by the caller)."""
    if verbose:
        yield
        return
    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(before)
