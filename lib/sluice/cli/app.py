"""``main``, given the parser (sluice.cli.parser): one command, its exit code, and what went wrong in words."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice.adapters.errors import THROTTLING, error_code, translate_client_error
from sluice.cli.context import make_context
from sluice.cli.parser import build_parser
from sluice.cli.render import EXIT_AWS, EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_PIPE
from sluice.core.errors import SluiceError, TransientError

CREDENTIAL_CODES = frozenset(
    {"ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException"}
)
CREDENTIALS_HELP = (
    "no usable AWS credentials. Set AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or log in "
    "with `aws sso login`; for the embedded AWS of `make demo`, any dummy keys with AWS_ENDPOINT_URL set to it"
)


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
