"""A producer wakes the launcher: ``sluice enqueue`` (and ``sluice.enqueue.enqueue`` with a
``LauncherWake``) invokes it asynchronously after sending, and the woken launcher fills what is free
now, without reconciling and without lingering. Lambda is played by the tests: each recorded
invocation is run through the real handler, as Lambda would run it a moment later."""

from __future__ import annotations

import json
import threading
import time

import pytest

from handlers import _shared
from handlers import launcher as launcher_handler
from sluice.core.events import WAKE_EVENT, is_wake
from sluice.enqueue import Item, LauncherWake, enqueue
from tests.contract.slots_fixtures import in_threads
from tests.support.aws import LambdaContext, build_stack, functions_environment
from tests.support.cli import clear_sluice_env, deploy, sluice
from tests.support.hooks import count_calls, error_answer, lambda_invocations
from tests.support.moto_patches import atomic_fast_moto

STACK = "sluice-wake"
LAUNCHER = "arn:aws:lambda:us-east-1:123456789012:function:sluice-wake-launcher"


@pytest.fixture
def deployed(stack, monkeypatch):
    """The stack as deployed, its outputs naming the launcher to wake."""
    clear_sluice_env(monkeypatch)
    deploy(stack, STACK, outputs={"LauncherFunctionArn": LAUNCHER})
    _shared.reset()
    yield stack
    _shared.reset()


def launcher_env(stack) -> dict[str, str]:
    """The deployed launcher's environment (lingerSeconds 55, as deployed)."""
    return functions_environment(stack, SLUICE_LINGER_SECONDS="55")


@pytest.fixture
def launcher_runtime(deployed):
    """The launcher's warm runtime, built with its deployed environment (for counting its calls)."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in launcher_env(deployed).items():
            mp.setenv(name, value)
        _shared.reset()
        runtime = _shared.runtime()
    return runtime


def payloads(tmp_path, keys: list[str]) -> str:
    path = tmp_path / "payloads.jsonl"
    path.write_text("".join(json.dumps({"id": k}) + "\n" for k in keys))
    return str(path)


def enqueue_cli(stack, capsys, tmp_path, keys: list[str], *flags: str, stack_name: str | None = STACK):
    """``sluice [--stack STACK] enqueue FILE FLAGS...`` with ``keys`` as payloads, as JSON."""
    where = ("--stack", stack_name) if stack_name else ()
    return sluice(
        capsys, *where, "enqueue", payloads(tmp_path, keys), "--json", *flags, session=stack.session
    )


def play_lambda(stack, invocations: list[dict]) -> list[dict]:
    """Run each recorded asynchronous invocation of the launcher through its handler, with the
    deployed launcher's environment (its warm runtime, when one was built, is kept)."""
    results = []
    with pytest.MonkeyPatch.context() as mp:
        for name, value in launcher_env(stack).items():
            mp.setenv(name, value)
        for invocation in invocations:
            assert invocation["type"] == "Event"
            results.append(launcher_handler.handler(invocation["event"], LambdaContext()))
    return results


def test_enqueue_wakes_the_launcher_which_starts_the_payloads_at_once(
    deployed, launcher_runtime, capsys, tmp_path
):
    invocations = lambda_invocations(deployed.session.events)

    run = enqueue_cli(deployed, capsys, tmp_path, ["a", "b", "c"])

    assert run.code == 0, run.err
    assert run.json["woken"] == 1 and run.json["wake_failed"] is None
    assert [(i["function"], i["type"], i["event"]) for i in invocations] == [(LAUNCHER, "Event", WAKE_EVENT)]
    assert deployed.running() == [] and deployed.queue_counts() == (3, 0)

    calls = count_calls(launcher_runtime.client("sqs"), launcher_runtime.client("stepfunctions"))
    [summary] = play_lambda(deployed, invocations)

    assert summary["started"] == 3 and summary["reconciled"] is False
    assert (
        sorted(deployed.running()) == sorted(e["name"] for e in deployed.executions())
        and len(deployed.running()) == 3
    )
    assert deployed.queue_counts() == (0, 0)
    # No reconciliation (no listing, no describe) and no linger: two receives, the second empty,
    # where a lingering tick would go on receiving for 55 s.
    assert calls["ListExecutions"] == 0 and calls["DescribeExecution"] == 0
    assert calls["ReceiveMessage"] == 2 and calls["StartExecution"] == 3


def test_a_wake_while_every_slot_is_held_receives_nothing(deployed, launcher_runtime, capsys, tmp_path):
    deployed.client("ssm").put_parameter(Name=deployed.settings.max_parameter, Value="2", Overwrite=True)
    invocations = lambda_invocations(deployed.session.events)
    enqueue_cli(deployed, capsys, tmp_path, ["a", "b"])
    play_lambda(deployed, invocations)
    assert len(deployed.running()) == 2
    invocations.clear()

    run = sluice(capsys, "--stack", STACK, "enqueue", payloads(tmp_path, ["c"]), session=deployed.session)
    assert run.code == 0 and run.out == "sent 1 of 1 payloads; the launcher was woken\n"
    calls = count_calls(launcher_runtime.client("sqs"))
    [summary] = play_lambda(deployed, invocations)

    assert summary["started"] == 0 and summary["free_slots"] == 0
    assert calls["ReceiveMessage"] == 0  # the read found no room: the message keeps its receives
    assert deployed.queue_counts() == (1, 0) and len(deployed.running()) == 2


