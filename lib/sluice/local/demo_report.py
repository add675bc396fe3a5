"""The demo's reckoning: every message accounted for, the peak running count, the summary and chart."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluice.core.names import execution_name
from sluice.local import chart, demo_rate
from sluice.local.demo_batch import Sent
from sluice.local.demo_dag import URGENT_LANE, URGENT_MAX, DagResult
from sluice.local.demo_dag import summary_lines as dag_lines
from sluice.local.demo_run import Run, ledger_store, queues_depth
from sluice.local.demo_semaphore import SectionResult
from sluice.local.demo_semaphore import summary_lines as semaphore_lines
from sluice.local.deployment import Deployment

if TYPE_CHECKING:
    from sluice.local.demo_options import Options

Span = tuple[float, float]  # seconds since the demo started


@dataclass
class Result:
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    maximum: int = 0
    messages: int = 0  # the batch's
    also_messages: int = 0  # sent by `sluice enqueue` after the batch (checked in ``dag``)
    also_started: int = 0  # of those, the ones whose execution exists
    payload_messages: int = 0
    raw_messages: int = 0
    resubmissions: int = 0
    groups: int = 0
    fates: dict[str, int] = field(default_factory=dict)  # started, duplicate, invalid, dead_lettered, lost
    resubmission_fates: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)  # SUCCEEDED, FAILED, ...
    peak_sampled: int = 0
    peak_timed: int = 0
    lane_peaks: dict[str, int] = field(default_factory=dict)  # most running at once per lane
    samples: int = 0
    events_delivered: int = 0
    repeated_events: int = 0
    repeated_released: int = 0
    ledger_holders: int = 0
    queue_left: int = 0
    dlq: int = 0
    dlq_reasons: dict[str, str] = field(default_factory=dict)
    handler_errors: list[str] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)  # keys whose later message ran instead
    unexpected_executions: list[str] = field(default_factory=list)
    record_mismatches: list[str] = field(default_factory=list)
    chart: str = ""
    log: str = ""
    timeline: dict[str, Any] = field(default_factory=dict)
    semaphore: dict[str, Any] = field(default_factory=dict)  # the semaphore part (demo_semaphore.py)
    dag: dict[str, Any] = field(default_factory=dict)  # the DAG and the stored payload (demo_dag.py)
    rate: dict[str, Any] = field(default_factory=dict)  # the rated lane (demo_rate.py)


def account(
    run: Run,
    options: Options,
    deployment: Deployment,
    sent: list[Sent],
    started: float,
    timed_out: bool,
    also: list[Sent] = (),  # type: ignore[assignment]
) -> Result:
    """Every message's fate, the peak running count two ways, and what is left over; the chart.
    ``also``: messages accounted for elsewhere (demo_dag.py) whose executions are expected."""
    o, aws, out = options, deployment.aws, deployment.outputs
    sfn, sqs = aws.client("stepfunctions"), aws.client("sqs")
    store = ledger_store(deployment)
    run.poll(sfn, out["StateMachineArn"], full=True)
    ran = dict(run.executions)
    dead = _dlq_messages(sqs, out["DlqUrl"])

    r = Result(maximum=o.maximum, messages=len(sent))
    r.payload_messages = sum(not s.raw for s in sent)
    r.raw_messages = sum(s.raw for s in sent)
    r.resubmissions = sum(s.resubmission for s in sent)
    fates, resub, expected = _fates(sent, ran, {m["source"] for m in dead}, store)
    r.fates = dict(fates)
    r.order_violations = _order_violations(sent, ran)
    r.resubmission_fates = dict(resub)
    r.groups = len({s.group for s in sent})
    also_names = {execution_name(s.key, s.message_id) for s in also if s.key is not None}
    expected |= also_names
    r.also_messages, r.also_started = len(also), len(also_names & set(ran))
    r.unexpected_executions = sorted(set(ran) - expected)
    r.statuses = dict(Counter(e["status"] for e in ran.values()))
    records = store.executions(ran)
    r.record_mismatches = _record_mismatches(ran, records)

    intervals, by_lane = _spans(ran, records, started)
    lane_max = {URGENT_LANE: URGENT_MAX, demo_rate.RATE_LANE: demo_rate.RATE_LANE_MAX, "default": o.maximum}
    r.lane_peaks = {lane: chart.peak(spans) for lane, spans in sorted(by_lane.items())}
    r.peak_timed = chart.peak(intervals)
    _take_run(r, run)
    r.ledger_holders = len(store.ledger().holders)
    r.queue_left = sum(queues_depth(sqs, out).values())
    r.dlq = len(dead)
    r.dlq_reasons = {m["source"]: m["reason"] for m in dead}
    r.seconds = round(time.time() - started, 1)
    r.timeline = {
        "intervals": [[round(a, 3), round(b, 3)] for a, b in sorted(intervals)],
        "samples": [[round(t, 3), n] for t, n in run.samples],
        "waiting": [[round(t, 3), n] for t, n in run.waiting],
    }
    r.problems += _problems(r, o, lane_max, timed_out)
    lanes = {lane: (spans, lane_max.get(lane, o.maximum)) for lane, spans in sorted(by_lane.items())}
    r.chart = _draw(r, run, o, intervals, lanes, executions=len(ran))
    r.ok = not r.problems
    return r


def _fates(
    sent: list[Sent], ran: dict[str, Any], dead: set[str], store: Any
) -> tuple[Counter[str], Counter[str], set[str]]:
    """Each message's fate (started, invalid, dead_lettered, duplicate or lost), the same for the
    re-submissions alone, and the executions the messages ask for."""
    fates: Counter[str] = Counter()
    resub: Counter[str] = Counter()
    expected: set[str] = set()
    maybe_duplicate: dict[str, list[Sent]] = {}
    for s in sent:
        name = execution_name(s.key, s.message_id) if s.key is not None else None
        if name is not None:
            expected.add(name)
        if name is not None and name in ran:
            fate = "started"
        elif s.message_id in dead:
            fate = "invalid" if s.raw else "dead_lettered"
        elif s.key is not None:
            maybe_duplicate.setdefault(s.key, []).append(s)
            continue
        else:
            fate = "lost"
        fates[fate] += 1
        if s.resubmission:
            resub[fate] += 1
    for key, messages in maybe_duplicate.items():
        record = store.payload(key)
        recorded = record.duplicates if record else 0
        for i, s in enumerate(messages):
            fate = "duplicate" if i < recorded else "lost"
            fates[fate] += 1
            if s.resubmission:
                resub[fate] += 1
    return fates, resub, expected


def _order_violations(sent: list[Sent], ran: dict[str, Any]) -> list[str]:
    """FIFO order within a group: a payload's later message never runs when an earlier one was
    suppressed as its duplicate (that would mean the group was handed out twice at once)."""
    by_key: dict[str, list[Sent]] = {}
    for s in sent:
        if s.key is not None:
            by_key.setdefault(s.key, []).append(s)
    violations = []
    for key, messages in by_key.items():
        ran_flags = [execution_name(key, m.message_id) in ran for m in messages]
        if any(not earlier and later for i, earlier in enumerate(ran_flags) for later in ran_flags[i + 1 :]):
            violations.append(key)
    return violations


def _record_mismatches(ran: dict[str, Any], records: dict[str, Any]) -> list[str]:
    mismatches = []
    for name, e in ran.items():
        record = records.get(name)
        if record is None or record.state.value != e["status"]:
            mismatches.append(f"{name}: Step Functions {e['status']}, record {record and record.state}")
    return mismatches


def _spans(
    ran: dict[str, Any], records: dict[str, Any], started: float
) -> tuple[list[Span], dict[str, list[Span]]]:
    """The finished executions' (start, stop) seconds since ``started``: all of them, and each lane's
    (the lane its claim took a slot of)."""
    intervals = [
        (e["startDate"].timestamp() - started, e["stopDate"].timestamp() - started)
        for e in ran.values()
        if e.get("stopDate") is not None
    ]
    by_lane: dict[str, list[Span]] = {}
    for name, e in ran.items():
        record = records.get(name)
        if e.get("stopDate") is not None and record is not None and record.lane is not None:
            span = (e["startDate"].timestamp() - started, e["stopDate"].timestamp() - started)
            by_lane.setdefault(record.lane, []).append(span)
    return intervals, by_lane


def _take_run(r: Result, run: Run) -> None:
    """What the run itself saw: the sampled peak, the events delivered, the handlers' errors."""
    r.peak_sampled = max((n for _, n in run.samples), default=0)
    r.samples = len(run.samples)
    r.events_delivered = run.counts["events"]
    r.repeated_events, r.repeated_released = run.repeated, run.repeated_released
    r.handler_errors = run.errors


