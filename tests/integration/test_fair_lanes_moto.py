"""Fair lanes on moto with the real adapters: a fair lane's tenants (concurrency keys) share its
slots round-robin, on the tick and on the completion path, whatever order their messages came in;
nothing of a fair lane waits in its queue, and the limits stay exact."""

from __future__ import annotations

import contextlib
import json
from collections import Counter

import pytest
from botocore.exceptions import ClientError

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from sluice.enqueue import enqueue as sluice_enqueue
from sluice.enqueue import read_items
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE
from tests.support.aws import build_stack
from tests.support.hooks import count_calls, error_answer

LANES = "shared:8:0:1:fair,default:4"
KEY = CONCURRENCY_KEY_ATTRIBUTE.replace("-", "_")


@pytest.fixture
def stack(session):
    return build_stack(session, clock=FakeClock(), max_concurrency=10, lanes=LANES)


def enqueue(stack, tenant: str | None, n: int, lane: str = "shared", first: int = 0) -> None:
    for i in range(first, first + n):
        extra = {KEY: tenant} if tenant is not None else {}
        stack.send({"id": f"{tenant}-{i}"}, group=f"{tenant}-{i}", lane=lane, **extra)


def tenant_of(stack, name: str) -> str | None:
    return stack.runtime().store().execution(name).ckey


def running_by_tenant(stack) -> Counter[str]:
    return Counter(tenant_of(stack, name) or "-" for name in stack.running())


def end(stack, launcher, name: str):
    return launcher.on_status_change(StatusChange.from_event(stack.finish(name, "SUCCEEDED")))


def test_a_burst_of_several_tenants_is_shared_out_not_taken_by_the_first(stack):
    enqueue(stack, "heavy", 3)
    for light in ("a", "b", "c"):
        enqueue(stack, light, 2)
    enqueue(stack, "heavy", 27, first=3)
    summary = stack.launcher().tick()
    # 8 slots, 4 tenants in sight: 2 each, not 8 for the tenant whose messages came first.
    assert running_by_tenant(stack) == {"heavy": 2, "a": 2, "b": 2, "c": 2}
    assert summary.lanes["shared"]["started"] == 8
    # Nothing of the fair lane waits in its queue: every new message is in its tenant's line.
    assert stack.queue_counts(stack.settings.lane_queue_url("shared")) == (0, 0)
    store = stack.runtime().store()
    assert store.key_state("heavy").waiting == 28 and store.key_state("a").waiting == 0


def test_a_heavy_tenant_queued_first_does_not_keep_the_light_ones_behind_its_backlog(stack):
    enqueue(stack, "heavy", 30)
    enqueue(stack, "light", 3)
    launcher = stack.launcher()
    launcher.tick()
    # Alone in sight with nobody waiting, heavy takes the lane at once (work-conserving); the rest
    # of its backlog and light's payloads line up.
    assert running_by_tenant(stack) == {"heavy": 8}
    assert stack.queue_counts(stack.settings.lane_queue_url("shared")) == (0, 0)
    # Each slot heavy frees goes to light, the tenant with fewer runs, until light has none waiting.
    for _ in range(4):
        heavy_run = next(n for n in sorted(stack.running()) if tenant_of(stack, n) == "heavy")
        end(stack, launcher, heavy_run)
    assert running_by_tenant(stack) == {"heavy": 5, "light": 3}


def test_freed_slots_go_to_the_tenant_with_the_fewest_runs(stack):
    for i in range(4):  # a burst of both tenants: shared out
        enqueue(stack, "heavy", 1, first=i)
        enqueue(stack, "light", 1, first=i)
    enqueue(stack, "heavy", 16, first=4)
    launcher = stack.launcher()
    launcher.tick()
    assert running_by_tenant(stack) == {"heavy": 4, "light": 4}
    # A light run ends while heavy has 16 waiting: light still has fewer runs, it gets the slot.
    light_run = next(n for n in stack.running() if tenant_of(stack, n) == "light")
    enqueue(stack, "light", 1, first=4)
    _, refill, _ = end(stack, launcher, light_run)
    assert refill.lanes["shared"]["started"] == 1
    assert running_by_tenant(stack) == {"heavy": 4, "light": 4}
    # Light's line is empty now: the slots it frees go to heavy, the lane stays full.
    for name in [n for n in stack.running() if tenant_of(stack, n) == "light"]:
        end(stack, launcher, name)
    assert running_by_tenant(stack) == {"heavy": 8}


