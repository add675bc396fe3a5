"""``sluice``: the operator's command line.

    sluice enqueue FILE|-            send payloads (one JSON object, a JSON array, or JSON Lines)
    sluice status [PAYLOAD_ID]       overview, or one payload's record and execution history
    sluice set-max N                 change MAX at run time (0 pauses)
    sluice pause | resume            MAX to 0 and back to the value it had
    sluice dlq list                  show dead-lettered messages without consuming them
    sluice dlq redrive --id ID|--all send them back to the main queue
    sluice dlq delete --id ID        drop them (after re-enqueueing a fixed payload, say)
    sluice tick                      one launcher tick, run here

Resources are found from the CloudFormation stack's outputs (``--stage`` → stack ``sluice-<stage>``,
or ``--stack``; ``--region``); any ``SLUICE_*`` environment variable set overrides its output, and
when the variables name every resource a command uses, no stack is read. boto3 honours ``AWS_ENDPOINT_URL``, so the same commands work
on a real account and on the embedded AWS. Tables for people by default, ``--json`` for scripts.

Exit codes:
    0  success (also: nothing to do, such as ``pause`` when already paused)
    1  partly done or not found: some payloads or DLQ messages failed, no record for a payload
    2  usage or configuration: bad arguments, stack or credentials missing, setting invalid
    3  AWS unavailable or throttling: nothing is known to be wrong, try again
  130  interrupted (Ctrl-C); DLQ messages in hand are made visible again first
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice import ops
from sluice.adapters.errors import THROTTLING, error_code, translate_client_error
from sluice.errors import ConfigurationError, SluiceError, TransientError
from sluice.runtime import Runtime
from sluice.settings import Settings

EXIT_OK, EXIT_PARTIAL, EXIT_CONFIG, EXIT_AWS = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

# Stack output → Settings field, and the environment variable that overrides it.
OUTPUTS = {
    "QueueUrl": "queue_url",
    "DlqUrl": "dlq_url",
    "TableName": "table_name",
    "StateMachineArn": "state_machine_arn",
    "MaxConcurrencyParameter": "max_parameter",
}
ENV_NAMES = {
    "queue_url": "SLUICE_QUEUE_URL",
    "dlq_url": "SLUICE_DLQ_URL",
    "table_name": "SLUICE_TABLE_NAME",
    "state_machine_arn": "SLUICE_STATE_MACHINE_ARN",
    "max_parameter": "SLUICE_MAX_PARAMETER",
}
LAUNCHER_OUTPUT = "LauncherLambdaFunctionQualifiedArn"
LAUNCHER_RESOURCE = "LauncherLambdaFunction"
ENQUEUE_CHUNK = 100  # items per enqueue call: a failure names the first item not sent
DEFAULT_TICK_SECONDS = 120  # the stack's default launcherTimeout
DEFAULT_REGION = "us-east-1"  # the stack's region when nothing names one (stack/region.js)
PROGRESS_FROM = 50  # items; fewer are sent without a progress bar
DEDUP_ID = re.compile(r"^[!-~]{1,128}$")
CREDENTIAL_CODES = frozenset(
    {"ExpiredToken", "ExpiredTokenException", "InvalidClientTokenId", "UnrecognizedClientException"}
)
CREDENTIALS_HELP = (
    "no usable AWS credentials. Set AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), or log in "
    "with `aws sso login`; for the embedded AWS of `make demo`, any dummy keys with AWS_ENDPOINT_URL set to it"
)


@dataclass
class Context:
    args: argparse.Namespace
    runtime: Runtime
    stack: str | None = None  # None when the environment named every resource
    outputs: dict[str, str] = field(default_factory=dict)
    _launcher: Launcher | None = None

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    def out(self, human: str, data: Any) -> None:
        if self.args.json:
            print(json.dumps(data, indent=2, sort_keys=True, default=str))
        else:
            print(human)

    # -- what the deployed launcher runs with ---------------------------------------------------------

    def launcher(self) -> Launcher:
        """The deployed launcher function's settings, as far as they can be read (best effort)."""
        if self._launcher is None:
            self._launcher = _read_launcher(self)
        return self._launcher

    def deployed_default(self) -> int | None:
        """The deployed default MAX: ``SLUICE_MAX_CONCURRENCY`` here, else the launcher's."""
        raw = os.environ.get("SLUICE_MAX_CONCURRENCY", "").strip()
        if not raw:
            raw = self.launcher().environment.get("SLUICE_MAX_CONCURRENCY", "").strip()
        try:
            value = int(raw)
        except ValueError:
            return None
        return value if value >= 0 else None