def _problems(r: Result, o: Options, lane_max: dict[str, int], timed_out: bool) -> list[str]:
    problems = []
    if timed_out:
        problems.append(f"gave up after {o.timeout:.0f} s with work left")
    if r.peak_sampled > o.maximum or r.peak_timed > o.maximum:
        problems.append(f"MAX {o.maximum} exceeded: peak {max(r.peak_sampled, r.peak_timed)}")
    for lane, lane_peak in r.lane_peaks.items():
        if lane_peak > lane_max.get(lane, o.maximum):
            problems.append(f"lane {lane!r}: MAX {lane_max.get(lane)} exceeded: peak {lane_peak}")
    if r.fates.get("lost"):
        problems.append(f"{r.fates['lost']} message(s) unaccounted for")
    if r.unexpected_executions:
        problems.append(f"{len(r.unexpected_executions)} execution(s) no message asked for")
    if r.record_mismatches:
        problems.append(f"{len(r.record_mismatches)} record(s) disagree with Step Functions")
    if r.ledger_holders:
        problems.append(f"the ledger still holds {r.ledger_holders} slot(s)")
    if r.queue_left:
        problems.append(f"{r.queue_left} message(s) left in the queue")
    if r.order_violations:
        problems.append(f"FIFO order broken for {', '.join(r.order_violations)}")
    if r.handler_errors:
        problems.append(f"{len(r.handler_errors)} handler invocation(s) raised: {r.handler_errors[0]}")
    if r.repeated_released:
        problems.append("a repeated status event released a slot")
    if any(s not in ("SUCCEEDED", "FAILED") for s in r.statuses):
        problems.append(f"unexpected execution statuses: {r.statuses}")
    return problems


