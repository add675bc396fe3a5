"""``sluice``: the operator's command line.

Resources are found from the CloudFormation stack's outputs (``--stage`` → stack ``sluice-<stage>``,
or ``--stack``); any ``SLUICE_*`` environment variable set overrides its output. boto3 honours
``AWS_ENDPOINT_URL``, so the same commands work on a real account and on the embedded AWS.

Exit codes: 0 success, 1 some items failed (enqueue) or not found (status), 2 usage or
configuration error, 3 AWS unavailable or throttling.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

from sluice.errors import ConfigurationError, SluiceError, TransientError
from sluice.runtime import Runtime
from sluice.settings import Settings

EXIT_OK, EXIT_PARTIAL, EXIT_CONFIG, EXIT_AWS = 0, 1, 2, 3

OUTPUTS = {
    "QueueUrl": "queue_url",
    "DlqUrl": "dlq_url",
    "TableName": "table_name",
    "StateMachineArn": "state_machine_arn",
    "MaxConcurrencyParameter": "max_parameter",
}


@dataclass
class Context:
    args: argparse.Namespace
    runtime: Runtime

    @property
    def settings(self) -> Settings:
        return self.runtime.settings

    def out(self, human: str, data: Any) -> None:
        if self.args.json:
            print(json.dumps(data, indent=2, sort_keys=True, default=str))
        else:
            print(human)


def resolve_settings(args: argparse.Namespace, session: Any) -> Settings:
    """Environment first, then the stack's outputs for whatever the environment left empty."""
    settings = Settings.from_env()
    wanted = [field for field in OUTPUTS.values() if not getattr(settings, field)]
    if not wanted:
        return settings
    stack = args.stack or f"sluice-{args.stage}"
    cfn = session.client("cloudformation")
    try:
        stacks = cfn.describe_stacks(StackName=stack)["Stacks"]
    except Exception as exc:  # boto3 raises ClientError or NoCredentialsError here; both mean "cannot use it"
        raise ConfigurationError(
            f"cannot read stack {stack!r} ({type(exc).__name__}: {exc}). Deploy it first, pass --stage/--stack/"
            "--region, or set SLUICE_QUEUE_URL, SLUICE_DLQ_URL, SLUICE_TABLE_NAME and SLUICE_STATE_MACHINE_ARN."
        ) from exc
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}
    found = {field: outputs[name] for name, field in OUTPUTS.items() if field in wanted and name in outputs}
    return replace(settings, **found)


def make_runtime(args: argparse.Namespace) -> Runtime:
    import boto3

    session = boto3.session.Session(region_name=args.region) if args.region else boto3.session.Session()
    return Runtime(resolve_settings(args, session), session=session)


# -- commands --------------------------------------------------------------------------------------


def cmd_enqueue(ctx: Context) -> int:
    from sluice.enqueue import enqueue, read_items

    ctx.settings.require("queue_url")
    if ctx.args.file == "-":
        text = sys.stdin.read()
    else:
        with open(ctx.args.file, encoding="utf-8") as handle:
            text = handle.read()
    items = list(read_items(text))
    report = enqueue(
        ctx.runtime.client("sqs"),
        ctx.settings.queue_url,
        items,
        key_field=ctx.args.key_field,
        group_by=ctx.args.group_by,
        dedup_id=ctx.args.dedup_id,
        progress=_progress(len(items), quiet=ctx.args.json or len(items) < 50),
    )
    for where, reason in report.failed:
        print(f"sluice enqueue: {where}: {reason}", file=sys.stderr)
    ctx.out(
        f"sent {len(report.sent)} of {len(items)} payloads"
        + (f"; {len(report.failed)} failed" if report.failed else ""),
        {
            "sent": [{"where": w, "key": k, "message_id": m} for w, k, m in report.sent],
            "failed": [{"where": w, "reason": r} for w, r in report.failed],
        },
    )
    return EXIT_OK if report.ok else EXIT_PARTIAL


