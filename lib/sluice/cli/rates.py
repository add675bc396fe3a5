"""``sluice set-rate``."""

from __future__ import annotations

from typing import Any

from sluice.cli.context import Context
from sluice.cli.render import EXIT_OK, when
from sluice.ops.rates import set_rate


def cmd_set_rate(ctx: Context) -> int:
    result = set_rate(ctx.runtime, ctx.args.value, lane=ctx.args.lane, key=ctx.args.key)
    was = result["before"]["rate"] or "none"
    ctx.out(
        "\n".join(
            [
                f"rate of {result['scope']}: {was} → {result['rate'] or 'none'}"
                + ("" if result["set_at_run_time"] else " (the stack's parameter)")
                + ". In force for the next start.",
                rate_line(result),
            ]
        ),
        result,
    )
    return EXIT_OK


def rate_line(status: dict[str, Any]) -> str:
    """``600/minute: 12 starts in the current window; the next is due now``."""
    if not status["rate"]:
        return "no rate: starts are bounded by MAX alone"
    if status.get("default"):
        return f"{status['rate']}: every concurrency key's, unless set for the key"
    due = "now" if status["next_due"] is None else when(status["next_due"])
    return f"{status['rate']}: {status['in_window']} starts in the current window; the next is due {due}"