def test_one_wake_per_chunk_sent(deployed, capsys, tmp_path):
    invocations = lambda_invocations(deployed.session.events)

    run = enqueue_cli(deployed, capsys, tmp_path, [f"k{i}" for i in range(150)])

    assert run.code == 0 and len(run.json["sent"]) == 150
    assert run.json["woken"] == 2 and len(invocations) == 2  # 100 per chunk (ENQUEUE_CHUNK)


def test_a_refused_wake_loses_nothing_and_says_so(deployed, capsys, tmp_path):
    deployed.session.events.register(
        "before-call.lambda.Invoke", lambda **_: error_answer("AccessDeniedException", 403)
    )

    run = enqueue_cli(deployed, capsys, tmp_path, ["a", "b"])

    assert run.code == 0  # the payloads were sent: they start at the next scheduled tick
    assert run.json["woken"] == 0 and "AccessDeniedException" in run.json["wake_failed"]
    assert "the launcher was not woken (" in run.err and "next scheduled tick" in run.err
    assert deployed.queue_counts() == (2, 0)


def test_no_wake_without_a_launcher_named_or_with_no_wake(deployed, capsys, tmp_path, monkeypatch):
    invocations = lambda_invocations(deployed.session.events)

    run = enqueue_cli(deployed, capsys, tmp_path, ["a"], "--no-wake")
    assert run.code == 0 and run.json["woken"] == 0 and invocations == []

    # A producer that names its queue alone reads no stack, so it knows no launcher...
    monkeypatch.setenv("SLUICE_QUEUE_URL", deployed.settings.queue_url)
    run = enqueue_cli(deployed, capsys, tmp_path, ["b"], stack_name=None)
    assert run.code == 0 and run.json["woken"] == 0 and invocations == []

    # ...unless it names that too.
    monkeypatch.setenv("SLUICE_LAUNCHER_FUNCTION", "sluice-wake-launcher")
    run = enqueue_cli(deployed, capsys, tmp_path, ["c"], stack_name=None)
    assert run.json["woken"] == 1 and [i["function"] for i in invocations] == ["sluice-wake-launcher"]
    assert deployed.queue_counts() == (3, 0)


def test_the_python_api_wakes_once_per_call_and_only_when_something_was_sent(deployed):
    lam = deployed.client("lambda")
    invocations = lambda_invocations(lam.meta.events)
    wake = LauncherWake.of(lam, LAUNCHER)
    sqs = deployed.client("sqs")

    report = enqueue(
        sqs, deployed.settings.queue_url, [Item("line 1", '{"id": "x"}'), Item("line 2", "[]")], wake=wake
    )
    assert report.woken == 1 and len(report.sent) == 1 and len(report.failed) == 1

    report = enqueue(sqs, deployed.settings.queue_url, [Item("line 1", "[]")], wake=wake)
    assert report.woken == 0 and len(invocations) == 1  # nothing sent, nothing to wake for

    [summary] = play_lambda(deployed, invocations)
    assert summary["started"] == 1


def test_only_the_exact_wake_event_skips_reconciliation(deployed):
    """Any other event, a forged or mistyped wake included, is a scheduled tick: it reconciles. (With
    MAX 0 in force nothing is received, so the scheduled tick does not linger.)"""
    deployed.client("ssm").put_parameter(Name=deployed.settings.max_parameter, Value="0", Overwrite=True)
    assert is_wake({"sluice": "wake"}) and not is_wake({"sluice": "wake", "detail": {}})
    assert not is_wake({"sluice": "Wake"}) and not is_wake(["sluice"]) and not is_wake(None)

    woken, forged = play_lambda(
        deployed,
        [
            {"type": "Event", "event": dict(WAKE_EVENT)},
            {"type": "Event", "event": {"sluice": "wake", "extra": 1}},
        ],
    )

    assert woken["reconciled"] is False and forged["reconciled"] is True


def test_the_readmes_python_snippet_sends_and_wakes(stack, monkeypatch):
    """The snippet of README.md "Enqueue", run as it is on moto: it sends the payloads and wakes
    the launcher it names."""
    import re

    import boto3

    from tests.support.docs import ROOT

    readme = (ROOT / "README.md").read_text()
    enqueue_section = readme.split("\n## Enqueue\n", 1)[1].split("\n## ", 1)[0]
    [snippet] = re.findall(r"```python\n(.*?)```", enqueue_section, flags=re.S)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # the default session comes back after the test
    boto3.setup_default_session(region_name="us-east-1")
    invocations = lambda_invocations(boto3.DEFAULT_SESSION.events)
    scope = {"QUEUE_URL": stack.settings.queue_url, "text": '{"id": "a"}\n{"id": "b"}\n'}

    exec(snippet, scope)  # the documented snippet, as a user runs it

    assert len(scope["report"].sent) == 2 and scope["report"].woken == 1
    assert [(i["function"], i["event"]) for i in invocations] == [("sluice-prod-launcher", WAKE_EVENT)]
    assert stack.queue_counts() == (2, 0)