def test_a_tenant_alone_gets_the_whole_lane_and_the_limits_hold(stack):
    enqueue(stack, "solo", 12)
    enqueue(stack, None, 2, lane="default")
    launcher = stack.launcher()
    launcher.tick()
    launcher.tick()
    assert running_by_tenant(stack)["solo"] == 8, "no default key cap: the lane's MAX holds it"
    rooms = stack.runtime().store().lane_rooms(["shared", "default"])
    assert rooms["shared"].running == 8 and stack.runtime().store().ledger().running <= 10
    assert len(stack.running()) == 10


def test_messages_without_a_key_are_one_tenant_of_their_lane(stack):
    enqueue(stack, None, 5)
    enqueue(stack, "k", 5)
    stack.launcher().tick()
    assert running_by_tenant(stack) == {"lane:shared": 4, "k": 4}


def test_a_tenants_own_cap_still_holds(stack):
    stack.runtime().store().set_key_cap("heavy", 1)
    enqueue(stack, "heavy", 10)
    enqueue(stack, "light", 2)
    stack.launcher().tick()
    assert running_by_tenant(stack) == {"heavy": 1, "light": 2}


def test_every_payload_starts_once_and_nothing_is_dead_lettered(stack):
    enqueue(stack, "heavy", 12)
    enqueue(stack, "light", 3)
    launcher = stack.launcher()
    launcher.tick()
    while stack.running():
        for name in list(stack.running()):
            end(stack, launcher, name)
    inputs = sorted(i["id"] for i in stack.inputs())
    assert inputs == sorted([f"heavy-{i}" for i in range(12)] + [f"light-{i}" for i in range(3)])
    assert stack.dlq_messages() == []
    store = stack.runtime().store()
    assert store.keys_waiting() == frozenset(), "every line emptied and tidied"
    assert store.key_state("heavy").fair is None, "no longer the lane's tenant"


def test_a_bad_tenant_key_is_dead_lettered_with_its_reason(stack):
    stack.send({"id": "bad"}, group="g", lane="shared", **{KEY: "bad\x01key"})
    summary = stack.launcher().tick()
    assert summary.n(Outcome.INVALID) == 1
    assert stack.queue_counts(stack.settings.lane_queue_url("shared")) == (0, 0)


def test_with_nobody_waiting_a_new_message_starts_at_once_without_lining_up(stack):
    enqueue(stack, "solo", 3)
    rt = stack.runtime()
    calls = count_calls(rt.client("sqs"), rt.client("dynamodb"))
    summary = rt.launcher().tick()
    assert summary.lanes["shared"]["started"] == 3
    assert summary.n(Outcome.KEY_WAITING) == 0
    assert calls["SendMessage"] == 0, "nothing parked, so nothing woken"
    store = rt.store()
    assert store.keys_waiting() == frozenset() and store.key_state("solo").holders != frozenset()


def test_a_newcomer_lines_up_once_anyone_waits(stack):
    enqueue(stack, "heavy", 9)  # one more than the lane: the ninth lines up
    launcher = stack.launcher()
    launcher.tick()
    assert running_by_tenant(stack) == {"heavy": 8}
    enqueue(stack, "light", 1)
    launcher.tick()  # the lane is full: no share, no receive; light waits in the queue
    assert stack.queue_counts(stack.settings.lane_queue_url("shared")) == (1, 0)
    heavy_run = next(iter(stack.running()))
    end(stack, launcher, heavy_run)
    assert running_by_tenant(stack) == {"heavy": 7, "light": 1}, (
        "the freed slot went to the tenant with fewer runs"
    )


# -- each tenant in its own message group, as `sluice enqueue` sends to a fair lane -------------------


def enqueue_in_groups(stack, counts: dict[str, int]) -> list[str]:
    """Each tenant's payloads in the tenant's group (``enqueue(fair=True)``), in this order; their keys."""
    items = [
        next(read_items(json.dumps({"id": f"{tenant}-{i}"})))
        for tenant, n in counts.items()
        for i in range(n)
    ]
    sent = []
    for tenant, n in counts.items():
        chunk, items = items[:n], items[n:]
        report = sluice_enqueue(
            stack.client("sqs"),
            stack.settings.lane_queue_url("shared"),
            chunk,
            concurrency_key=tenant,
            lane="shared",
            fair=True,
        )
        assert report.ok and len(report.sent) == n
        sent += [key for _, key, _ in report.sent]
    return sent


