"""The ``sluice`` parser and ``main``: one command, its exit code, and what went wrong in words."""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice.adapters.errors import THROTTLING, error_code, translate_client_error
from sluice.adapters.ssm import MAX_CEILING, MaxAboveCeiling, whole_number
from sluice.asl import MAX_SECONDS
from sluice.cli.context import DEFAULT_REGION, make_context
from sluice.cli.dlq import cmd_dlq_delete, cmd_dlq_list, cmd_dlq_redrive
from sluice.cli.enqueue import cmd_enqueue
from sluice.cli.local_tick import DEFAULT_TICK_SECONDS, cmd_tick
from sluice.cli.maximum import cmd_pause, cmd_resume, cmd_set_max
from sluice.cli.render import EXIT_AWS, EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_PIPE
from sluice.cli.semaphore import (
    DEFAULT_SECTION,
    cmd_semaphore_asl,
    cmd_semaphore_set,
    cmd_semaphore_status,
    semaphore_limit,
    semaphore_name,
)
from sluice.cli.status import cmd_status, cmd_wait
from sluice.errors import ConfigurationError, SluiceError, TransientError
from sluice.lanes import DEFAULT_LANE
from sluice.pointers import DEFAULT_THRESHOLD
from sluice.settings import pointer_threshold

CREDENTIAL_CODES = frozenset(
    {"ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException"}
)
CREDENTIALS_HELP = (
    "no usable AWS credentials. Set AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or log in "
    "with `aws sso login`; for the embedded AWS of `make demo`, any dummy keys with AWS_ENDPOINT_URL set to it"
)


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


