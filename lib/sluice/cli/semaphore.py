"""``sluice semaphore set``, ``status`` and ``asl``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from sluice.cli.context import Context
from sluice.cli.render import EXIT_OK, EXIT_PARTIAL, plural, table, until_fewer, usage, when
from sluice.core.errors import ConfigurationError
from sluice.core.validation import MaxAboveCeiling, whole_number
from sluice.ops.semaphore import MAX_LIMIT, semaphore_list, semaphore_set, semaphore_status
from sluice.semaphore.asl import ERROR_PATH, StateNames, semaphore_states, wrap_definition
from sluice.semaphore.model import BadSemaphoreName, check_name


def semaphore_name(raw: str) -> str:
    try:
        return check_name(raw)
    except BadSemaphoreName as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def semaphore_limit(raw: str) -> int:
    try:
        value = whole_number(raw.strip().removeprefix("-"), ceiling=MAX_LIMIT)  # ASCII: int() reads "١٠"
    except MaxAboveCeiling:
        value = MAX_LIMIT + 1
    if value is None:
        raise argparse.ArgumentTypeError(f"{raw[:40]!r}: N must be a whole number >= 0 (0 pauses)")
    if (raw.strip().startswith("-") and value) or value > MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{raw[:40]}: N must be 0 to {MAX_LIMIT} (0 pauses)")
    return value


def cmd_semaphore_set(ctx: Context) -> int:
    r = semaphore_set(ctx.runtime, ctx.args.name, ctx.args.limit)
    name, limit = r["semaphore"], r["limit"]
    if r["created"]:
        lines = [f"semaphore {name} created with limit {limit}."]
    else:
        lines = [f"semaphore {name}: limit {r['before']} → {limit}."]
    if r["overtaken"]:
        lines.append(
            f"Another change came in meanwhile: the limit in force is {limit}, not {r['requested']}."
        )
    lines.append("In force now: the next acquire obeys it. Nobody holding a permit is stopped.")
    if limit == 0:
        lines.append(
            "Limit 0 pauses the section: holders finish it, nobody new enters until the limit is raised."
        )
    elif r["holding"] > limit or r["frozen"]:
        lines.append(
            f"{r['holding']} hold permits, more than {limit}: nobody is admitted {until_fewer(limit, 'hold')} "
            "(the semaphore is frozen until then)."
        )
    if r["granted"]:
        lines.append(f"{plural(len(r['granted']), 'waiter')} granted at once:")
        lines += [f"  {h['acquisition_id']}  {h['execution_arn']}" for h in r["granted"]]
    lines.append(f"{r['holding']} holding, {plural(r['waiting'], 'waiter')} in line.")
    ctx.out("\n".join(lines), r)
    return EXIT_OK


def cmd_semaphore_status(ctx: Context) -> int:
    if ctx.args.name is None:
        return _list(ctx)
    data = semaphore_status(ctx.runtime, ctx.args.name)
    if data is None:
        print(
            f"sluice semaphore status: no semaphore named {ctx.args.name!r} "
            f"(create it with `sluice semaphore set {ctx.args.name} N`)",
            file=sys.stderr,
        )
        if ctx.args.json:
            ctx.out("", {"semaphore": ctx.args.name, "found": False})
        return EXIT_PARTIAL
    limit, holding = data["limit"], data["holding"]
    if data["frozen"]:
        state = f"FROZEN: {holding} hold permits; nobody is admitted {until_fewer(limit, 'hold')}"
    elif limit == 0:
        state = "PAUSED (limit 0): nobody is admitted"
    else:
        state = f"{data['free']} free"
    waiters = data["waiters"]
    shown = f"{len(waiters)} in line, first in line first"
    if data["line"] > len(waiters):
        shown += (
            f" (line holds {data['line']} tickets; first {data['max_waiters']} looked at, dead ones skipped)"
        )
    rows = table(
        [
            ("semaphore", data["semaphore"]),
            ("limit", f"{limit}  ({state})"),
            ("holders", f"{holding}, oldest first"),
            ("waiters", shown),
        ]
    ).splitlines()
    holders = [
        f"  since {when(h['since'])}  {h['acquisition_id']}  {h['execution_arn']}" for h in data["holders"]
    ]
    tail = [
        f"  #{w['ticket']}  since {when(w['enqueued_at'])}  {w['acquisition_id']}  {w['execution_arn']}"
        for w in waiters
    ]
    ctx.out("\n".join([*rows[:3], *holders, rows[3], *tail]), data)
    return EXIT_OK


def _list(ctx: Context) -> int:
    data = semaphore_list(ctx.runtime)
    found = data["semaphores"]
    if not found:
        lines = ["no semaphore: create one with `sluice semaphore set NAME N`"]
    else:
        header = ("SEMAPHORE", "LIMIT", "HOLDING", "FREE", "LINE", "")
        rows = [
            (
                s["semaphore"],
                str(s["limit"]),
                str(s["holding"]),
                str(s["free"]),
                str(s["line"]),
                "FROZEN" if s["frozen"] else ("PAUSED" if s["limit"] == 0 else ""),
            )
            for s in found
        ]
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]
        ]
    note = (
        f"(listed by a Scan of the whole table: {data['scanned_items']} items read in "
        f"{plural(data['scan_pages'], 'page')}, each billed, half a read unit per 4 KB"
    )
    note += "; stopped early: more semaphores may exist)" if data["truncated"] else ")"
    ctx.out("\n".join([*lines, note]), data)
    return EXIT_OK


FUNCTION_OUTPUT = "SemaphoreFunctionArn"
DEFAULT_SECTION = "CriticalSection"


def cmd_semaphore_asl(given: argparse.Namespace | Context) -> int:
    """Print the states to copy (or a whole definition wrapped); needs no AWS when ``--function``
    names the semaphore function, else the stack output ``SemaphoreFunctionArn`` names it."""
    if isinstance(given, Context):
        args, function = given.args, _function_of(given)
    else:
        args, function = given, given.function
    section = args.section or DEFAULT_SECTION
    options: dict[str, Any] = {
        "semaphore": args.name,
        "function_arn": function,
        "acquisition_id": args.acquisition_id,
        "timeout_seconds": args.timeout,
        "heartbeat_seconds": args.heartbeat,
        "label": args.label,
    }
    try:
        if args.wrap:
            source = sys.stdin if args.wrap == "-" else open(args.wrap, encoding="utf-8")  # noqa: SIM115
            with source:
                definition = json.load(source)
            print(json.dumps(wrap_definition(definition, **options), indent=2))
            return EXIT_OK
        states = semaphore_states(section=section, next=args.next, **options)
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return usage(f"semaphore asl: {exc}")
    print(json.dumps(states, indent=2))
    if function != args.function:
        print(
            f"(the semaphore function from the stack output {FUNCTION_OUTPUT}: {function})", file=sys.stderr
        )
    if not args.json:
        names = StateNames(*states)
        print(
            f'Splice these into "States": point the state before your section at {names.acquire!r} (it goes on '
            f"to {section!r}); point your section's last state at {names.release!r}; add to every Task, "
            f"Parallel and Map state of the section the Catch "
            f'{{"ErrorEquals": ["States.ALL"], "ResultPath": "{ERROR_PATH}", "Next": "{names.release_on_error}"}}. '
            "Or let `--wrap FILE` do it for a whole definition, or call sluice.semaphore.asl.with_semaphore.",
            file=sys.stderr,
        )
    return EXIT_OK


def _function_of(ctx: Context) -> str:
    function = ctx.outputs.get(FUNCTION_OUTPUT, "").strip()
    if not function:
        raise ConfigurationError(
            f"stack {ctx.stack} has no output {FUNCTION_OUTPUT} (deployed before the semaphore function?)"
        )
    return function