def _local_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("SLUICE_") and v.strip()}


@dataclass(frozen=True)
class Launcher:
    """What the CLI knows of the deployed launcher function."""

    environment: dict[str, str]  # its SLUICE_* variables
    source: str  # where they came from, for the output
    timeout: float | None = None  # seconds


def _read_launcher(ctx: Context) -> Launcher:
    """Ask Lambda for the launcher's configuration: by the stack output's qualified ARN, else by the
    stack's ``LauncherLambdaFunction`` resource. Nothing found: the defaults, and say so."""
    if not ctx.stack:
        return Launcher({}, "no stack: the defaults and this shell's SLUICE_* variables")
    failures: list[str] = []
    for function in _launcher_candidates(ctx, failures):
        try:
            config = ctx.runtime.client("lambda").get_function_configuration(FunctionName=function)
        except Exception as exc:  # best effort, as above
            failures.append(f"{function}: {_short(exc)}")
            continue
        variables = (config.get("Environment") or {}).get("Variables") or {}
        name = config.get("FunctionName", function)
        environment = {k: v for k, v in variables.items() if k.startswith("SLUICE_")}
        return Launcher(environment, f"launcher function {name}", config.get("Timeout"))
    unread = "; ".join(failures)
    return Launcher({}, f"the defaults and this shell's SLUICE_* variables (launcher not readable: {unread})")


def _launcher_candidates(ctx: Context, failures: list[str]) -> Iterator[str]:
    if ctx.outputs.get(LAUNCHER_OUTPUT):
        yield ctx.outputs[LAUNCHER_OUTPUT]
    try:
        resources = ctx.runtime.client("cloudformation").describe_stack_resources(StackName=ctx.stack)[
            "StackResources"
        ]
    except Exception as exc:  # best effort: any failure means "use the defaults, and say so"
        failures.append(f"{LAUNCHER_RESOURCE}: {_short(exc)}")
        return
    for resource in resources:
        if resource.get("LogicalResourceId") == LAUNCHER_RESOURCE and resource.get("PhysicalResourceId"):
            yield resource["PhysicalResourceId"]
            return
    failures.append(f"stack {ctx.stack} has no {LAUNCHER_RESOURCE}")


def _short(exc: Exception) -> str:
    text = error_code(exc) if isinstance(exc, ClientError) else str(exc).splitlines()[0]
    return text if len(text) <= 100 else text[:99] + "…"


# -- finding the stack ---------------------------------------------------------------------------------


def _stack_name(args: argparse.Namespace) -> str:
    return args.stack or f"sluice-{args.stage}"


def read_outputs(session: Any, stack: str) -> dict[str, str]:
    """The stack's outputs. Raises ``ConfigurationError`` with what to do when it cannot be read."""
    cfn = session.client("cloudformation")
    try:
        stacks = cfn.describe_stacks(StackName=stack)["Stacks"]
    except ClientError as exc:
        code = error_code(exc)
        if code == "ValidationError" and "does not exist" in str(exc):
            where = session.region_name or "the default region"
            endpoint = os.environ.get("AWS_ENDPOINT_URL")
            raise ConfigurationError(
                f"stack {stack!r} not found in {where}"
                + (f" at {endpoint} (AWS_ENDPOINT_URL)" if endpoint else "")
                + ". Deploy it first (`npx sls deploy --stage <stage>`, or `make demo` for the embedded AWS), "
                "point at another one with --stage, --stack or --region, or name every resource with "
                + ", ".join(ENV_NAMES.values())
                + "."
            ) from exc
        raise translate_client_error(exc, f"DescribeStacks({stack})") from exc
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}