def _draw(
    r: Result, run: Run, o: Options, intervals: list[Span], lanes: dict[str, Any], executions: int
) -> str:
    return str(
        chart.draw(
            o.out / "demo-chart.png",
            intervals=intervals,
            samples=run.samples,
            waiting=run.waiting,
            maximum=o.maximum,
            lanes=lanes,
            rate=chart.RatePanel(
                f"lane {demo_rate.RATE_LANE}",
                demo_rate.RATE.count,
                demo_rate.RATE.period,
                f"{demo_rate.RATE}",
                [a for a, _ in lanes.get(demo_rate.RATE_LANE, ([], 0))[0]],
            ),
            title=(
                f"Sluice demo: {executions} executions from {r.messages} messages, MAX {o.maximum}, "
                f"peak {max(r.peak_timed, r.peak_sampled)}"
            ),
        )
    )


def _dlq_messages(sqs: Any, url: str) -> list[dict[str, str]]:
    """Read every DLQ message (source message id and reason), then make them visible again."""
    found: list[dict[str, str]] = []
    receipts: list[str] = []
    while True:
        got = sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], VisibilityTimeout=600
        ).get("Messages", [])
        if not got:
            for i in range(0, len(receipts), 10):
                sqs.change_message_visibility_batch(
                    QueueUrl=url,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": r, "VisibilityTimeout": 0}
                        for n, r in enumerate(receipts[i : i + 10])
                    ],
                )
            return found
        receipts += [m["ReceiptHandle"] for m in got]
        for m in got:
            attrs = m.get("MessageAttributes", {})
            found.append(
                {
                    "source": attrs.get("sluice-source-message-id", {}).get("StringValue", ""),
                    "reason": attrs.get("sluice-error", {}).get("StringValue", ""),
                }
            )


# -- output -----------------------------------------------------------------------------------------


def summary_lines(r: Result) -> list[str]:
    f, rf = r.fates, r.resubmission_fates
    peak = max(r.peak_sampled, r.peak_timed)
    mark = "ok" if peak <= r.maximum else "EXCEEDED"
    lines = [
        f"Sluice demo: {r.messages} messages in {r.groups} message groups ({r.payload_messages} payloads, "
        f"{r.resubmissions} of them re-submissions; {r.raw_messages} invalid sent raw), MAX {r.maximum}, "
        f"{r.seconds:.1f} s",
        f"  peak running, ListExecutions samples : {r.peak_sampled:>3} / MAX {r.maximum}  ({r.samples} samples)",
        f"  peak running, start/stop times       : {r.peak_timed:>3} / MAX {r.maximum}  {mark}",
        f"  executions  : {sum(r.statuses.values())} started"
        + (
            f": {f.get('started', 0)} for the batch's messages + {r.also_started} for `sluice enqueue`'s "
            "(the DAG, the stored payload, the tenant, the lanes)"
            if r.also_messages
            else ""
        )
        + ": "
        + ", ".join(f"{n} {s.lower()}" for s, n in sorted(r.statuses.items())),
        f"  duplicates  : {f.get('duplicate', 0)} suppressed while their payload ran"
        + (
            f" ({rf.get('duplicate', 0)} of {r.resubmissions} re-submissions; "
            f"{rf.get('started', 0)} ran again after the first run ended)"
            if r.resubmissions
            else ""
        ),
        f"  invalid     : {f.get('invalid', 0)} of {r.raw_messages} raw messages in the DLQ with a reason",
    ]
    if f.get("dead_lettered"):
        lines.append(
            f"  dead-letter : {f['dead_lettered']} valid-looking payload(s) refused by Step Functions"
        )
    accounted = sum(n for k, n in f.items() if k != "lost")
    also = f"; `sluice enqueue`'s {r.also_started} / {r.also_messages}" if r.also_messages else ""
    lines += [
        f"  accounted   : {accounted + r.also_started} / {r.messages + r.also_messages} messages settled "
        f"(started, suppressed as a duplicate or dead-lettered): the batch's {accounted} / {r.messages}, "
        f"{f.get('lost', 0)} lost{also}; queue {r.queue_left} left, ledger {r.ledger_holders} slot(s) held",
        f"  events      : {r.events_delivered} status changes delivered, "
        f"{r.repeated_events} repeated on purpose (released {r.repeated_released})",
        f"  chart       : {r.chart}",
        f"  handler logs: {r.log}",
    ]
    for reason in list(dict.fromkeys(r.dlq_reasons.values()))[:6]:
        lines.append(f"    DLQ reason: {reason}")
    if r.dag:
        lines += dag_lines(DagResult.from_dict(r.dag))
    if r.rate:
        lines += demo_rate.summary_lines(r.rate)
    if r.semaphore:
        lines += semaphore_lines(SectionResult(**r.semaphore))
    lines.append("RESULT: " + ("OK" if r.ok else "FAILED: " + "; ".join(r.problems)))
    return lines