def test_enqueue_to_a_fair_lane_sends_each_tenant_in_its_group(stack):
    enqueue_in_groups(stack, {"acme": 2, "initech": 1})
    items = list(read_items(json.dumps({"id": "u1"})))
    assert sluice_enqueue(
        stack.client("sqs"), stack.settings.lane_queue_url("shared"), items, lane="shared", fair=True
    ).ok
    messages = stack.drain(stack.settings.lane_queue_url("shared"))
    assert sorted(m["Attributes"]["MessageGroupId"] for m in messages) == [
        "acme",
        "acme",
        "initech",
        "lane:shared",
    ]


def test_tenants_in_their_groups_share_the_lane_however_long_the_first_ones_backlog(stack):
    """heavy's 30 payloads, then a's and b's 3 each, every tenant in its group: SQS skips heavy's group
    while the pass holds its first batch, so the first receives meet every tenant and each claims its
    share at once. With heavy's batch claimed first (the pass before tenants were met), heavy took all
    8 slots."""
    keys = enqueue_in_groups(stack, {"heavy": 30, "a": 3, "b": 3})
    rt = stack.runtime()
    calls = count_calls(rt.client("sqs"))
    summary = rt.launcher().tick()
    running = running_by_tenant(stack)
    assert sorted(running.values()) == [2, 3, 3] and set(running) == {"heavy", "a", "b"}, running
    assert summary.lanes["shared"]["started"] == 8
    store = rt.store()
    assert store.key_state("heavy").waiting == 30 - running["heavy"]
    assert store.key_state("a").waiting + store.key_state("b").waiting == 6 - running["a"] - running["b"]
    assert stack.queue_counts(stack.settings.lane_queue_url("shared")) == (0, 0)
    assert calls["ReceiveMessage"] >= 4  # heavy's, a's, b's, then an empty one
    assert len(keys) == 36


def throttled_then_drained(stack) -> tuple[list[str], Counter]:
    """Tenants in their groups; a tick whose every StartExecution is throttled; then AWS answers again
    and the lane is run dry. The payloads that ran, and the throttle's count."""
    enqueue_in_groups(stack, {"heavy": 10, "a": 3, "b": 3})
    rt = stack.runtime()
    refused = Counter(on=1)

    def throttled(**_):
        if refused["on"]:
            refused["throttled"] += 1
            return error_answer("ThrottlingException", 400)
        return None

    rt.client("stepfunctions").meta.events.register("before-call.sfn.StartExecution", throttled)
    summary = rt.launcher().tick()
    assert summary.stopped == "transient" and not stack.running()
    refused["on"] = 0
    stack.clock.advance(400)  # past the visibility timeout: whatever a claim kept comes back too
    launcher = rt.launcher()
    launcher.tick()
    while stack.running():
        for name in list(stack.running()):
            end(stack, launcher, name)
        if not stack.running():
            launcher.tick()
    return sorted(i["id"] for i in stack.inputs()), refused


ALL_SIXTEEN = sorted(f"{t}-{i}" for t, n in (("heavy", 10), ("a", 3), ("b", 3)) for i in range(n))


def test_tenants_in_hand_that_a_throttled_start_stopped_go_back_to_the_queue(stack):
    """Step Functions throttles every start: the pass's claims stop on the first, and the messages it
    held in hand and never began (the tenants' rest) go back to the queue; once AWS answers again,
    every payload starts once."""
    ran, refused = throttled_then_drained(stack)
    assert refused["throttled"] >= 1
    assert ran == ALL_SIXTEEN, "a payload held in hand was lost"
    assert stack.dlq_messages() == []


def test_messages_in_hand_deleted_instead_of_handed_back_is_caught(stack):
    """Variant ``in_hand_deleted`` (tests/explorer/broken.py) loses the rest of what the pass held."""
    from tests.explorer.broken import VARIANTS, patch

    saved = patch(VARIANTS["in_hand_deleted"][1])
    try:
        ran, refused = throttled_then_drained(stack)
    finally:
        patch(saved)
    assert refused["throttled"] >= 1 and len(ran) < len(ALL_SIXTEEN)


