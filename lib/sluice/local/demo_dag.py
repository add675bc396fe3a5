"""The demo's awaits, stored payload and tenant: a small DAG, one 600 KiB payload and a tenant's
burst under a concurrency key, through ``sluice enqueue`` and ``sluice set-max --key``.

    dag-extract-1 ─┐
    dag-extract-2 ─┼─► dag-merge ──► dag-publish        (sluice enqueue --after KEY, repeatable)
    dag-extract-3 ─┘
    scene-0001: 614,400 bytes ──► the stack's payload bucket, a pointer on the queue
    tenant-heavy-1 … 6 ──► concurrency key "heavy", cap 2  (sluice set-max 2 --key heavy, then
                           sluice enqueue --concurrency-key heavy): at most 2 at once, the rest wait
    urgent-1 … 4 ──► lane "urgent" (MAX 2, priority 1; the stack deployed with lanes=urgent:2:1):
                           sluice enqueue --lane urgent: each freed slot goes to it first
    api-1 … 12 ──► lane "api", under a rate (sluice.local.demo_rate)

The producer sends them with the real command, as a user would (``python -m sluice.cli enqueue
--stage demo --json``, one process per command, against the embedded AWS), after the batch: the
extracts and the scene in one command, then ``dag-merge --after`` each extract, then ``dag-publish
--after dag-merge``. The launcher parks each dependent until what it awaits has SUCCEEDED, and the
completion of its last awaited run sends it back; the scene's pointer is checked (size and SHA-256)
by the launcher before its claim, and its execution gets the pointer as input.

``check`` then reads what happened from AWS's side: each node's execution (named from its key and
message id), its start and stop times and status from Step Functions, the WAIT# records of the
parked dependents in the table, and the stored object (HeadObject, its bytes hashed again).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sluice.adapters.dynamo.store import DynamoStore
from sluice.core.names import execution_arn, execution_name
from sluice.local import chart, demo_rate
from sluice.local.demo_batch import Sent

# (key, the keys it awaits), in the order the commands send them.
DAG: list[tuple[str, tuple[str, ...]]] = [
    ("dag-extract-1", ()),
    ("dag-extract-2", ()),
    ("dag-extract-3", ()),
    ("dag-merge", ("dag-extract-1", "dag-extract-2", "dag-extract-3")),
    ("dag-publish", ("dag-merge",)),
]
SCENE = "scene-0001"
TENANT = "heavy"  # a concurrency key
TENANT_CAP = 2
TENANT_JOBS = [f"tenant-heavy-{i}" for i in range(1, 7)]
URGENT_LANE = "urgent"  # a small lane of priority 1 beside the lane default
URGENT_MAX = 2
URGENT_JOBS = [f"urgent-{i}" for i in range(1, 5)]
SCENE_BYTES = 600 * 1024  # over the pointer threshold (260,096 bytes) and over Step Functions' 256 KiB


def lanes_param(maximum: int) -> str:
    """The stack parameter ``lanes`` the demo deploys with: the small urgent lane, the rated lane
    (``sluice.local.demo_rate``), and default."""
    return f"{URGENT_LANE}:{URGENT_MAX}:1,{demo_rate.lane_param()},default:{maximum}"


def scene_payload(size: int = SCENE_BYTES) -> str:
    """A scene manifest of exactly ``size`` bytes of JSON, the same on every run."""
    frames = [f"frame-{i:05d}:{hashlib.sha256(str(i).encode()).hexdigest()[:24]}" for i in range(14_000)]
    obj: dict[str, Any] = {"id": SCENE, "kind": "scene-manifest", "frames": frames, "pad": ""}
    base = len(json.dumps(obj, separators=(",", ":")).encode())
    if base > size:
        raise ValueError(f"the manifest is {base} bytes before padding; {size} asked")
    obj["pad"] = "." * (size - base)
    return json.dumps(obj, separators=(",", ":"))


def _body(key: str, seconds: int = 1) -> str:
    return json.dumps({"id": key, "seconds": seconds, "fail": False, "step": key.removeprefix("dag-")})


@dataclass
class Extras:
    """What the commands sent: the DAG's messages, the scene's, and the pointer it was sent as."""

    dag: list[Sent] = field(default_factory=list)
    scene: Sent | None = None
    tenant: list[Sent] = field(default_factory=list)
    urgent: list[Sent] = field(default_factory=list)
    rated: list[Sent] = field(default_factory=list)  # the rated lane's (demo_rate.py)
    urgent_sent_at: float = 0.0  # when the urgent lane's command was run (epoch seconds)
    stored: str = ""  # the s3:// URI the command reported
    commands: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def sent(self) -> list[Sent]:
        return [*self.dag, *([self.scene] if self.scene else []), *self.tenant, *self.urgent, *self.rated]


def send(environ: dict[str, str], stage: str) -> Extras:
    """Send the DAG and the scene with ``sluice enqueue`` (three commands), then give the tenant's
    key its cap and send its burst under it; last, the lanes' payloads."""
    extras = Extras()
    env = {**os.environ, **environ}
    with tempfile.TemporaryDirectory(prefix="sluice-demo-dag-") as work:

        def sluice(command: list[str]) -> dict[str, Any] | None:
            extras.commands.append(" ".join(command))
            done = subprocess.run(
                [sys.executable, "-m", "sluice.cli", *command[1:], "--json"],
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            if done.returncode != 0:
                extras.errors.append(
                    f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()[-500:]}"
                )
                return None
            return json.loads(done.stdout)

        steps: list[tuple[list[str], list[str], bool]] = [
            ([k for k, a in DAG if not a], [], True),
            *[([k], [f for x in a for f in ("--after", x)], False) for k, a in DAG if a],
        ]

        def enqueue(n: int, keys: list[str], flags: list[str], with_scene: bool, seconds: int = 1) -> None:
            lines = [_body(k, seconds) for k in keys] + ([scene_payload()] if with_scene else [])
            path = Path(work) / f"step-{n}.jsonl"
            path.write_text("\n".join(lines) + "\n")
            answer = sluice(["sluice", "enqueue", path.name, "--stage", stage, *flags])
            for row in (answer or {}).get("sent", []):
                sent = Sent(
                    f"sluice enqueue {row['where']}", row["message_id"], row["key"], row["key"], False, False
                )
                if row["key"] == SCENE:
                    extras.scene, extras.stored = sent, row.get("stored", "")
                elif row["key"] in TENANT_JOBS:
                    extras.tenant.append(sent)
                elif row["key"] in URGENT_JOBS:
                    extras.urgent.append(sent)
                elif row["key"] in demo_rate.RATE_JOBS:
                    extras.rated.append(sent)
                else:
                    extras.dag.append(sent)

        for n, (keys, flags, with_scene) in enumerate(steps):
            enqueue(n, keys, flags, with_scene)
        # After the DAG, whose timing it must not disturb: the tenant's cap, then its burst.
        if sluice(["sluice", "set-max", str(TENANT_CAP), "--key", TENANT, "--stage", stage]) is not None:
            enqueue(len(steps), TENANT_JOBS, ["--concurrency-key", TENANT], False, seconds=3)
        # Last, urgent work in its own lane, while the batch may still be queued in default.
        extras.urgent_sent_at = time.time()
        enqueue(len(steps) + 1, URGENT_JOBS, ["--lane", URGENT_LANE], False, seconds=2)
        enqueue(len(steps) + 2, *demo_rate.ENQUEUE)
    return extras