def _needs(args: argparse.Namespace) -> tuple[str, ...]:
    """The resources a command uses. When the environment names them all, no stack is read (a
    producer holding only the producer policy can ``sluice enqueue`` with SLUICE_QUEUE_URL alone)."""
    command = getattr(args, "command", None)
    if command == "dlq":
        command = f"dlq {args.dlq_command}"
    if command == "status" and getattr(args, "payload_id", None) is not None:
        return ("table_name",)
    return {
        "enqueue": ("queue_url",),
        "set-max": ("max_parameter", "table_name"),
        "pause": ("max_parameter", "table_name"),
        "resume": ("max_parameter", "table_name"),
        "dlq list": ("dlq_url",),
        "dlq delete": ("dlq_url",),
        "dlq redrive": ("queue_url", "dlq_url"),
    }.get(command, tuple(ENV_NAMES))


def _resolve(args: argparse.Namespace, session: Any) -> tuple[Settings, str | None, dict[str, str]]:
    local = _local_env()
    if all(local.get(ENV_NAMES[field]) for field in _needs(args)):
        return Settings.from_env(local), None, {}
    stack = _stack_name(args)
    outputs = read_outputs(session, stack)
    from_stack = {ENV_NAMES[f]: outputs[name] for name, f in OUTPUTS.items() if outputs.get(name)}
    return Settings.from_env({**from_stack, **local}), stack, outputs


def resolve_settings(args: argparse.Namespace, session: Any) -> Settings:
    """Environment first, then the stack's outputs for whatever the environment left empty."""
    return _resolve(args, session)[0]


def _region(args: argparse.Namespace) -> str | None:
    """``--region``, else ``AWS_REGION`` (read first by the AWS SDKs, but not by boto3), else None: boto3
    then reads ``AWS_DEFAULT_REGION`` and the profile's region. The stack resolves its region in the
    same order (stack/region.js), so both look in the same place."""
    return args.region or os.environ.get("AWS_REGION", "").strip() or None


def make_context(args: argparse.Namespace, session: Any = None) -> Context:
    """Resolve settings and build the runtime; ``session`` is a boto3 Session (a new one when None)."""
    import boto3

    if session is None:
        session = boto3.session.Session(region_name=_region(args))
        if not session.region_name:  # nothing in the environment or the profile: the stack's default
            session = boto3.session.Session(region_name=DEFAULT_REGION)
    settings, stack, outputs = _resolve(args, session)
    return Context(args, Runtime(settings, session=session), stack, outputs)


def make_runtime(args: argparse.Namespace) -> Runtime:
    return make_context(args).runtime


# -- commands ------------------------------------------------------------------------------------------


def cmd_enqueue(ctx: Context) -> int:
    from sluice.enqueue import EnqueueReport, enqueue, read_items

    args = ctx.args
    ctx.settings.require("queue_url")
    if args.file == "-":
        text = sys.stdin.read()
    else:
        with open(args.file, encoding="utf-8") as handle:
            text = handle.read()
    items = list(read_items(text))
    if args.dedup_id is not None:
        if not DEDUP_ID.match(args.dedup_id):
            return _usage("--dedup-id must be 1 to 128 printable ASCII characters without spaces")
        if len(items) > 1:
            return _usage(
                f"--dedup-id gives every payload the same deduplication id, so SQS would keep only the first "
                f"of these {len(items)}; use it with a single payload"
            )
    report = EnqueueReport()
    unsent = ""
    error: SluiceError | None = None
    with _progress(len(items), quiet=args.json or len(items) < PROGRESS_FROM) as advance:
        for start in range(0, len(items), ENQUEUE_CHUNK):
            chunk = items[start : start + ENQUEUE_CHUNK]
            try:
                part = enqueue(
                    ctx.runtime.client("sqs"),
                    ctx.settings.queue_url,
                    chunk,
                    key_field=args.key_field,
                    group_by=args.group_by,
                    dedup_id=args.dedup_id,
                    progress=advance,
                )
            except SluiceError as exc:
                # Earlier chunks went; say exactly where sending stopped. Re-sending the whole input
                # within 5 minutes is safe: SQS drops what it already has (same deduplication ids).
                unsent = f"{chunk[0].where} and after were not sent: {exc}"
                error = exc
                break
            report.sent.extend(part.sent)
            report.failed.extend(part.failed)
    for where, reason in report.failed:
        print(f"sluice enqueue: {where}: {reason}", file=sys.stderr)
    if unsent:
        print(f"sluice enqueue: {unsent}", file=sys.stderr)
    repeats = _repeats(items, {w for w, _, _ in report.sent}) if args.dedup_id is None else 0
    human = f"sent {len(report.sent)} of {len(items)} payloads"
    if report.failed:
        human += f"; {len(report.failed)} refused (see above)"
    if repeats:
        human += (
            f"; {repeats} repeated an earlier payload of this input, so SQS accepted and dropped them "
            "(same deduplication id within 5 minutes)"
        )
    ctx.out(
        human,
        {
            "total": len(items),
            "sent": [{"where": w, "key": k, "message_id": m} for w, k, m in report.sent],
            "failed": [{"where": w, "reason": r} for w, r in report.failed],
            "unsent": unsent or None,
            "repeats": repeats,
        },
    )
    if unsent:
        return EXIT_AWS if isinstance(error, TransientError) else EXIT_CONFIG
    return EXIT_OK if report.ok else EXIT_PARTIAL


