"""A reconciliation whose caps write loses every round to other writers (explorer seed 1398629532).

Reconciliation saves its external count in LEDGER only once the slot pool carries it: a later
reconciliation whose listing overlaps merges with the pool's stamp alone, so a count saved that
the pool lacks is undone by the older listing (MAX less 1 while the newest listing showed 2 runs
started by hand). When the pool moves under each of its rounds (``MERGE_ROUNDS``), the count is
not saved and the next reconciliation lists again. ``sluice set-max`` under the same contention
says its MAX is not in force yet; the next tick brings it to the caps.

The real launcher and ``sluice set-max`` on moto; the rival writer is the operator's own
``apply_max`` run from a botocore hook just before each caps write of the launcher's client.
"""

from __future__ import annotations

from typing import Any

import pytest

from sluice.adapters.dynamo.launch_slots import MERGE_ROUNDS
from sluice.cli.render import in_force
from sluice.core.clock import FakeClock
from sluice.ops.maximum import apply_max, set_max
from tests.support.aws import Stack, build_stack


def _writes_the_pool(params: dict[str, Any]) -> bool:
    return any(
        item.get("Update", {}).get("Key", {}).get("pk", {}).get("S") == "SLOTS#launcher"
        for item in params.get("TransactItems", [])
    )


def rival_before_each_caps_write(client: Any, stack: Stack, values: list[int]) -> dict[str, int]:
    """Just before each write of the launcher pool's caps on ``client``, another writer moves the
    pool: MAX written and put in force by the operator, alternating ``values``."""
    fired = {"rival": 0}
    operator = stack.runtime()

    def hook(params: dict[str, Any], **_: Any) -> None:
        if not _writes_the_pool(params):
            return
        value = values[fired["rival"] % len(values)]
        fired["rival"] += 1
        operator.max_parameter().write(value)
        apply_max(operator)

    client.meta.events.register("before-parameter-build.dynamodb.TransactWriteItems", hook)
    return fired


def ledger_item(stack: Stack) -> dict[str, Any]:
    table = stack.client("dynamodb")
    return table.get_item(
        TableName=stack.settings.table_name, Key={"pk": {"S": "LEDGER"}}, ConsistentRead=True
    )["Item"]


def start_by_hand(stack: Stack, *names: str) -> None:
    sfn = stack.client("stepfunctions")
    for name in names:
        sfn.start_execution(stateMachineArn=stack.settings.state_machine_arn, name=name, input="{}")


def test_a_count_the_caps_never_carried_is_not_saved_and_the_next_reconciliation_puts_it_in_force(session):
    stack = build_stack(session, max_concurrency=4, clock=FakeClock())
    stack.launcher().tick()  # the pool exists, nothing outside
    start_by_hand(stack, "by-hand-1", "by-hand-2")
    stack.clock.advance(120)  # older than the consistency window: every listing shows both

    rt = stack.runtime()
    fired = rival_before_each_caps_write(rt.client("dynamodb"), stack, [4, 5])
    rt.launcher().tick()

    assert fired["rival"] >= MERGE_ROUNDS, "the rival writer moved the pool before each caps write"
    assert int(ledger_item(stack).get("external", {"N": "0"})["N"]) == 0, (
        "a count the caps never carried was saved"
    )

    stack.runtime().max_parameter().write(4)
    stack.clock.advance(60)
    stack.launcher().tick()  # no rival: the count lands in the caps, then in LEDGER
    assert int(ledger_item(stack)["external"]["N"]) == 2
    assert stack.runtime().store().ledger().in_force == 4 - 2


def test_set_max_under_a_contended_pool_says_it_is_not_in_force_yet_and_the_next_tick_puts_it_there(session):
    stack = build_stack(session, max_concurrency=4, clock=FakeClock())
    rival = stack.launcher(max_cache_seconds=86_400)
    rival.tick()  # it reads MAX 4 and keeps it
    rt = stack.runtime()
    fired = {"rival": 0}

    def rival_reconciles(params: dict[str, Any], **_: Any) -> None:
        # Before each caps write of set-max: one more run started by hand, and a tick that counts it
        # under the MAX it read before set-max (older, so set-max's merge keeps 9 and writes again)
        if _writes_the_pool(params):
            fired["rival"] += 1
            start_by_hand(stack, f"by-hand-{fired['rival']}")
            stack.clock.advance(120)  # past the consistency window: the tick reconciles and counts it
            rival.tick()

    rt.client("dynamodb").meta.events.register(
        "before-parameter-build.dynamodb.TransactWriteItems", rival_reconciles
    )
    result = set_max(rt, 9)

    assert fired["rival"] >= MERGE_ROUNDS, "a tick moved the pool before each caps write"
    assert result.get("contended") is True
    assert "Not in force yet" in in_force(result)
    running_outside = fired["rival"]
    assert stack.runtime().store().ledger().in_force == max(0, 4 - running_outside)  # the old MAX still binds
    stack.launcher().tick()
    assert stack.runtime().store().ledger().in_force == 9 - running_outside


def test_the_variant_that_saves_an_uncarried_count_is_caught(session, monkeypatch):
    """The variant ``uncarried_count_saved`` (tests/explorer/broken.py, the code before the fix)
    fails the first test."""
    from tests.explorer.broken import VARIANTS

    for owner, attr, value in VARIANTS["uncarried_count_saved"][1]:
        monkeypatch.setattr(owner, attr, value)
    with pytest.raises(AssertionError, match="a count the caps never carried was saved"):
        test_a_count_the_caps_never_carried_is_not_saved_and_the_next_reconciliation_puts_it_in_force(session)
