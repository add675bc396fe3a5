"""``sluice set-max``, ``pause`` and ``resume``."""

from __future__ import annotations

from typing import Any

from sluice.cli.context import Context
from sluice.cli.render import EXIT_OK, in_force, lane_max, plural, until_fewer, usage
from sluice.core.errors import InvalidPayload
from sluice.core.validation import check_key
from sluice.ops.keys import set_key_max
from sluice.ops.lanes import change_lane, lane_states
from sluice.ops.maximum import pause, resume, set_max


def cmd_set_max(ctx: Context) -> int:
    if ctx.args.key is not None:
        return _set_key_max(ctx)
    if ctx.args.lane is not None:
        return _set_lane_max(ctx)
    if ctx.args.value is None:
        return usage(
            "N 'default' is for a concurrency key (--key KEY) or a lane (--lane NAME); "
            "MAX itself is a whole number >= 0"
        )
    result = set_max(ctx.runtime, ctx.args.value)
    before = result["before"] if result["before"] is not None else (result["before_raw"] or "unset")
    lines = [
        f"MAX {before} → {result['max']} on {result['parameter']}.",
        in_force(result) + " Nothing running is stopped.",
    ]
    if result["max"] == 0:
        lines.append("MAX 0 pauses. `sluice pause` does the same and lets `sluice resume` restore the value.")
    elif result["running"] > result["max"] and not result.get("contended"):
        lines.append(
            f"{result['running']} are running, more than {result['max']}: "
            f"no new start {until_fewer(result['max'])}."
        )
    if result["cleared_resume_max"] is not None:
        lines.append(
            f"This ends the pause: the value it remembered ({result['cleared_resume_max']}) is dropped."
        )
    if result["max"] > 0:
        lines.extend(_lanes_in_force(ctx, result))
    ctx.out("\n".join(lines), result)
    return EXIT_OK


def _lanes_in_force(ctx: Context, result: dict[str, Any]) -> list[str]:
    """On a stack with lanes, MAX is not the whole story: each lane's own limit holds too, and a
    start takes a slot of both. Says each lane's limit and how many can run at once; adds
    ``lanes`` and ``at_most`` to ``result``."""
    lanes = ctx.lanes()
    if not lanes:
        return []
    states = lane_states(ctx.runtime, lanes)
    rows, total = [], 0
    for lane, state in zip(lanes, states, strict=True):
        follows = lane.implied and state["max"] is None and not state["paused"]
        limit = result["max"] if follows else state["wanted"]  # the implied default lane follows MAX
        total += limit
        row = f"  {lane.name}  " + ("follows MAX" if follows else lane_max(state)) + f": limit {limit}"
        if state["limit"] is None:
            row += " from the next tick"
        elif state["limit"] != limit:
            row += f" from the next tick ({state['limit']} in force now)"
        rows.append(row + f", {state['running']} running")
        state["next_limit"] = limit
    at_most = min(total, result["limit"])
    result.update(lanes=states, at_most=at_most)
    head = f"With lanes, each lane's own limit holds too: at most {at_most} run at once"
    if total < result["limit"]:
        head += f" (the lanes' limits add up to {total}; raise one with `sluice set-max N --lane NAME`)"
    return [head + ":", *rows]


def _set_key_max(ctx: Context) -> int:
    try:
        key = check_key(ctx.args.key, source="--key")
    except InvalidPayload as exc:
        return usage(exc.reason)
    ctx.settings.require("table_name", "queue_url")
    result = set_key_max(ctx.runtime, key, ctx.args.value)
    before, after = result["before"], result["after"]
    if after["own_cap"] is not None:
        own = "its own cap"
    elif "fair_lane" in after:
        own = f"a tenant of fair lane {after['fair_lane']!r}: no cap but the lane's MAX"
    else:
        own = f"the stack's keyConcurrency ({result['default']})"
    lines = [f"concurrency key {key!r}: cap {before['cap']} → {after['cap']} ({own})."]
    lines.append(
        f"{after['running']} running, {after['waiting']} waiting, {after['on_the_way']} woken on the way."
    )
    if result["woken"]:
        lines.append(
            f"{plural(result['woken'], 'waiting payload')} "
            f"{'was' if result['woken'] == 1 else 'were'} sent back to the queue, oldest first."
        )
    elif "fair_lane" in after and after["waiting"]:
        lines.append(f"Its waiters are woken by fair lane {after['fair_lane']!r} at its next admission.")
    if after["cap"] == 0:
        lines.append("Cap 0 pauses the key: its payloads wait; other keys are not held up.")
    ctx.out("\n".join(lines), {"key": key, **result})
    return EXIT_OK