def _repeats(items: list[Any], sent: set[str]) -> int:
    """How many sent items have the content of an earlier one: same deduplication id, one message."""
    from sluice.validation import content_hash, parse_object

    seen: set[str] = set()
    repeats = 0
    for item in items:
        if item.where not in sent:
            continue
        digest = content_hash(parse_object(item.body))
        repeats += digest in seen
        seen.add(digest)
    return repeats


def cmd_status(ctx: Context) -> int:
    if ctx.args.payload_id is None:
        return _overview(ctx)
    data = ops.payload_history(ctx.runtime, ctx.args.payload_id)
    if data is None:
        print(f"sluice status: no record for payload {ctx.args.payload_id!r}", file=sys.stderr)
        return EXIT_PARTIAL
    p = data["payload"]
    lines = [
        f"payload     {p['key']}",
        f"state       {p['state']}" + (f"  (lease held by {p['holder']})" if p["holder"] else ""),
        f"attempts    {p['attempts']}    duplicates suppressed {p['duplicates']}",
        f"updated     {_when(p['updated_at'])}    record expires {_when(p['expires_at'])}",
    ]
    if p["reason"]:
        lines.append(f"reason      {p['reason']}")
    lines.append(f"executions  {len(data['executions'])}, oldest first")
    for run in data["executions"]:
        lines.append(f"  {run['state']:<10} {run['name']}")
        lines.append(f"             message {run['message_id']}, claimed {_when(run['claimed_at'])}")
        if run["started_at"] or run["ended_at"]:
            lines.append(f"             started {_when(run['started_at'])}, ended {_when(run['ended_at'])}")
        if run["arn"]:
            lines.append(f"             {run['arn']}")
        if run["error"]:
            lines.append(
                f"             error: {run['error']}" + (f": {run['cause']}" if run["cause"] else "")
            )
    ctx.out("\n".join(lines), data)
    return EXIT_OK


