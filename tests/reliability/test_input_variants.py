"""Broken variants of the attribute checks (breaks 6, 7 and 8), each patched in for one test: the
scenario of ``tests/integration/test_input_breaks_moto.py`` that pins the break down must then
fail with a broken promise (a tick or completion that crashes on bad input, a message lost) or a
wrong AWS state. Any other error fails the test.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

import sluice.adapters.aws.sqs
import sluice.core.names
import sluice.core.records
import sluice.features.attributes
import sluice.features.awaits
import sluice.features.keys
import sluice.launch.handover
from sluice.core.errors import InvalidPayload
from sluice.features import attributes
from sluice.features.awaits import AWAITS_ATTRIBUTE, check_awaits
from sluice.features.keys import TICKET_ATTRIBUTE
from tests.integration import test_input_breaks_moto as breaks
from tests.support.aws import moto_session
from tests.support.sqs_rules import sqs_rules


def test_an_origin_rule_on_length_alone_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rule before break 6: any origin of 1 to 128 characters. The forged one waits in a key's
    line, is sent back when the key frees, and runs under the forged origin instead of being
    dead-lettered (with the re-send's raw deduplication id too, the completion fails: below)."""
    monkeypatch.setattr(sluice.core.names, "ORIGIN_PATTERN", re.compile(r".{1,128}", re.DOTALL))
    monkeypatch.setattr(sluice.features.attributes, "ORIGIN_PATTERN", re.compile(r".{1,128}", re.DOTALL))
    with pytest.raises(AssertionError), moto_session() as session, sqs_rules(session) as rules:
        breaks.test_a_forged_origin_id_is_dead_lettered_at_receipt_and_the_completion_and_ticks_go_on(
            session, rules, "key line"
        )


def test_the_origin_rule_and_the_resend_before_break_6_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both as they were: SQS refuses the re-send's deduplication id, and the completion fails."""
    monkeypatch.setattr(sluice.core.names, "ORIGIN_PATTERN", re.compile(r".{1,128}", re.DOTALL))
    monkeypatch.setattr(sluice.features.attributes, "ORIGIN_PATTERN", re.compile(r".{1,128}", re.DOTALL))
    monkeypatch.setattr(
        sluice.adapters.aws.sqs, "_dedup_stem", lambda message_id, limit=90: message_id[:limit]
    )
    with (
        pytest.raises(AssertionError, match="crashed on bad input"),
        moto_session() as session,
        sqs_rules(session) as rules,
    ):
        try:
            breaks.test_a_forged_origin_id_is_dead_lettered_at_receipt_and_the_completion_and_ticks_go_on(
                session, rules, "key line"
            )
        finally:
            assert rules.refused, "SQS refused no deduplication id"


def test_a_ticket_read_with_unicode_digits_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read before break 7: ``str.isdigit`` takes "²", which ``int`` refuses. Since a ``landed``
    note's date is no longer read (explorer seed 1206004492), the note no longer crashes a wake; the
    forged ticket still passes the line, and its message runs before the one that waited."""

    def isdigit_ticket(raw: str) -> str:
        ticket, at, ms = raw.partition("@")
        if not (ticket.isdigit() and at and ms.isdigit() and len(raw) <= 40):
            raise InvalidPayload(f"{TICKET_ATTRIBUTE!r} is {raw!r}, not <ticket>@<ms>")
        return raw

    monkeypatch.setattr(sluice.features.keys, "parse_ticket", isdigit_ticket)
    monkeypatch.setattr(sluice.core.records, "sent_at", lambda entry: int(entry.partition("@")[2]) / 1000)
    rule = attributes.RULES[TICKET_ATTRIBUTE]
    monkeypatch.setitem(attributes.RULES, TICKET_ATTRIBUTE, replace(rule, check=isdigit_ticket))
    with (
        pytest.raises(AssertionError, match=r"\['b-"),
        moto_session() as session,
        sqs_rules(session) as rules,
    ):
        breaks.test_a_forged_ticket_with_a_unicode_digit_is_dead_lettered_and_the_key_goes_on(session, rules)


def test_awaits_read_without_a_depth_guard_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read before break 8: ``json.loads`` with ValueError caught, not RecursionError, and no
    check at receipt: the batch's read-ahead raises and the whole batch stays in flight."""

    def unguarded(raw: str, *, key: str | None = None) -> tuple[str, ...]:
        try:
            value = json.loads(raw)
        except ValueError:
            raise InvalidPayload(f"{AWAITS_ATTRIBUTE} is not JSON", key=key) from None
        return check_awaits(value, key=key)

    monkeypatch.setattr(sluice.features.awaits, "parse_awaits", unguarded)
    rule = attributes.RULES[AWAITS_ATTRIBUTE]
    monkeypatch.setitem(attributes.RULES, AWAITS_ATTRIBUTE, replace(rule, check=lambda raw: raw))
    with (
        pytest.raises(AssertionError, match="crashed on bad input"),
        moto_session() as session,
        sqs_rules(session) as rules,
    ):
        breaks.test_awaits_nested_past_the_recursion_limit_dead_letters_that_message_and_its_batch_mates_run(
            session, rules
        )


def test_a_resend_that_uses_the_raw_id_in_its_deduplication_id_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A line holding a forged origin from before the receipt check: sent back with the raw id in
    its deduplication id, SQS refuses it and the completion that wakes the line fails."""
    monkeypatch.setattr(
        sluice.adapters.aws.sqs, "_dedup_stem", lambda message_id, limit=90: message_id[:limit]
    )
    with (
        pytest.raises(AssertionError, match="crashed on bad input"),
        moto_session() as session,
        sqs_rules(session) as rules,
    ):
        breaks.test_a_waiter_parked_with_a_forged_origin_before_the_check_is_sent_back_and_then_dead_lettered(
            session, rules
        )


def test_a_hand_over_that_skips_the_receipt_check_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The completion's hand-over claims a plain message without the catalogue: a forged origin
    names its execution, and it runs."""
    monkeypatch.setattr(sluice.launch.handover, "check_attributes", lambda message: None)
    with pytest.raises(AssertionError), moto_session() as session, sqs_rules(session) as rules:
        breaks.test_a_plain_message_with_a_forged_origin_does_not_ride_a_release(session, rules)