@dataclass
class Node:
    key: str
    awaits: list[str]
    execution: str
    status: str = ""
    start: float | None = None  # seconds since the batch was enqueued (Step Functions' startDate)
    stop: float | None = None
    parked: bool = False  # a WAIT# record says it was parked and sent back
    after_last_await_s: float | None = None  # its start minus the last stop of what it awaits


@dataclass
class DagResult:
    nodes: list[Node] = field(default_factory=list)
    order: list[str] = field(default_factory=list)  # keys by start time
    violations: list[str] = field(default_factory=list)
    pointer: dict[str, Any] = field(default_factory=dict)
    tenant: dict[str, Any] = field(default_factory=dict)
    urgent: dict[str, Any] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DagResult:
        return cls(**{**d, "nodes": [Node(**n) for n in d.get("nodes", [])]})


def check(aws: Any, outputs: dict[str, str], extras: Extras, started: float) -> DagResult:
    """What happened, from Step Functions, the table and the bucket."""
    sfn, s3 = aws.client("stepfunctions"), aws.client("s3")
    store = DynamoStore(aws.client("dynamodb"), outputs["TableName"])
    arn = outputs["StateMachineArn"]
    r = check_dag(sfn, store, arn, extras.dag, started)
    r.commands, r.problems = list(extras.commands), [*extras.errors, *r.problems]
    r.pointer = _pointer(sfn, s3, arn, extras)
    r.problems += r.pointer.get("problems", [])
    r.tenant = _tenant(sfn, arn, extras)
    r.problems += r.tenant.get("problems", [])
    r.urgent = _urgent(sfn, arn, extras)
    r.problems += r.urgent.get("problems", [])
    return r