def _overview(ctx: Context) -> int:
    data = ops.overview(ctx.runtime, deployed_default=ctx.deployed_default)
    data["stack"] = ctx.stack
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
    max_line += f"  ({data['max_source']}" + (f" {data['max_parameter']})" if data["max_parameter"] else ")")
    running = f"{data['running']} holding slots"
    if mx == 0:
        running += " (paused: a freed slot is not refilled)"
    elif data["limit"] is not None and data["running"] > data["limit"]:
        running += f" of {data['limit']} (over the limit: no new start until fewer than {data['limit']} run)"
    elif data["limit"] is not None:
        running += f" of {data['limit']} ({data['free']} free)"
    running += f"; Step Functions lists {data['sfn_running']} RUNNING"
    if data["running_not_in_ledger"] or data["ledger_not_running"]:
        running += (
            f" ({data['running_not_in_ledger']} not in the ledger, "
            f"{data['ledger_not_running']} in the ledger but not listed)"
        )
    age = data["oldest_message_age"]
    rows = [
        ("stack", ctx.stack or "(from SLUICE_* environment variables)"),
        ("MAX", max_line),
        ("running", running),
        ("external", f"{data['external']} RUNNING executions not started by Sluice (they count against MAX)"),
        (
            "queue",
            f"{data['queue_visible']} waiting, {data['queue_in_flight']} in flight, "
            f"{data['queue_delayed']} delayed",
        ),
        (
            "oldest",
            (_duration(age) if age is not None else "unknown") + f"  ({data['oldest_message_age_source']})",
        ),
        (
            "DLQ",
            _count(data["dlq"], "message")
            + (f", {data['dlq_in_flight']} in flight" if data["dlq_in_flight"] else "")
            + ("  → sluice dlq list" if data["dlq"] else ""),
        ),
        (
            "drift",
            f"{data['drift']} at the last reconciliation"
            + (
                f", {_duration(data['reconciled_ago'])} ago"
                if data["reconciled_ago"] is not None
                else " (never ran)"
            ),
        ),
    ]
    ctx.out(_rows(rows), data)
    return EXIT_OK


def cmd_set_max(ctx: Context) -> int:
    result = ops.set_max(ctx.runtime, ctx.args.value)
    before = result["before"] if result["before"] is not None else (result["before_raw"] or "unset")
    lines = [
        f"MAX {before} → {result['max']} on {result['parameter']}.",
        _takes_effect(result["cache_seconds"]) + " Nothing running is stopped.",
    ]
    if result["max"] == 0:
        lines.append("MAX 0 pauses. `sluice pause` does the same and lets `sluice resume` restore the value.")
    elif result["running"] > result["max"]:
        lines.append(
            f"{result['running']} are running, more than {result['max']}: "
            f"no new start until fewer than {result['max']} run."
        )
    if result["cleared_resume_max"] is not None:
        lines.append(
            f"This ends the pause: the value it remembered ({result['cleared_resume_max']}) is dropped."
        )
    ctx.out("\n".join(lines), result)
    return EXIT_OK


def cmd_pause(ctx: Context) -> int:
    result = ops.pause(ctx.runtime, ctx.deployed_default)
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
                "New starts stop from the next launcher tick (a warm launcher may use the old MAX for up to "
                f"{result['cache_seconds']:g} s). Watch `sluice status` until running reaches 0.",
            ]
        )
    ctx.out(human, result)
    return EXIT_OK


def cmd_resume(ctx: Context) -> int:
    result = ops.resume(ctx.runtime, ctx.deployed_default)
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
        human = (
            f"resumed: MAX {result['before'] if result['before'] is not None else result['before_raw']} → "
            f"{result['max']} on {result['parameter']} ({source}).\n" + _takes_effect(result["cache_seconds"])
        )
    ctx.out(human, result)
    return EXIT_OK


def cmd_dlq_list(ctx: Context) -> int:
    listing = ops.dlq_list(ctx.runtime, limit=ctx.args.limit)
    data = {
        "messages": [m.as_dict() for m in listing.messages],
        "visible": listing.visible,
        "in_flight": listing.in_flight,
    }
    if not listing.messages:
        human = (
            "the DLQ is empty"
            if not listing.in_flight
            else f"no visible message ({listing.in_flight} in flight)"
        )
        ctx.out(human, data)
        return EXIT_OK
    lines: list[str] = []
    width = ctx.args.width
    for m in listing.messages:
        lines.append(
            f"{m.message_id}  group {m.group_id or '-'}  receives {m.receive_count}  sent {_when(m.sent_at)}"
        )
        if m.source_message_id != m.message_id:
            lines.append(f"  source   {m.source_message_id}")
        if m.key:
            lines.append(f"  key      {_preview(m.key, width)}")
        lines.append(f"  reason   {_preview(m.reason, width)}")
        lines.append(f"  body     {_preview(m.body, width)}")
    lines.append(
        f"{len(listing.messages)} listed of about {listing.visible} visible"
        + (f" and {listing.in_flight} in flight (not shown)" if listing.in_flight else "")
        + ". A FIFO queue shows at most the first 10 messages of each group; `--json` gives full bodies."
    )
    lines.append(
        "Fix the cause first: a redriven payload that is still invalid comes straight back here. "
        "Then: sluice dlq redrive --id ID (or --all)"
    )
    ctx.out("\n".join(lines), data)
    return EXIT_OK


