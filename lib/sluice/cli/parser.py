"""The ``sluice`` parser, its commands and their options as data, and the argument types that refuse
a bad value at parse time."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice.cli.context import DEFAULT_REGION
from sluice.cli.dlq import cmd_dlq_delete, cmd_dlq_list, cmd_dlq_redrive
from sluice.cli.enqueue import cmd_enqueue
from sluice.cli.local_tick import DEFAULT_TICK_SECONDS, cmd_tick
from sluice.cli.maximum import cmd_pause, cmd_resume, cmd_set_max
from sluice.cli.rates import cmd_set_rate
from sluice.cli.semaphore import (
    DEFAULT_SECTION,
    cmd_semaphore_asl,
    cmd_semaphore_set,
    cmd_semaphore_status,
    semaphore_limit,
    semaphore_name,
)
from sluice.cli.status import cmd_status, cmd_wait
from sluice.core.errors import ConfigurationError
from sluice.core.validation import MAX_CEILING, MaxAboveCeiling, whole_number
from sluice.features.lanes import DEFAULT_LANE
from sluice.features.pointers import DEFAULT_THRESHOLD
from sluice.launch.settings import pointer_threshold
from sluice.semaphore.asl import MAX_SECONDS


def _max_value(raw: str) -> int:
    """MAX, a lane's or a key's cap: 0 (pauses) to the ceiling, ``maxConcurrency``'s."""
    try:
        value = whole_number(raw, ceiling=MAX_CEILING)
    except MaxAboveCeiling as exc:
        raise argparse.ArgumentTypeError(f"{exc} (maxConcurrency's ceiling)") from None
    if value is None:
        raise argparse.ArgumentTypeError(
            f"{raw[:40]!r}: MAX must be a whole number from 0 to {MAX_CEILING:,} (0 pauses)"
        )
    return value


def _max_or_default(raw: str) -> int | None:
    """MAX, or (with ``--key``) ``default``: the key back on the stack's cap."""
    return None if raw.strip().lower() == "default" else _max_value(raw)


def _not_empty(what: str) -> Any:
    """An argument type refusing an empty (or blank) value: no key, field or lane is named ''."""

    def check(raw: str) -> str:
        if not raw.strip():
            raise argparse.ArgumentTypeError(f"{what} is empty")
        return raw

    return check


def _seconds(raw: str) -> float:
    """Seconds: a finite number above 0 (``float`` also reads nan, inf and -5)."""
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{raw[:40]!r}: seconds must be a number above 0 (not nan or inf)")
    return value


def _count(low: int, high: int) -> Any:
    """A whole number from ``low`` to ``high``, in ASCII digits."""

    def check(raw: str) -> int:
        try:
            value = whole_number(raw, ceiling=high)
        except MaxAboveCeiling as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"{raw[:40]!r}: a whole number from {low} to {high:,}")
        return value

    return check