def cmd_status(ctx: Context) -> int:
    ctx.settings.require("table_name")
    store = ctx.runtime.store()
    if ctx.args.payload_id is None:
        return _overview(ctx)
    record = store.payload(ctx.args.payload_id)
    if record is None:
        print(f"sluice status: no record for payload {ctx.args.payload_id!r}", file=sys.stderr)
        return EXIT_PARTIAL
    history = store.executions(record.executions)
    runs = [history[n] for n in dict.fromkeys(record.executions) if n in history]
    lines = [
        f"payload   {record.key}",
        f"state     {record.state.value}" + (f"  (held by {record.holder})" if record.holder else ""),
        f"attempts  {record.attempts}   duplicates suppressed {record.duplicates}",
    ]
    if record.reason:
        lines.append(f"reason    {record.reason}")
    for run in runs:
        lines.append(f"  {run.state.value:<10} {run.name}  message {run.message_id}")
        if run.arn:
            lines.append(f"             {run.arn}")
        if run.error:
            lines.append(f"             error: {run.error}")
    ctx.out("\n".join(lines), {"payload": asdict(record), "executions": [asdict(r) for r in runs]})
    return EXIT_OK


def _overview(ctx: Context) -> int:
    rt = ctx.runtime
    ctx.settings.require("queue_url", "dlq_url", "state_machine_arn")
    ledger = rt.store().ledger()
    max_now = rt.max_source().current()
    depth = rt.queue().depth()
    dlq = rt.client("sqs").get_queue_attributes(
        QueueUrl=ctx.settings.dlq_url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    data = {
        "max": max_now,
        "running": len(ledger.holders),
        "external": ledger.external,
        "queue_visible": depth.get("ApproximateNumberOfMessages", 0),
        "queue_in_flight": depth.get("ApproximateNumberOfMessagesNotVisible", 0),
        "dlq": int(dlq.get("ApproximateNumberOfMessages", 0)),
        "drift": ledger.drift,
        "reconciled_at": ledger.reconciled_at,
    }
    human = "\n".join(f"{k:<16}{v}" for k, v in data.items())
    ctx.out(human, data)
    return EXIT_OK


def _progress(total: int, *, quiet: bool) -> Any:
    if quiet:
        return None
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = bar.add_task("enqueue", total=total)
    bar.start()

    def advance(n: int) -> None:
        bar.advance(task, n)
        if bar.finished:
            bar.stop()

    return advance


# -- parser ------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--stage", default="dev", help="stack stage (stack name sluice-<stage>); default dev")
    common.add_argument("--stack", help="CloudFormation stack name (overrides --stage)")
    common.add_argument("--region", help="AWS region (default: the environment's)")
    common.add_argument("--json", action="store_true", help="machine-readable output")

    parser = argparse.ArgumentParser(prog="sluice", description=__doc__.split("\n\n")[0], parents=[common])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("enqueue", parents=[common], help="send payloads (JSON object, array or JSON Lines)")
    p.add_argument("file", help="file to read, or - for standard input")
    p.add_argument("--key-field", help="field that identifies a payload when it has no string 'id'")
    p.add_argument(
        "--group-by", help="field whose value is the FIFO message group (default: the payload key)"
    )
    p.add_argument("--dedup-id", help="deduplication id for every item (default: hash of each payload)")
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser("status", parents=[common], help="overview, or one payload's record and history")
    p.add_argument("payload_id", nargs="?", help="payload key (its 'id')")
    p.set_defaults(func=cmd_status)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        ctx = Context(args, make_runtime(args))
        return int(args.func(ctx))
    except ConfigurationError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except TransientError as exc:
        print(f"sluice: AWS is unavailable or throttling, try again: {exc}", file=sys.stderr)
        return EXIT_AWS
    except SluiceError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:
        print(f"sluice: {exc}", file=sys.stderr)
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