def check_dag(sfn: Any, store: DynamoStore, arn: str, sent: list[Sent], started: float) -> DagResult:
    """The DAG's nodes from Step Functions' own times and the table's ``WAIT#`` records.

    A dependent must start only after everything it awaits SUCCEEDED. Whether it was parked is not
    a rule: one whose awaits had all SUCCEEDED when the launcher received it goes on to its claim
    and is never parked (protocol.md, Awaits); one received earlier is parked and sent back."""
    r = DagResult()
    awaits = dict(DAG)
    by_sent = {s.key: s for s in sent}
    waiters = {w.message_id for w in store.waiters([s.message_id for s in sent])}
    for key, after in DAG:
        s = by_sent.get(key)
        if s is None:
            r.problems.append(f"{key} was not sent")
            continue
        name = execution_name(key, s.message_id)
        node = Node(key, list(after), name, parked=s.message_id in waiters)
        described = _describe(sfn, execution_arn(arn, name))
        if described is not None:
            node.status = described["status"]
            node.start = described["startDate"].timestamp() - started
            if described.get("stopDate") is not None:
                node.stop = described["stopDate"].timestamp() - started
        r.nodes.append(node)
    by_key = {n.key: n for n in r.nodes}
    for n in r.nodes:
        if n.start is None:
            r.problems.append(f"{n.key} never started")
            continue
        if n.status != "SUCCEEDED":
            r.problems.append(f"{n.key} ended {n.status}")
        if n.parked and not awaits[n.key]:
            r.problems.append(f"{n.key} awaits nothing, yet it was parked")
        ends = [by_key[a] for a in awaits[n.key] if a in by_key]
        if not ends:
            continue
        if any(e.status != "SUCCEEDED" or e.stop is None or e.stop > n.start for e in ends):
            r.violations.append(n.key)
        else:
            n.after_last_await_s = round(n.start - max(e.stop for e in ends if e.stop is not None), 2)
    r.order = [n.key for n in sorted((n for n in r.nodes if n.start is not None), key=lambda n: n.start)]
    if r.violations:
        r.problems.append("started before what it awaits SUCCEEDED: " + ", ".join(r.violations))
    return r