def forged_ticket_among_tenants(stack):
    """a's and b's payloads in their groups, and one of c's carrying a forged ticket, then a tick."""
    enqueue_in_groups(stack, {"a": 2, "b": 2})
    stack.send({"id": "c-0"}, group="c", lane="shared", **{KEY: "c", "sluice_key_ticket": "1@²"})
    return stack.launcher().tick()


def test_a_forged_ticket_in_hand_is_dead_lettered_and_the_others_start(stack):
    summary = forged_ticket_among_tenants(stack)
    assert summary.n(Outcome.INVALID) == 1
    assert running_by_tenant(stack) == {"a": 2, "b": 2}
    (dead,) = stack.dlq_messages()
    assert "sluice-key-ticket" in dead["MessageAttributes"]["sluice-error"]["StringValue"]


def test_a_forged_ticket_read_before_processing_is_caught(stack):
    """Variant ``in_hand_ticket_parsed`` (tests/explorer/broken.py): the tick fails on the forged ticket."""
    from sluice.core.errors import InvalidPayload
    from tests.explorer.broken import VARIANTS, patch

    saved = patch(VARIANTS["in_hand_ticket_parsed"][1])
    try:
        with pytest.raises(InvalidPayload, match="sluice-key-ticket"):
            forged_ticket_among_tenants(stack)
    finally:
        patch(saved)
    assert not stack.running()


@pytest.mark.parametrize("nth", [1, 2])
def test_a_throttled_receive_ends_the_fair_lanes_pass_not_the_tick(stack, nth):
    """SQS refuses the pass's first receive, or its second (the first batch in hand): the tick ends
    as interrupted (``transient``) instead of failing, what was in hand goes back at once, and the
    next tick starts it all."""
    enqueue_in_groups(stack, {"a": 2, "b": 2})
    rt = stack.runtime()
    seen = Counter()

    def refused(**_):
        seen["receives"] += 1
        if seen["receives"] == nth:
            seen["throttled"] += 1
            return error_answer("ThrottlingException", 400)
        return None

    rt.client("sqs").meta.events.register("before-call.sqs.ReceiveMessage", refused)
    summary = rt.launcher().tick()
    assert seen["throttled"] == 1 and summary.stopped == "transient"
    assert stack.queue_counts(stack.settings.lane_queue_url("shared"))[1] == 0, "held in flight"
    rt.launcher().tick()
    assert running_by_tenant(stack) == {"a": 2, "b": 2}


# -- a reviewer's attacks on the first pass (a44dcdf) ---------------------------------------------------


def test_a_tenant_whose_group_sqs_hid_still_gets_its_even_part(session):
    """Lane MAX 12 (the whole room): a's 9, then b's 10, then c's 10, each in its group. The first
    receive holds a's 9 and b's first; SQS hides b's other 9 behind it. b's one in hand is not its
    backlog: a and c claim no more than an even part (4), and b gets the rest once its messages line up."""
    stack = build_stack(session, clock=FakeClock(), max_concurrency=12, lanes="shared:12:1:1:fair")
    enqueue_in_groups(stack, {"a": 9, "b": 10, "c": 10})
    stack.launcher().tick()
    assert running_by_tenant(stack) == {"a": 4, "b": 4, "c": 4}


def test_a_fair_lane_keeps_to_its_weighted_part_of_the_room(session):
    """Lanes of equal priority and weight share the global MAX 8: what the fair lane's pass claimed is
    part of its share, so its waker does not take the other lane's half too."""
    stack = build_stack(
        session, clock=FakeClock(), max_concurrency=8, lanes="shared:8:0:1:fair,default:8:0:1"
    )
    enqueue_in_groups(stack, {"a": 10, "b": 10, "c": 10})
    for i in range(4):
        stack.send({"id": f"d-{i}"}, group=f"d-{i}")
    stack.launcher().tick()
    by_lane = Counter("shared" if tenant_of(stack, n) else "default" for n in stack.running())
    assert by_lane == {"shared": 4, "default": 4}