def cmd_dlq_redrive(ctx: Context) -> int:
    if not ctx.args.all and not ctx.args.ids:
        return _usage(
            "say which messages to redrive: --id MESSAGE_ID (repeat it; ids from `sluice dlq list`) or --all"
        )
    report = ops.dlq_redrive(ctx.runtime, None if ctx.args.all else ctx.args.ids)
    lines = [f"redrove {len(report.done)} message(s) to the main queue"]
    for d in report.done:
        lines.append(f"  {d['dlq_message_id']} → {d['message_id']}")
    lines.append(
        "A payload that was invalid comes back to the DLQ unless it was fixed; the others run again "
        "on the next launcher tick (or are suppressed as duplicates while the same key is running)."
    )
    return _finish_dlq(ctx, report, lines)


def cmd_dlq_delete(ctx: Context) -> int:
    report = ops.dlq_delete(ctx.runtime, ctx.args.ids)
    lines = [f"deleted {len(report.done)} message(s) from the DLQ"]
    lines.extend(f"  {d['dlq_message_id']}" for d in report.done)
    return _finish_dlq(ctx, report, lines)


def _finish_dlq(ctx: Context, report: ops.DlqReport, lines: list[str]) -> int:
    for f in report.failed:
        print(f"sluice dlq: {f['dlq_message_id']}: {f['reason']}", file=sys.stderr)
    for missing in report.not_found:
        print(
            f"sluice dlq: {missing}: not found among the visible DLQ messages (already handled, in flight, "
            "or behind earlier messages of its FIFO group)",
            file=sys.stderr,
        )
    if report.interrupted:
        print(
            f"sluice dlq: stopped early, AWS is unavailable or throttling: {report.interrupted}",
            file=sys.stderr,
        )
    if report.failed:
        lines.append(f"{len(report.failed)} failed (see above)")
    ctx.out("\n".join(lines), report.as_dict())
    if report.interrupted:
        return EXIT_AWS
    return EXIT_OK if report.ok else EXIT_PARTIAL


def cmd_tick(ctx: Context) -> int:
    if ctx.args.verbose:
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
        )
    launcher = ctx.launcher()
    deployed, source = launcher.environment, launcher.source
    outputs = {ENV_NAMES[f]: ctx.outputs[name] for name, f in OUTPUTS.items() if ctx.outputs.get(name)}
    settings = Settings.from_env({**deployed, **outputs, **_local_env()})
    overrides = sorted(k for k in _local_env() if deployed.get(k) != os.environ[k])
    rt = Runtime(settings, session=ctx.runtime.session)
    # As long as the deployed launcher may run: longer, and a message could reappear while in hand.
    time_limit = ctx.args.time_limit or launcher.timeout or DEFAULT_TICK_SECONDS
    summary = ops.tick(rt, time_limit=time_limit)
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
    ctx.out(_rows(rows), data)
    return EXIT_AWS if summary.stopped == "transient" else EXIT_OK


# -- output helpers ------------------------------------------------------------------------------------


def _usage(message: str) -> int:
    print(f"sluice: {message}", file=sys.stderr)
    return EXIT_CONFIG