# -- lanes (sluice.features.lanes) -----------------------------------------------------------------------------


def _lane_lines(result: dict[str, Any], head: str) -> list[str]:
    after, name = result["after"], result["lane"]
    lines = [head]
    if not result["in_force"]:
        lines.append(
            f"Not in force yet: lane {name}'s pool holds a limit set later ({after['limit']}); the next tick "
            "puts this lane's setting in force unless it changes again."
        )
        return lines
    lines.append(
        f"In force now: the next start in lane {name} obeys it ({after['running']} running, "
        f"limit {after['limit']}). Nothing running is stopped."
    )
    if after["paused"]:
        lines.append(
            f"Lane {name} is paused: its running executions finish normally and nothing starts there until "
            f"`sluice resume --lane {name}`; the other lanes go on."
        )
    elif after["running"] > after["wanted"]:
        lines.append(
            f"{after['running']} are running in lane {name}, more than {after['wanted']}: "
            f"no new start there {until_fewer(after['wanted'])}."
        )
    return lines


def _set_lane_max(ctx: Context) -> int:
    lane = ctx.lane(ctx.args.lane)
    ctx.settings.require("table_name")
    result = change_lane(ctx.runtime, lane, maximum=ctx.args.value)
    before, after = lane_max(result["before"]), lane_max(result["after"])
    head = (
        f"lane {lane.name}: {before} → {after}."
        if result["changed"]
        else f"lane {lane.name}: {after}; nothing changed."
    )
    ctx.out("\n".join(_lane_lines(result, head)), result)
    return EXIT_OK


def _pause_lane(ctx: Context, paused: bool) -> int:
    lane = ctx.lane(ctx.args.lane)
    ctx.settings.require("table_name")
    result = change_lane(ctx.runtime, lane, paused=paused)
    state = result["after"]
    if not result["changed"]:
        head = f"lane {lane.name}: {'already paused' if paused else 'not paused'}: {lane_max(state)}; nothing changed."
    elif paused:
        head = f"lane {lane.name}: paused: {lane_max(state)}."
    else:
        head = f"lane {lane.name}: resumed: {lane_max(state)}."
    ctx.out("\n".join(_lane_lines(result, head)), result)
    return EXIT_OK


def cmd_pause(ctx: Context) -> int:
    if ctx.args.lane is not None:
        return _pause_lane(ctx, True)
    result = pause(ctx.runtime, ctx.deployed_default)
    if not result["changed"]:
        back = result["remembered"]
        human = "already paused (MAX is 0)" + (
            f"; `sluice resume` restores {back}"
            if back is not None
            else "; `sluice resume` restores the deployed default"
        )
    else:
        remembered = (
            f"{result['remembered']} remembered for `sluice resume`"
            if result["remembered"] is not None
            else "the old value was not a valid MAX, so `sluice resume` will use the deployed default"
        )
        human = "\n".join(
            [
                f"paused: MAX {result['before'] if result['before'] is not None else result['before_raw']} → 0 "
                f"on {result['parameter']} ({remembered}).",
                f"{result['running']} running executions finish normally; their slots are not refilled.",
                (in_force(result) if result.get("contended") else "New starts stop now.")
                + " Watch `sluice status` until running reaches 0.",
            ]
        )
    ctx.out(human, result)
    return EXIT_OK


def cmd_resume(ctx: Context) -> int:
    if ctx.args.lane is not None:
        return _pause_lane(ctx, False)
    result = resume(ctx.runtime, ctx.deployed_default)
    if not result["changed"]:
        if result["max"] is None:
            human = (
                f"not paused: {result['parameter']} does not exist, so the launcher uses the deployed default"
            )
        else:
            human = f"not paused: MAX is {result['max']}; nothing changed"
        if result["dropped_resume_max"] is not None:
            human += f" (dropped the stale remembered value {result['dropped_resume_max']})"
    else:
        if result["source"] == "remembered":
            source = "the value remembered by `sluice pause`" + (
                f" at {result['paused_at']}" if result["paused_at"] else ""
            )
        else:
            source = (
                "the deployed default: nothing was remembered (paused by other means than `sluice pause`)"
            )
        human = "\n".join(
            [
                f"resumed: MAX {result['before'] if result['before'] is not None else result['before_raw']} → "
                f"{result['max']} on {result['parameter']} ({source}).",
                in_force(result),
                *_lanes_in_force(ctx, result),
            ]
        )
    ctx.out(human, result)
    return EXIT_OK