def test_a_throttled_read_of_the_lines_spends_no_receive(stack):
    """Every GetItem of KEYS_WAITING is throttled for ten admissions: the newcomers in hand line up (no
    message goes back to the queue to spend a receive towards maxReceiveCount), and the waker's own
    read ends each tick as interrupted, not failed; afterwards all run."""
    rt = stack.runtime()
    launcher = rt.launcher()
    launcher.tick()  # the limits in force, before anything arrives
    enqueue_in_groups(stack, {"a": 3, "b": 3, "c": 3})
    throttled = Counter(on=1)

    def keys_waiting_refused(params, **_):
        body = params.get("body", b"")
        if throttled["on"] and "KEYS_WAITING" in (body.decode() if isinstance(body, bytes) else str(body)):
            throttled["hits"] += 1
            return error_answer("ProvisionedThroughputExceededException", 400)
        return None

    rt.client("dynamodb").meta.events.register("before-call.dynamodb.GetItem", keys_waiting_refused)
    stops = Counter(launcher.tick(reconcile_first=False, linger=False).stopped for _ in range(10))
    throttled["on"] = 0
    assert throttled["hits"] >= 10 and stops == {"transient": 10}
    assert stack.queue_counts(stack.settings.lane_queue_url("shared")) == (0, 0), "handed back"
    assert stack.dlq_messages() == []
    launcher.tick()
    while stack.running():
        for name in list(stack.running()):
            end(stack, launcher, name)
    assert sorted(i["id"] for i in stack.inputs()) == sorted(f"{t}-{i}" for t in "abc" for i in range(3))


def test_a_woken_waiter_is_not_held_behind_its_tenants_group(stack):
    """heavy's 12 in heavy's group: 8 run, 4 wait in heavy's line. One more heavy message arrives and
    another invocation holds it in flight (a pass lining it up), so SQS hides heavy's group. A run
    ends: the waker sends heavy's oldest waiter back in a group of its own, and the completion's
    receive gets it and starts it. In heavy's group it stayed hidden, and the freed slot idle."""
    enqueue_in_groups(stack, {"heavy": 12})
    launcher = stack.launcher()
    launcher.tick()
    assert running_by_tenant(stack) == {"heavy": 8}
    assert stack.runtime().store().key_state("heavy").waiting == 4
    enqueue_in_groups(stack, {"heavy": 1})
    sqs, url = stack.client("sqs"), stack.settings.lane_queue_url("shared")
    held = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=300)["Messages"]
    assert len(held) == 1
    _, refill, _ = end(stack, launcher, sorted(stack.running())[0])
    assert refill.lanes["shared"]["started"] == 1
    assert running_by_tenant(stack) == {"heavy": 8}
    assert stack.runtime().store().key_state("heavy").waiting == 3


def window_passes(stack, url: str, receipts: list[str], seconds: float) -> None:
    """``seconds`` pass: what went back for a window is visible again (moto runs visibility in real
    time). A receipt of a message deleted since is refused, and skipped."""
    stack.clock.advance(seconds)
    sqs = stack.client("sqs")
    for receipt in receipts:
        with contextlib.suppress(ClientError):
            sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=receipt, VisibilityTimeout=0)
    receipts.clear()