def _takes_effect(cache_seconds: float) -> str:
    return (
        "It takes effect on the next launcher tick or completion "
        f"(a warm launcher re-reads MAX within {cache_seconds:g} s)."
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _rows(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows) + 2
    return "\n".join(f"{k:<{width}}{v}" for k, v in rows)


def _when(ts: float | int | None) -> str:
    if not ts:
        return "-"
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _preview(text: str, width: int) -> str:
    flat = text.replace("\n", "\\n")
    return flat if len(flat) <= width else flat[: width - 1] + "…"


class _progress:
    """A progress bar on standard error for long enqueues; nothing when quiet or not a terminal."""

    def __init__(self, total: int, *, quiet: bool) -> None:
        self.total = total
        self.quiet = quiet or not sys.stderr.isatty()
        self.bar: Any = None

    def __enter__(self) -> Callable[[int], None] | None:
        if self.quiet:
            return None
        try:
            from rich.console import Console
            from rich.progress import Progress
        except ImportError:
            return None
        self.bar = Progress(console=Console(stderr=True), transient=True)
        task = self.bar.add_task("enqueue", total=self.total)
        self.bar.start()
        return lambda n: self.bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


# -- parser --------------------------------------------------------------------------------------------


def _max_value(raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{raw!r}: MAX must be a whole number >= 0 (0 pauses)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value}: MAX must be >= 0 (0 pauses)")
    return value


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
        epilog="Exit codes: 0 ok, 1 partly done or not found, 2 usage or configuration, 3 AWS unavailable.",
        parents=[_common(defaults=True)],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("enqueue", parents=common, help="send payloads (JSON object, array or JSON Lines)")
    p.add_argument("file", help="file to read, or - for standard input")
    p.add_argument("--key-field", help="field that identifies a payload when it has no string 'id'")
    p.add_argument(
        "--group-by", help="field whose value is the FIFO message group (default: the payload key)"
    )
    p.add_argument("--dedup-id", help="deduplication id for a single payload (default: hash of the payload)")
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("status", parents=common, help="overview, or one payload's record and history")
    p.add_argument("payload_id", nargs="?", help="payload key (its 'id')")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("set-max", parents=common, help="set MAX at run time (a whole number >= 0; 0 pauses)")
    p.add_argument("value", type=_max_value, metavar="N")
    p.set_defaults(func=cmd_set_max)

    p = sub.add_parser("pause", parents=common, help="set MAX to 0, remembering the current value")
    p.set_defaults(func=cmd_pause)
    p = sub.add_parser("resume", parents=common, help="restore the MAX that pause remembered")
    p.set_defaults(func=cmd_resume)

    dlq = sub.add_parser("dlq", parents=common, help="list, redrive or delete dead-lettered messages")
    dsub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    p = dsub.add_parser("list", parents=common, help="show DLQ messages without consuming them")
    p.add_argument("--limit", type=int, default=100, help="list at most this many (default 100)")
    p.add_argument("--width", type=int, default=100, help="characters of reason and body shown (default 100)")
    p.set_defaults(func=cmd_dlq_list)
    p = dsub.add_parser("redrive", parents=common, help="send DLQ messages back to the main queue")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--id", dest="ids", action="append", metavar="ID", help="DLQ message id (repeatable)")
    which.add_argument("--all", action="store_true", help="every message in the DLQ")
    p.set_defaults(func=cmd_dlq_redrive)
    p = dsub.add_parser("delete", parents=common, help="delete DLQ messages for good")
    p.add_argument(
        "--id", dest="ids", action="append", metavar="ID", required=True, help="DLQ message id (repeatable)"
    )
    p.set_defaults(func=cmd_dlq_delete)

    p = sub.add_parser("tick", parents=common, help="run one launcher tick here, with the deployed settings")
    p.add_argument(
        "--time-limit",
        type=float,
        help=f"seconds the tick may run (default: the launcher function's timeout, else {DEFAULT_TICK_SECONDS})",
    )
    p.add_argument(
        "-v", "--verbose", action="store_true", help="log what the launcher does to standard error"
    )
    p.set_defaults(func=cmd_tick)
    return parser


# -- main ----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None, *, session: Any = None) -> int:
    """Run one command; returns the exit code. ``session`` (a boto3 Session) is for embedding and tests."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # usage errors (2) and --help (0); returned so main() can run in-process
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_CONFIG
    try:
        return int(args.func(make_context(args, session)))
    except TransientError as exc:
        print(
            f"sluice: AWS is unavailable or throttling, try again: {exc}{_endpoint_hint()}", file=sys.stderr
        )
        return EXIT_AWS
    except SluiceError as exc:
        print(f"sluice: {_credentials_problem(exc) or exc}", file=sys.stderr)
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


def _endpoint_hint() -> str:
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    return f" (AWS_ENDPOINT_URL is {endpoint}: is it running?)" if endpoint else ""


if __name__ == "__main__":
    sys.exit(main())