def test_a_send_refused_mid_chunk_reports_what_was_sent_and_still_wakes(deployed, capsys, tmp_path):
    """SQS refuses the third SendMessageBatch of a 50-payload chunk: the 20 sent before it are
    reported sent and woken for, and the first item not sent is named."""
    invocations = lambda_invocations(deployed.session.events)
    calls = []

    def refuse_from_the_third(**_):
        calls.append(1)
        return error_answer("ThrottlingException", 400) if len(calls) >= 3 else None

    deployed.session.events.register("before-call.sqs.SendMessageBatch", refuse_from_the_third)

    run = enqueue_cli(deployed, capsys, tmp_path, [f"k{i}" for i in range(50)])

    assert run.code == 3 and len(calls) >= 3
    assert len(run.json["sent"]) == 20 and run.json["woken"] == 1 and len(invocations) == 1
    assert run.json["unsent"].startswith("line 21 and after were not sent: ")
    assert deployed.queue_counts() == (20, 0)


def test_a_failed_wake_made_good_by_a_later_one_is_not_reported(deployed, capsys, tmp_path):
    """150 payloads, two chunks: the first chunk's wake is throttled, the second's wakes the launcher
    for both chunks. Nothing is said to have failed."""
    refused = []

    def throttle_the_first(**_):
        if refused:
            return None
        refused.append(1)
        return error_answer("TooManyRequestsException", 429)

    deployed.session.events.register("before-call.lambda.Invoke", throttle_the_first)  # first in line
    invocations = lambda_invocations(deployed.session.events)

    run = enqueue_cli(deployed, capsys, tmp_path, [f"k{i}" for i in range(150)])

    assert run.code == 0 and refused and len(invocations) == 2
    assert run.json["woken"] == 1 and run.json["wake_failed"] is None
    assert "not woken" not in run.err


def test_a_wake_that_raises_anything_fails_nothing(deployed):
    def broken_wake() -> None:
        raise ValueError("no launcher here")

    report = enqueue(
        deployed.client("sqs"), deployed.settings.queue_url, [Item("line 1", '{"id": "x"}')], wake=broken_wake
    )

    assert len(report.sent) == 1 and report.woken == 0
    assert report.wake_failed == "ValueError: no launcher here"
    assert deployed.queue_counts() == (1, 0)


def burst(stack, n: int, *, take_turns: bool) -> tuple[int, int]:
    """``n`` woken launchers at once (each its own container), 5 slots free and ``n`` payloads
    queued, one per producer: (receives spent on messages that did not start, runs started).
    Without turns, each reads the room before any of them receives, as a crowd of wakes does."""
    for i in range(n):
        stack.send({"id": f"k{i}"}, group=f"k{i}")
    launchers = [stack.launcher() for _ in range(n)]
    turns = stack.runtime().wake_turns()
    received: list[int] = []
    together = threading.Barrier(n, timeout=20)
    for launcher in launchers:
        events = launcher.queue.client.meta.events
        events.register(
            "after-call.sqs.ReceiveMessage",
            lambda parsed, **_: received.append(len(parsed.get("Messages", []))),
        )
        if not take_turns:
            first = [True]

            def all_read_the_room(first=first, **_):
                if first[0]:
                    first[0] = False
                    together.wait()

            events.register("before-call.sqs.ReceiveMessage", all_read_the_room)

    def wake(i: int) -> None:
        if take_turns:
            launchers[i].wake(turns)
        else:
            launchers[i].tick(reconcile_first=False, linger=False)

    with atomic_fast_moto():
        in_threads(n, wake)
    started = len(stack.running())
    return sum(received) - started, started


def test_a_crowd_of_wakes_without_turns_spends_the_receives_of_healthy_messages(session):
    """What a crowd of wakes did before woken launchers took turns: 20 of them read 5 free slots, and
    the 15 messages whose claims lost were received for nothing (maxReceiveCount 10: a few such
    crowds dead-letter healthy payloads)."""
    stack = build_stack(session, max_receive_count=10)
    wasted, started = burst(stack, 20, take_turns=False)
    assert started == 5 and wasted >= 15


def test_woken_launchers_take_turns_and_spend_no_receive_for_nothing(session):
    stack = build_stack(session, max_receive_count=10)
    wasted, started = burst(stack, 20, take_turns=True)
    assert started == 5 and wasted == 0
    assert stack.queue_counts() == (15, 0) and stack.dlq_messages() == []
    assert (
        stack.runtime().wake_turns().take("next", now=time.time(), expires_at=time.time() + 60)
    )  # given back