def test_duplicates_woken_ahead_of_a_new_payload_do_not_walk_it_to_the_dlq(session):
    """A reviewer's attack on 6813340 (a woken waiter in a group of its own). heavy-0 runs; its
    producer re-submits it 5 times in heavy's group, then sends a new payload, heavy-8; light-0 arrives
    and z waits (its cap 0), so all of them line up. A tick wakes the five copies and heavy-8 together,
    each in its own group: each copy's claim meets heavy-0 running, a first look, back for the window.
    heavy-8 is in no copy's group and goes on: it starts, and the copies' second looks suppress them.
    Handed back behind each copy (unsighted), it spent a receive per copy and SQS moved it to the DLQ
    without a reason (maxReceiveCount 5)."""
    stack = build_stack(
        session,
        clock=FakeClock(),
        max_concurrency=20,
        lanes="shared:16:0:1:fair,default:4",
        max_receive_count=5,
    )
    url = stack.settings.lane_queue_url("shared")
    receipts: list[str] = []
    stack.session.events.register(
        "after-call.sqs.ReceiveMessage",
        lambda parsed, **_: receipts.extend(m["ReceiptHandle"] for m in parsed.get("Messages", [])),
    )
    store = stack.runtime().store()
    store.set_key_cap("z", 0)
    enqueue_in_groups(stack, {"z": 1})
    launcher = stack.launcher()
    launcher.tick()
    enqueue_in_groups(stack, {"heavy": 8})
    launcher.tick()
    assert running_by_tenant(stack) == {"heavy": 8}
    for _ in range(5):
        stack.send({"id": "heavy-0"}, group="heavy", lane="shared", **{KEY: "heavy"})
    stack.send({"id": "heavy-8"}, group="heavy", lane="shared", **{KEY: "heavy"})
    stack.send({"id": "light-0"}, group="light", lane="shared", **{KEY: "light"})
    sfn = stack.client("stepfunctions")
    by_input = {
        json.loads(sfn.describe_execution(executionArn=e["executionArn"])["input"])["id"]: e["name"]
        for e in stack.executions("RUNNING")
    }
    for payload, name in by_input.items():
        if payload != "heavy-0":
            stack.finish(name, "SUCCEEDED")  # their events lost: reconciliation frees the slots
    stack.clock.advance(200)
    summary = launcher.tick()
    assert summary.outcomes.get("recheck", 0) >= 1, summary.outcomes  # the copies' first looks happened
    for _ in range(3):  # the window passes, ticks go on
        window_passes(stack, url, receipts, 120)
        launcher.tick()
    assert [m["Body"] for m in stack.dlq_messages()] == []
    started = Counter(i["id"] for i in stack.inputs())
    assert started["heavy-8"] == 1 and started["heavy-0"] == 1 and started["light-0"] == 1


def test_a_recheck_holds_back_its_own_group_only_and_the_tenants_other_groups_go_on(session):
    """A second reviewer's test of b6e4a56. P runs; tenant T then sends, in three groups: g [copy of P,
    N1, N2], h [N3, copy of P, N4], k [N5]. Each copy's first look goes back for the window with its
    group's later messages behind it (sighted: each is received twice, not more); N3 and N5 start in
    the same pass; after the window every payload starts once, in its group's order, and the copies are
    duplicates. Before, the first recheck handed T's whole run back."""
    stack = build_stack(session, clock=FakeClock(), max_concurrency=10, lanes=LANES)
    url = stack.settings.lane_queue_url("shared")
    receipts: list[str] = []
    received: Counter[str] = Counter()

    def on_receive(parsed, **_):
        for m in parsed.get("Messages", []):
            receipts.append(m["ReceiptHandle"])
            received[json.loads(m["Body"])["id"]] += 1

    order: list[str] = []  # payloads in the order Step Functions started them

    def on_start(params, **_):
        order.append(json.loads(params["input"])["id"])

    stack.session.events.register("after-call.sqs.ReceiveMessage", on_receive)
    stack.session.events.register("provide-client-params.states.StartExecution", on_start)
    launcher = stack.launcher()
    stack.send({"id": "P"}, group="gP", lane="shared", **{KEY: "T"})
    launcher.tick()
    for payload, group in [
        ("P", "g"),
        ("N1", "g"),
        ("N3", "h"),
        ("N2", "g"),
        ("P", "h"),
        ("N4", "h"),
        ("N5", "k"),
    ]:
        stack.send({"id": payload}, group=group, lane="shared", **{KEY: "T"})
    summary = launcher.tick()
    assert summary.outcomes.get("recheck") == 2, summary.outcomes
    assert sorted(i["id"] for i in stack.inputs()) == ["N3", "N5", "P"]
    outcomes: Counter[str] = Counter()
    for _ in range(4):  # the window passes, ticks go on
        window_passes(stack, url, receipts, 61)
        outcomes.update(launcher.tick().outcomes)
    assert sorted(i["id"] for i in stack.inputs()) == ["N1", "N2", "N3", "N4", "N5", "P"]
    assert len(order) == 6, order
    assert order.index("N1") < order.index("N2") and order.index("N3") < order.index("N4")
    assert outcomes["duplicate"] == 2 and received["N1"] == 2 and received["N4"] == 2, (outcomes, received)
    assert stack.dlq_messages() == [] and stack.queue_counts(url) == (0, 0)