def build_parser() -> argparse.ArgumentParser:
    common = [_common(defaults=False)]
    parser = argparse.ArgumentParser(
        prog="sluice",
        description="Operate Sluice: enqueue payloads, watch and tune concurrency, handle the DLQ.",
        epilog="Exit codes: 0 ok, 1 partly done or not found, 2 usage or configuration, 3 AWS unavailable, "
        "130 interrupted, 141 standard output closed (`| head`).",
        parents=[_common(defaults=True)],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("enqueue", parents=common, help="send payloads (JSON object, array or JSON Lines)")
    p.add_argument("file", help="file to read, or - for standard input")
    p.add_argument(
        "--key-field",
        type=_not_empty("the field name"),
        help="field that identifies a payload when it has no string 'id'",
    )
    p.add_argument(
        "--group-by",
        type=_not_empty("the field name"),
        help="field whose value is the FIFO message group (default: the payload key)",
    )
    p.add_argument("--dedup-id", help="deduplication id for a single payload (default: hash of the payload)")
    p.add_argument(
        "--pointer-threshold",
        type=_pointer_threshold,
        metavar="BYTES",
        help="store a body over this many bytes in the stack's payload bucket and send a pointer "
        f"(0 to {DEFAULT_THRESHOLD:,}; default SLUICE_POINTER_THRESHOLD, else {DEFAULT_THRESHOLD:,})",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="run each key successfully at most once: a key that has SUCCEEDED is not started again "
        "(message attribute sluice-once)",
    )
    p.add_argument(
        "--after",
        type=_not_empty("the awaited key"),
        action="append",
        default=[],
        metavar="KEY",
        help="start each payload only once KEY has SUCCEEDED (repeatable; message attribute sluice-awaits); "
        "a cycle among the keys enqueued and the parked waiters is refused",
    )
    p.add_argument(
        "--on-await-failure",
        choices=("dead-letter", "run"),
        default=None,
        help="when an awaited key ends FAILED, TIMED_OUT or ABORTED: dead-letter the payload (default) or run it",
    )
    p.add_argument(
        "--lane",
        default=DEFAULT_LANE,
        type=_not_empty("the lane name"),
        metavar="NAME",
        help="send to lane NAME's queue (stack parameter lanes; default: the lane 'default', the stack's queue)",
    )
    keyed = p.add_mutually_exclusive_group()
    keyed.add_argument(
        "--concurrency-key",
        type=_not_empty("the concurrency key"),
        metavar="KEY",
        help="run at most the key's cap of these payloads at once (stack parameter keyConcurrency, or "
        "set-max --key); the others wait in the key's line (message attribute sluice-concurrency-key)",
    )
    keyed.add_argument(
        "--concurrency-key-field",
        type=_not_empty("the field name"),
        metavar="FIELD",
        help="the same, with each payload's concurrency key taken from its field FIELD (a string or number)",
    )
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("status", parents=common, help="overview, or one payload's record and history")
    p.add_argument("payload_id", nargs="?", help="payload key (its 'id')")
    p.add_argument(
        "--tree", action="store_true", help="with a key: what it awaits and what awaits it, with states"
    )
    p.add_argument(
        "--lane",
        type=_not_empty("the lane name"),
        metavar="NAME",
        help="lane NAME only: its MAX, pool and queue (with a payload key: what holds starts there)",
    )
    p.add_argument(
        "--concurrency-key",
        type=_not_empty("the concurrency key"),
        metavar="KEY",
        help="concurrency key KEY's cap, runs and line (with a payload key: whether the key holds it)",
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "wait",
        parents=common,
        help="wait for a payload's receipt: exit 0 if it SUCCEEDED, 1 if it ended otherwise, 2 on timeout",
    )
    p.add_argument("payload_id", help="payload key (its 'id')")
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        metavar="S",
        help="give up after S seconds, a number above 0 (exit 2)",
    )
    p.set_defaults(func=cmd_wait)

    p = sub.add_parser(
        "set-max",
        parents=common,
        help=f"set MAX at run time (a whole number from 0 to {MAX_CEILING:,}; 0 pauses)",
    )
    p.add_argument("value", type=_max_or_default, metavar="N")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--key",
        type=_not_empty("the concurrency key"),
        metavar="KEY",
        help="set concurrency key KEY's own cap instead (0 pauses the key; N 'default' puts it back on the "
        "stack's keyConcurrency)",
    )
    which.add_argument(
        "--lane",
        type=_not_empty("the lane name"),
        metavar="NAME",
        help="set lane NAME's MAX instead (N 'default' puts it back on the configured MAX; a paused lane "
        "stays paused)",
    )
    p.set_defaults(func=cmd_set_max)

    p = sub.add_parser("pause", parents=common, help="set MAX to 0, remembering the current value")
    p.add_argument(
        "--lane",
        type=_not_empty("the lane name"),
        metavar="NAME",
        help="pause lane NAME only: nothing starts there, the other lanes go on",
    )
    p.set_defaults(func=cmd_pause)
    p = sub.add_parser("resume", parents=common, help="restore the MAX that pause remembered")
    p.add_argument(
        "--lane",
        type=_not_empty("the lane name"),
        metavar="NAME",
        help="resume lane NAME, with the MAX it had",
    )
    p.set_defaults(func=cmd_resume)

    dlq = sub.add_parser("dlq", parents=common, help="list, redrive or delete dead-lettered messages")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    p = dsub.add_parser("list", parents=common, help="show DLQ messages without consuming them")
    p.add_argument(
        "--limit", type=_count(1, 100_000), default=100, help="list at most this many (default 100)"
    )
    p.add_argument(
        "--width",
        type=_count(1, 1_000_000),
        default=100,
        help="characters of reason and body shown (default 100)",
    )
    p.set_defaults(func=cmd_dlq_list)
    p = dsub.add_parser(
        "redrive",
        parents=common,
        help="send DLQ messages back to the payload queue (with lanes, each to its lane's)",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--id", dest="ids", action="append", metavar="ID", help="DLQ message id (repeatable)")
    which.add_argument("--all", action="store_true", help="every message in the DLQ")
    p.add_argument(
        "--lane",
        type=_not_empty("the lane name"),
        metavar="NAME",
        help="send them to lane NAME's queue (default: each message's own lane, from the queue it came from "
        "or its sluice-lane attribute)",
    )
    p.set_defaults(func=cmd_dlq_redrive)
    p = dsub.add_parser("delete", parents=common, help="delete DLQ messages for good")
    p.add_argument(
        "--id", dest="ids", action="append", metavar="ID", required=True, help="DLQ message id (repeatable)"
    )
    p.set_defaults(func=cmd_dlq_delete)

    sem = sub.add_parser(
        "semaphore", parents=common, help="semaphore steps: set a limit, show, print the ASL"
    )
    ssub = sem.add_subparsers(dest="semaphore_command", required=True, metavar="ACTION")
    p = ssub.add_parser(
        "set",
        parents=common,
        help="put a limit in force (a whole number >= 0; 0 pauses); creates the semaphore",
    )
    p.add_argument("name", type=semaphore_name, metavar="NAME")
    p.add_argument("limit", type=semaphore_limit, metavar="N")
    p.set_defaults(func=cmd_semaphore_set)
    p = ssub.add_parser(
        "status", parents=common, help="one semaphore's holders and waiters, or every semaphore"
    )
    p.add_argument("name", nargs="?", type=semaphore_name, metavar="NAME")
    p.set_defaults(func=cmd_semaphore_status)
    p = ssub.add_parser(
        "asl", parents=common, help="print the Acquire/Release states to copy into a workflow (no AWS call)"
    )
    p.add_argument("name", type=semaphore_name, metavar="NAME")
    p.add_argument(
        "--function",
        type=_not_empty("the function ARN"),
        metavar="ARN",
        help="ARN of Sluice's semaphore function (default: the stack output SemaphoreFunctionArn; "
        "given, no AWS call is made)",
    )
    p.add_argument(
        "--section",
        metavar="STATE",
        help=f"first state of your section (default {DEFAULT_SECTION}; not with --wrap)",
    )
    p.add_argument(
        "--next",
        metavar="STATE",
        help="state after the section (default: the execution ends after Release; not with --wrap)",
    )
    p.add_argument(
        "--acquisition-id", help="names this acquisition in the execution (default: from --section)"
    )
    p.add_argument(
        "--timeout",
        type=_count(1, MAX_SECONDS),
        metavar="SECONDS",
        help="TimeoutSeconds of Acquire: the longest wait",
    )
    p.add_argument(
        "--heartbeat", type=_count(1, MAX_SECONDS), metavar="SECONDS", help="HeartbeatSeconds of Acquire"
    )
    p.add_argument("--label", help="names the added states (default: the semaphore's name)")
    p.add_argument(
        "--wrap",
        metavar="FILE",
        help="print this state machine definition (- for standard input) held under NAME",
    )
    p.set_defaults(func=cmd_semaphore_asl)

    p = sub.add_parser("tick", parents=common, help="run one launcher tick here, with the deployed settings")
    p.add_argument(
        "--time-limit",
        type=_seconds,
        help=f"seconds the tick may run (default: the launcher function's timeout, else {DEFAULT_TICK_SECONDS})",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="log what the launcher does to standard error"
    )
    p.set_defaults(func=cmd_tick)
    return parser


def main(argv: list[str] | None = None, *, session: Any = None, clock: Any = None) -> int:
    """Run one command; returns the exit code. ``session`` (a boto3 Session) and ``clock`` (a
    ``Clock``, with ``sleep`` for ``sluice wait``) are for embedding and tests."""
    try:
        code = _parse_and_run(argv, session, clock)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
    except BrokenPipeError:
        return _pipe_closed()
    return code


def _parse_and_run(argv: list[str] | None, session: Any, clock: Any) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _check_together(parser, args)
    except SystemExit as exc:  # usage errors (2) and --help (0); returned so main() can run in-process
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_CONFIG
    return _run(args, session, clock)


def _check_together(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Options that mean nothing without another: refused, never silently ignored."""
    command = args.command
    if command == "status" and args.payload_id is None and args.tree:
        parser.error("status --tree needs a payload key: sluice status KEY --tree")
    if command == "enqueue" and args.on_await_failure is not None and not args.after:
        parser.error("enqueue --on-await-failure needs --after KEY: without it nothing is awaited")
    if command == "semaphore" and args.semaphore_command == "asl" and args.wrap is not None:
        given = [option for option, value in (("--section", args.section), ("--next", args.next)) if value]
        if given:
            parser.error(
                f"semaphore asl --wrap holds the whole definition under the semaphore: {' and '.join(given)} "
                "are for the states to copy (without --wrap)"
            )


def _offline(args: argparse.Namespace) -> bool:
    """A command that needs no AWS: ``semaphore asl`` given ``--function``."""
    return args.command == "semaphore" and args.semaphore_command == "asl" and args.function is not None


def _pipe_closed() -> int:
    """Standard output's reader went away (``sluice ... | head``): stop quietly, as the Python docs
    advise: point standard output at /dev/null so that the flush at exit raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (standard output replaced in-process)
        pass
    return EXIT_PIPE


def _run(args: argparse.Namespace, session: Any, clock: Any) -> int:
    try:
        if _offline(args):
            return int(args.func(args))
        return int(args.func(make_context(args, session, clock)))
    except TransientError as exc:
        print(
            f"sluice: AWS is unavailable or throttling, try again: {exc}{_endpoint_hint()}", file=sys.stderr
        )
        return EXIT_AWS
    except SluiceError as exc:
        print(f"sluice: {_credentials_problem(exc) or exc}{_hint(args)}", file=sys.stderr)
        return EXIT_CONFIG
    except ClientError as exc:  # a call not wrapped in an adapter
        code = error_code(exc)
        error = translate_client_error(exc, exc.operation_name)
        if code in THROTTLING or isinstance(error, TransientError):
            print(f"sluice: AWS is unavailable or throttling, try again: {error}", file=sys.stderr)
            return EXIT_AWS
        print(f"sluice: {_credentials_problem(exc) or error}", file=sys.stderr)
        return EXIT_CONFIG
    except BotoCoreError as exc:
        print(f"sluice: {_credentials_problem(exc) or exc}{_endpoint_hint()}", file=sys.stderr)
        return EXIT_AWS if "Could not connect" in str(exc) else EXIT_CONFIG
    except BrokenPipeError:
        raise  # main's: the reader of standard output went away
    except OSError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        print("sluice: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _causes(exc: BaseException | None) -> Iterator[BaseException]:
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


def _credentials_problem(exc: BaseException) -> str | None:
    from botocore.exceptions import NoCredentialsError, PartialCredentialsError

    for e in _causes(exc):
        if isinstance(e, NoCredentialsError | PartialCredentialsError):
            return CREDENTIALS_HELP
        if isinstance(e, ClientError) and error_code(e) in CREDENTIAL_CODES:
            return f"{CREDENTIALS_HELP} (AWS said {error_code(e)})"
    return None


def _hint(args: argparse.Namespace) -> str:
    if args.command == "semaphore" and args.semaphore_command == "asl":
        return " (or name the semaphore function with --function ARN: then no AWS call is made)"
    return ""


def _endpoint_hint() -> str:
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    return f" (AWS_ENDPOINT_URL is {endpoint}: is it running?)" if endpoint else ""