def _urgent(sfn: Any, arn: str, extras: Extras) -> dict[str, Any]:
    """The urgent lane's payloads: every one ran and SUCCEEDED, never more than its lane's MAX at
    once (from Step Functions' times), and how long each waited from its command to its start."""
    out: dict[str, Any] = {"lane": URGENT_LANE, "max": URGENT_MAX, "jobs": len(URGENT_JOBS), "problems": []}
    problems = out["problems"]
    if len(extras.urgent) != len(URGENT_JOBS):
        problems.append(f"{len(extras.urgent)} of the urgent lane's {len(URGENT_JOBS)} payloads were sent")
    spans: list[tuple[float, float]] = []
    for s in extras.urgent:
        described = _describe(sfn, execution_arn(arn, execution_name(s.key, s.message_id)))
        if described is None or described["status"] != "SUCCEEDED" or described.get("stopDate") is None:
            problems.append(f"{s.key}: {described['status'] if described else 'never started'}")
            continue
        spans.append((described["startDate"].timestamp(), described["stopDate"].timestamp()))
    waits = sorted(a - extras.urgent_sent_at for a, _ in spans)
    out.update(
        started=len(spans),
        peak=chart.peak(spans),
        wait_p50_s=round(waits[len(waits) // 2], 1) if waits else None,
    )
    if out["peak"] > URGENT_MAX:
        problems.append(f"the urgent lane ran {out['peak']} at once; its MAX is {URGENT_MAX}")
    return out


def _tenant(sfn: Any, arn: str, extras: Extras) -> dict[str, Any]:
    """The tenant's burst: every payload ran and SUCCEEDED, never more than the key's cap at once
    (from Step Functions' start and stop times), and some waited in the key's line."""
    out: dict[str, Any] = {"key": TENANT, "cap": TENANT_CAP, "jobs": len(TENANT_JOBS), "problems": []}
    problems = out["problems"]
    if len(extras.tenant) != len(TENANT_JOBS):
        problems.append(f"{len(extras.tenant)} of the tenant's {len(TENANT_JOBS)} payloads were sent")
    spans: list[tuple[float, float]] = []
    for s in extras.tenant:
        described = _describe(sfn, execution_arn(arn, execution_name(s.key, s.message_id)))
        if described is None or described["status"] != "SUCCEEDED" or described.get("stopDate") is None:
            problems.append(f"{s.key}: {described['status'] if described else 'never started'}")
            continue
        spans.append((described["startDate"].timestamp(), described["stopDate"].timestamp()))
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    running = peak = 0
    for _, d in events:
        running += d
        peak = max(peak, running)
    out.update(started=len(spans), peak=peak)
    if peak > TENANT_CAP:
        problems.append(f"the tenant's key ran {peak} at once; its cap is {TENANT_CAP}")
    return out


def _pointer(sfn: Any, s3: Any, arn: str, extras: Extras) -> dict[str, Any]:
    """The scene: its execution's input is its pointer, and the object it names has its size and SHA-256."""
    scene = extras.scene
    if scene is None:
        return {"problems": [f"{SCENE} was not sent"]}
    expected = scene_payload().encode()
    name = execution_name(SCENE, scene.message_id)
    described = _describe(sfn, execution_arn(arn, name))
    out: dict[str, Any] = {
        "key": SCENE,
        "execution": name,
        "status": described["status"] if described else "",
        "uri": extras.stored,
        "problems": [],
    }
    problems = out["problems"]
    if described is None:
        problems.append(f"{SCENE}: no execution")
        return out
    pointer = json.loads(described["input"]).get("sluicePayload") or {}
    out.update(
        size=pointer.get("size"), sha256=pointer.get("sha256"), input_bytes=len(described["input"].encode())
    )
    if pointer.get("uri") != extras.stored:
        problems.append(f"{SCENE}: the execution's input is not the pointer the command stored ({pointer})")
    bucket, _, key = str(pointer.get("uri", "")).removeprefix("s3://").partition("/")
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read() if bucket else b""
    out.update(object_bytes=len(body), object_sha256=hashlib.sha256(body).hexdigest())
    if body != expected or pointer.get("size") != len(expected):
        problems.append(f"{SCENE}: the stored object is not the {len(expected):,}-byte payload")
    if out["object_sha256"] != pointer.get("sha256"):
        problems.append(f"{SCENE}: the object's SHA-256 is not the pointer's")
    if out["status"] != "SUCCEEDED":
        problems.append(f"{SCENE}: its execution ended {out['status'] or 'nowhere'}")
    return out


def _describe(sfn: Any, arn: str) -> dict[str, Any] | None:
    try:
        return sfn.describe_execution(executionArn=arn)
    except sfn.exceptions.ExecutionDoesNotExist:
        return None


def summary_lines(r: DagResult) -> list[str]:
    by_key = {n.key: n for n in r.nodes}
    dependents = [n for n in r.nodes if n.awaits]
    parked = sum(n.parked for n in dependents)
    lines = [
        f"  dag         : {len(r.nodes)} payloads by `sluice enqueue --after`: dag-extract-1..3 → dag-merge → "
        f"dag-publish; {parked} of {len(dependents)} dependents parked until their awaits SUCCEEDED",
    ]
    steps = []
    for key in r.order:
        n = by_key[key]
        note = (
            f" ({n.after_last_await_s:.1f} s after its last await ended)"
            if n.after_last_await_s is not None
            else ""
        )
        steps.append(f"{key} {n.start:.1f} s{note}")
    lines.append("    started in order: " + ", ".join(steps))
    for n in dependents:
        if not n.parked and n.start is not None:
            lines.append(f"    {n.key}: its awaits were met on arrival, never parked (protocol.md, Awaits)")
    mark = "ok" if not r.violations and len(r.order) == len(DAG) else "VIOLATED"
    lines.append(f"    every dependent started after all it awaits SUCCEEDED  {mark}")
    p = r.pointer
    t = r.tenant
    u = r.urgent
    if u:
        mark = "ok" if not u.get("problems") else "VIOLATED"
        lines.append(
            f"  lanes       : {u.get('started', 0)} of {u['jobs']} payloads in lane {u['lane']!r} (MAX {u['max']}, "
            f"priority 1; `sluice enqueue --lane {u['lane']}`): at most {u.get('peak', 0)} at once, "
            f"started {u.get('wait_p50_s')} s (p50) after their command  {mark}"
        )
    if t:
        mark = "ok" if not t.get("problems") else "VIOLATED"
        lines.append(
            f"  tenant      : {t.get('started', 0)} of {t['jobs']} payloads under concurrency key {t['key']!r} "
            f"(`sluice set-max {t['cap']} --key {t['key']}`): at most {t.get('peak', 0)} at once  {mark}"
        )
    if p.get("uri"):
        lines.append(f"  pointer     : {p['key']}, {p.get('object_bytes', 0):,} bytes stored at {p['uri']}")
        lines.append(
            f"    SHA-256 {p.get('sha256')} (object: {'same' if p.get('object_sha256') == p.get('sha256') else 'DIFFERENT'}); "
            f"execution {p['status']} with the {p.get('input_bytes', 0)}-byte pointer as input"
        )
    return lines
