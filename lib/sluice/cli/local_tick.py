"""``sluice tick``: one launcher tick here, with the deployed launcher's settings."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from sluice.cli.context import Context, local_env, stack_env
from sluice.cli.render import EXIT_AWS, EXIT_OK, table
from sluice.ops.local_tick import tick
from sluice.runtime import Runtime
from sluice.settings import Settings

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
    outcomes = ", ".join(f"{k} {v}" for k, v in summary.outcomes.items() if v) or "nothing received"
    stopped = {
        "full": "every slot is taken",
        "empty": "the queue is empty",
        "paused": "MAX is 0",
        "time": "the time limit was reached",
        "transient": "AWS throttled or failed; the rest returns to the queue",
    }.get(summary.stopped, summary.stopped)
    rows = [
        ("outcomes", outcomes),
        (
            "slots",
            f"MAX {summary.max_concurrency} (limit {summary.limit}): running {summary.running_before} → "
            f"{summary.running_after}, {summary.free_after} free",
        ),
        ("stopped", stopped),
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