def _pointer_threshold(raw: str) -> int:
    try:
        return pointer_threshold(raw.strip(), source="--pointer-threshold")
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _common(defaults: bool) -> argparse.ArgumentParser:
    """Options accepted before and after the command. The subcommands' copies default to SUPPRESS,
    so ``sluice --json status`` and ``sluice status --json`` both work."""
    p = argparse.ArgumentParser(add_help=False)

    def d(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    p.add_argument("--stage", default=d("dev"), help="stack stage: the stack is sluice-<stage> (default dev)")
    p.add_argument("--stack", default=d(None), help="CloudFormation stack name (overrides --stage)")
    p.add_argument(
        "--region",
        default=d(None),
        help=(
            "AWS region (default: AWS_REGION, else AWS_DEFAULT_REGION, else the profile's, "
            f"else {DEFAULT_REGION}, as for the stack)"
        ),
    )
    p.add_argument("--json", action="store_true", default=d(False), help="machine-readable output")
    return p


@dataclass(frozen=True)
class Arg:
    """One ``add_argument`` call: the names and the keywords."""

    names: tuple[str, ...]
    options: Mapping[str, Any]


@dataclass(frozen=True)
class OneOf:
    """Options that exclude each other (a mutually exclusive group)."""

    args: tuple[Arg, ...]


@dataclass(frozen=True)
class Command:
    """A subcommand: its arguments and handler, or (``actions``) its own subcommands under ``dest``."""

    name: str
    help: str
    args: tuple[Arg | OneOf, ...] = ()
    func: Callable[..., int] | None = None
    dest: str = ""
    actions: tuple[Command, ...] = ()


def _arg(*names: str, **options: Any) -> Arg:
    return Arg(names, options)


def _lane(help: str, **more: Any) -> Arg:
    return _arg("--lane", type=_not_empty("the lane name"), metavar="NAME", help=help, **more)


def _concurrency_key(*names: str, help: str) -> Arg:
    return _arg(*names, type=_not_empty("the concurrency key"), metavar="KEY", help=help)


def _field(name: str, help: str, **more: Any) -> Arg:
    return _arg(name, type=_not_empty("the field name"), help=help, **more)


def _payload_id(**more: Any) -> Arg:
    return _arg("payload_id", help="payload key (its 'id')", **more)


ENQUEUE = Command(
    "enqueue",
    "send payloads (JSON object, array or JSON Lines)",
    (
        _arg("file", help="file to read, or - for standard input"),
        _field("--key-field", "field that identifies a payload when it has no string 'id'"),
        _field("--group-by", "field whose value is the FIFO message group (default: the payload key)"),
        _arg("--dedup-id", help="deduplication id for a single payload (default: hash of the payload)"),
        _arg(
            "--pointer-threshold",
            type=_pointer_threshold,
            metavar="BYTES",
            help="store a body over this many bytes in the stack's payload bucket and send a pointer "
            f"(0 to {DEFAULT_THRESHOLD:,}; default SLUICE_POINTER_THRESHOLD, else {DEFAULT_THRESHOLD:,})",
        ),
        _arg(
            "--once",
            action="store_true",
            help="run each key successfully at most once: a key that has SUCCEEDED is not started again "
            "(message attribute sluice-once)",
        ),
        _arg(
            "--after",
            type=_not_empty("the awaited key"),
            action="append",
            default=[],
            metavar="KEY",
            help="start each payload only once KEY has SUCCEEDED (repeatable; message attribute sluice-awaits); "
            "a cycle among the keys enqueued and the parked waiters is refused",
        ),
        _arg(
            "--on-await-failure",
            choices=("dead-letter", "run"),
            default=None,
            help="when an awaited key ends FAILED, TIMED_OUT or ABORTED: dead-letter the payload (default) or run it",
        ),
        _lane(
            "send to lane NAME's queue (stack parameter lanes; default: the lane 'default', the stack's queue)",
            default=DEFAULT_LANE,
        ),
        _arg(
            "--no-wake",
            dest="wake",
            action="store_false",
            help="do not wake the launcher after sending (by default it is woken, so payloads start while "
            "slots are free without waiting for the next tick; SLUICE_LAUNCHER_FUNCTION, else the stack "
            "output LauncherFunctionArn)",
        ),
        OneOf(
            (
                _concurrency_key(
                    "--concurrency-key",
                    help="run at most the key's cap of these payloads at once (stack parameter keyConcurrency, "
                    "or set-max --key); the others wait in the key's line (message attribute "
                    "sluice-concurrency-key)",
                ),
                _field(
                    "--concurrency-key-field",
                    "the same, with each payload's concurrency key taken from its field FIELD (a string or number)",
                    metavar="FIELD",
                ),
            )
        ),
    ),
    cmd_enqueue,
)

_DLQ_IDS = _arg("--id", dest="ids", action="append", metavar="ID", help="DLQ message id (repeatable)")
DLQ = Command(
    "dlq",
    "list, redrive or delete dead-lettered messages",
    dest="dlq_command",
    actions=(
        Command(
            "list",
            "show DLQ messages without consuming them",
            (
                _arg(
                    "--limit",
                    type=_count(1, 100_000),
                    default=100,
                    help="list at most this many (default 100)",
                ),
                _arg(
                    "--width",
                    type=_count(1, 1_000_000),
                    default=100,
                    help="characters of reason and body shown (default 100)",
                ),
            ),
            cmd_dlq_list,
        ),
        Command(
            "redrive",
            "send DLQ messages back to the payload queue (with lanes, each to its lane's)",
            (
                OneOf((_DLQ_IDS, _arg("--all", action="store_true", help="every message in the DLQ"))),
                _lane(
                    "send them to lane NAME's queue (default: each message's own lane, from the queue it came "
                    "from or its sluice-lane attribute)"
                ),
                _arg(
                    "--new-name",
                    action="store_true",
                    help="send each as a new message, run under a new execution name even if the message it "
                    "came from ran (default: under that message's name, so at most once)",
                ),
            ),
            cmd_dlq_redrive,
        ),
        Command(
            "delete",
            "delete DLQ messages for good",
            (Arg(_DLQ_IDS.names, {**_DLQ_IDS.options, "required": True}),),
            cmd_dlq_delete,
        ),
    ),
)

_SEMAPHORE_NAME = _arg("name", type=semaphore_name, metavar="NAME")
_ACQUIRE_SECONDS = {"type": _count(1, MAX_SECONDS), "metavar": "SECONDS"}
SEMAPHORE = Command(
    "semaphore",
    "semaphore steps: set a limit, show, print the ASL",
    dest="semaphore_command",
    actions=(
        Command(
            "set",
            "put a limit in force (a whole number >= 0; 0 pauses); creates the semaphore",
            (_SEMAPHORE_NAME, _arg("limit", type=semaphore_limit, metavar="N")),
            cmd_semaphore_set,
        ),
        Command(
            "status",
            "one semaphore's holders and waiters, or every semaphore",
            (_arg("name", nargs="?", type=semaphore_name, metavar="NAME"),),
            cmd_semaphore_status,
        ),
        Command(
            "asl",
            "print the Acquire/Release states to copy into a workflow (no AWS call)",
            (
                _SEMAPHORE_NAME,
                _arg(
                    "--function",
                    type=_not_empty("the function ARN"),
                    metavar="ARN",
                    help="ARN of Sluice's semaphore function (default: the stack output SemaphoreFunctionArn; "
                    "given, no AWS call is made)",
                ),
                _arg(
                    "--section",
                    metavar="STATE",
                    help=f"first state of your section (default {DEFAULT_SECTION}; not with --wrap)",
                ),
                _arg(
                    "--next",
                    metavar="STATE",
                    help="state after the section (default: the execution ends after Release; not with --wrap)",
                ),
                _arg(
                    "--acquisition-id",
                    help="names this acquisition in the execution (default: from --section)",
                ),
                _arg("--timeout", **_ACQUIRE_SECONDS, help="TimeoutSeconds of Acquire: the longest wait"),
                _arg("--heartbeat", **_ACQUIRE_SECONDS, help="HeartbeatSeconds of Acquire"),
                _arg("--label", help="names the added states (default: the semaphore's name)"),
                _arg(
                    "--wrap",
                    metavar="FILE",
                    help="print this state machine definition (- for standard input) held under NAME",
                ),
            ),
            cmd_semaphore_asl,
        ),
    ),
)


COMMANDS = (
    ENQUEUE,
    Command(
        "status",
        "overview, or one payload's record and history",
        (
            _payload_id(nargs="?"),
            _arg(
                "--tree",
                action="store_true",
                help="with a key: what it awaits and what awaits it, with states",
            ),
            _lane("lane NAME only: its MAX, pool and queue (with a payload key: what holds starts there)"),
            _concurrency_key(
                "--concurrency-key",
                help="concurrency key KEY's cap, runs and line (with a payload key: whether the key holds it)",
            ),
        ),
        cmd_status,
    ),
    Command(
        "wait",
        "wait for a payload's receipt: exit 0 if it SUCCEEDED, 1 if it ended otherwise, 2 on timeout",
        (
            _payload_id(),
            _arg(
                "--timeout",
                type=_seconds,
                default=None,
                metavar="S",
                help="give up after S seconds, a number above 0 (exit 2)",
            ),
        ),
        cmd_wait,
    ),
    Command(
        "set-max",
        f"set MAX at run time (a whole number from 0 to {MAX_CEILING:,}; 0 pauses)",
        (
            _arg("value", type=_max_or_default, metavar="N"),
            OneOf(
                (
                    _concurrency_key(
                        "--key",
                        help="set concurrency key KEY's own cap instead (0 pauses the key; N 'default' puts it "
                        "back on the stack's keyConcurrency)",
                    ),
                    _lane(
                        "set lane NAME's MAX instead (N 'default' puts it back on the configured MAX; a paused "
                        "lane stays paused)"
                    ),
                )
            ),
        ),
        cmd_set_max,
    ),
    Command(
        "set-rate",
        "set a rate limit at run time: at most N starts in any window of the period (N/second, "
        "N/minute or N/hour; 'none': no rate; 'default': the stack's rateLimit, laneRateLimits or keyRateLimit)",
        (
            _arg(
                "value",
                metavar="RATE",
                help="N/second, N/minute or N/hour (N from 1 to 10,000); none: no rate; default: the stack's",
            ),
            OneOf(
                (
                    _lane(
                        "set lane NAME's rate instead (each start of the lane takes from the stack's rate too)"
                    ),
                    _concurrency_key(
                        "--key",
                        help="set concurrency key KEY's rate instead (each start of the key takes from the "
                        "stack's and its lane's rates too)",
                    ),
                )
            ),
        ),
        cmd_set_rate,
    ),
    Command(
        "pause",
        "set MAX to 0, remembering the current value",
        (_lane("pause lane NAME only: nothing starts there, the other lanes go on"),),
        cmd_pause,
    ),
    Command(
        "resume",
        "restore the MAX that pause remembered",
        (_lane("resume lane NAME, with the MAX it had"),),
        cmd_resume,
    ),
    DLQ,
    SEMAPHORE,
    Command(
        "tick",
        "run one launcher tick here, with the deployed settings",
        (
            _arg(
                "--time-limit",
                type=_seconds,
                help="seconds the tick may run (default: the launcher function's timeout, else "
                f"{DEFAULT_TICK_SECONDS})",
            ),
            _arg("-v", "--verbose", action="store_true", help="log what the launcher does to standard error"),
        ),
        cmd_tick,
    ),
)


def _add_args(parser: argparse.ArgumentParser, args: tuple[Arg | OneOf, ...]) -> None:
    for item in args:
        if isinstance(item, OneOf):
            group = parser.add_mutually_exclusive_group()
            for arg in item.args:
                group.add_argument(*arg.names, **arg.options)
        else:
            parser.add_argument(*item.names, **item.options)


def _add_commands(
    parser: argparse.ArgumentParser, dest: str, metavar: str, commands: tuple[Command, ...]
) -> None:
    """``commands`` under ``parser``, each taking the common options too (before or after it)."""
    common = [_common(defaults=False)]
    sub = parser.add_subparsers(dest=dest, required=True, metavar=metavar)
    for command in commands:
        p = sub.add_parser(command.name, parents=common, help=command.help)
        _add_args(p, command.args)
        if command.actions:
            _add_commands(p, command.dest, "ACTION", command.actions)
        else:
            p.set_defaults(func=command.func)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Operate Sluice: enqueue payloads, watch and tune concurrency, handle the DLQ.",
        epilog="Exit codes: 0 ok, 1 partly done or not found, 2 usage or configuration, 3 AWS unavailable, "
        "130 interrupted, 141 standard output closed (`| head`).",
        parents=[_common(defaults=True)],
    )
    _add_commands(parser, "command", "COMMAND", COMMANDS)
    return parser
