"""Sluice attributes spelt another way, or sent as Binary, are refused at receipt; and broken
variants of that refusal, each patched in for one test: the scenario of
``tests/integration/test_breaker_findings.py`` that pins the break down must then fail with a
wrong AWS state (both payloads of one concurrency key running under a cap of 1). Any other error
fails the test.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

import sluice.adapters.aws.sqs
from sluice.core.clock import FakeClock
from sluice.features import attributes
from tests.integration import test_breaker_findings as findings
from tests.support.aws import build_stack, moto_session

STRING_KEY = {"DataType": "String", "StringValue": "c"}


@pytest.mark.parametrize(
    "name", ["Sluice-Concurrency-Key", "SLUICE-CONCURRENCY-KEY", "sluice_concurrency_key"]
)
def test_a_catalogue_that_reads_the_lowercase_prefix_only_is_caught(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The check before the fix: only names starting with ``sluice-`` are Sluice's. A misspelt
    concurrency key is read as the producer's own, and both payloads of key c run."""
    monkeypatch.setattr(attributes, "is_sluices", lambda attribute: attribute.startswith(attributes.PREFIX))
    with pytest.raises(AssertionError, match="run under a cap of 1"), moto_session() as session:
        findings.test_a_misspelt_concurrency_key_is_refused_not_run_uncapped(session, name, STRING_KEY)


def test_a_queue_adapter_that_drops_binary_attributes_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The translation before the fix: a Binary attribute is dropped before the catalogue sees it,
    so a Binary ``sluice-concurrency-key`` vanishes and both payloads of key c run."""
    translate = sluice.adapters.aws.sqs._message
    monkeypatch.setattr(
        sluice.adapters.aws.sqs, "_message", lambda raw: replace(translate(raw), binary_attributes={})
    )
    binary = {"DataType": "Binary", "BinaryValue": b"c"}
    with pytest.raises(AssertionError, match="run under a cap of 1"), moto_session() as session:
        findings.test_a_misspelt_concurrency_key_is_refused_not_run_uncapped(
            session, "sluice-concurrency-key", binary
        )


def _send(stack: Any, i: int, attributes: dict[str, Any]) -> None:
    stack.client("sqs").send_message(
        QueueUrl=stack.settings.queue_url,
        MessageBody=json.dumps({"id": f"p{i}"}),
        MessageGroupId=f"g{i}",
        MessageDeduplicationId=f"d{i}",
        MessageAttributes=attributes,
    )


def test_a_binary_run_once_is_dead_lettered_naming_it_and_the_producers_own_run(session: Any) -> None:
    """A Binary ``sluice-once`` is refused with the attribute named, not run as a plain message; a
    Binary attribute of the producer's own, and a name that only looks like Sluice's, still run."""
    stack = build_stack(session, max_concurrency=5, clock=FakeClock())
    _send(stack, 0, {"sluice-once": {"DataType": "Binary", "BinaryValue": b"true"}})
    _send(stack, 1, {"blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01"}})
    _send(stack, 2, {"sluicer-once": {"DataType": "String", "StringValue": "x"}})
    stack.launcher().tick()
    dead_lettered = stack.dlq_messages()
    assert len(dead_lettered) == 1, f"dead-lettered {len(dead_lettered)}; started {stack.inputs()}"
    (dead,) = dead_lettered
    assert json.loads(dead["Body"]) == {"id": "p0"}
    reason = dead["MessageAttributes"]["sluice-error"]["StringValue"]
    assert "sluice-once" in reason and "Binary" in reason, reason
    assert sorted(i["id"] for i in stack.inputs()) == ["p1", "p2"]
