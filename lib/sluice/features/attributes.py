"""Every message attribute Sluice reads, and the one rule each must pass at receipt.

An attribute is input, the ones Sluice writes itself included: a producer can send any of them. So
``check_attributes`` checks a received message's ``sluice-*`` attributes against ``CATALOGUE``
before anything else reads them (``sluice.launch.per_message``, ``sluice.launch.handover``). A message that fails
is dead-lettered with the attribute named in its reason, and nothing is written to the table for
it; the rest of its batch goes on. Each rule's check is the very function that reads the attribute
later (``keys.parse_ticket``, ``awaits.parse_awaits``, ``parse_origin``, ...), so a message
that passed cannot make a later read raise.

The rules bound every value: digits are ASCII digits (``"²".isdigit()`` is True and ``int("²")``
raises), lengths are bounded, JSON is bounded in size and nesting before it is parsed, and values
Sluice sends again (a re-sent message keeps its attributes; an origin id becomes part of an SQS
deduplication id) hold only what SQS accepts there. An attribute named ``sluice-*`` that is not in
the catalogue is refused too: a misspelt ``sluice-concurency-key`` would otherwise run uncapped. So
is one spelt in another case or with ``_`` for ``-`` (``Sluice-Concurrency-Key``), and one sent as
Binary: SQS names are case-sensitive and the catalogue reads string values only.

The attribute reference in docs/configuration.md is this catalogue (``reference_table``; a test
keeps the two equal).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sluice.core.errors import InvalidPayload
from sluice.core.model import Message
from sluice.core.names import MAX_ORIGIN_LENGTH, NAME_PATTERN, ORIGIN_ATTRIBUTE, ORIGIN_PATTERN
from sluice.core.validation import KEY_ATTRIBUTE, MAX_KEY_BYTES, TRUNCATED_ATTRIBUTE, check_key
from sluice.features.awaits import AWAITS_ATTRIBUTE, ON_FAILURE_ATTRIBUTE, parse_awaits, parse_policy
from sluice.features.effects import EFFECT_INDEX_ATTRIBUTE, EFFECT_OF_ATTRIBUTE
from sluice.features.keys import CONCURRENCY_KEY_ATTRIBUTE, TICKET_ATTRIBUTE, parse_ticket
from sluice.features.lanes import LANE_ATTRIBUTE, MAX_NAME
from sluice.features.lanes import NAME as LANE_NAME
from sluice.features.receipts import ONCE_ATTRIBUTE, parse_once

PREFIX = "sluice-"
# The annotations a dead-letter copy carries (``sluice.adapters.aws.sqs``); a copy redriven to the queue
# carries them still.
REASON_ATTRIBUTE = "sluice-error"
SOURCE_ATTRIBUTE = "sluice-source-message-id"
RECEIVES_ATTRIBUTE = "sluice-receive-count"
MAX_REASON_BYTES = 4_096
_COUNT = re.compile(r"[0-9]{1,10}", re.ASCII)
_INDEX = re.compile(r"-1|[0-9]{1,3}", re.ASCII)
# Text SQS takes in a string attribute (a reason may span lines).
_TEXT = re.compile(r"[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")


def parse_origin(raw: str) -> str:
    """A ``sluice-origin-message-id`` value, checked."""
    if not ORIGIN_PATTERN.fullmatch(raw):
        raise InvalidPayload(
            f"is {raw[:40]!r}{'...' if len(raw) > 40 else ''}: an origin id is 1 to {MAX_ORIGIN_LENGTH} "
            "ASCII letters, digits or punctuation (it becomes part of an SQS deduplication id)"
        )
    return raw


@dataclass(frozen=True, slots=True)
class AttributeRule:
    """One attribute: the check a received value must pass (it returns the value as read, or raises
    ``InvalidPayload`` saying why), the values it takes and what it does (the docs' reference)."""

    name: str
    check: Callable[[str], object]
    value: str
    effect: str
    sluice_writes: bool = False  # Sluice's own: a producer has no reason to set it


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a message's attribute was refused at receipt."""

    attribute: str
    reason: str

    def error(self) -> InvalidPayload:
        """The refusal as the launcher dead-letters it: no key (nothing is recorded on a payload a
        forged attribute may name)."""
        return InvalidPayload(self.reason)


def _key(name: str) -> Callable[[str], object]:
    return lambda raw: check_key(raw, source=f"message attribute {name!r}")


def _matching(pattern: re.Pattern[str], shape: str) -> Callable[[str], object]:
    def check(raw: str) -> str:
        if not pattern.fullmatch(raw):
            raise InvalidPayload(f"is {raw[:40]!r}{'...' if len(raw) > 40 else ''}: {shape}")
        return raw

    return check


def _lane(raw: str) -> str:
    if len(raw) > MAX_NAME or not LANE_NAME.fullmatch(raw):
        raise InvalidPayload(
            f"is {raw[:40]!r}: a lane is at most {MAX_NAME} lowercase letters, digits and single dashes, "
            "starting with a letter"
        )
    return raw


def _reason(raw: str) -> str:
    if len(raw.encode("utf-8", "surrogatepass")) > MAX_REASON_BYTES or not _TEXT.fullmatch(raw):
        raise InvalidPayload(f"is over {MAX_REASON_BYTES:,} bytes or holds characters SQS refuses")
    return raw


CATALOGUE: tuple[AttributeRule, ...] = (
    AttributeRule(
        KEY_ATTRIBUTE,
        _key(KEY_ATTRIBUTE),
        f"the payload key: at most {MAX_KEY_BYTES:,} bytes of UTF-8 without control characters",
        "set by `sluice enqueue`; the key without reading the body",
    ),
    AttributeRule(
        ONCE_ATTRIBUTE,
        parse_once,
        "`true` or `false` (any case)",
        "`true`: run the key successfully at most once: a message whose key already has a SUCCEEDED "
        "run is deleted and counted as `already_done`, not started (`sluice enqueue --once`; "
        "[protocol.md](protocol.md#receipts-and-run-once-keys)). `false`, or none: the message runs "
        "as usual",
    ),
    AttributeRule(
        AWAITS_ATTRIBUTE,
        parse_awaits,
        'a flat JSON array of keys, e.g. `["scene-1", "scene-2"]` (at most 98, each a valid key other '
        "than the payload's own)",
        "start only once every key named has SUCCEEDED (a SUCCEEDED receipt, `succeeded_by`); until "
        "then the message is parked in the table and deleted from the queue (`sluice enqueue --after "
        "KEY`, repeatable; [protocol.md](protocol.md#awaits))",
    ),
    AttributeRule(
        ON_FAILURE_ATTRIBUTE,
        parse_policy,
        "`run` or `dead-letter` (the default)",
        "when an awaited key ends FAILED, TIMED_OUT or ABORTED (and has never SUCCEEDED): "
        "`dead-letter` sends the waiter to the DLQ with `awaited KEY ended FAILED`; `run` starts it "
        "once every awaited key has ended, whichever way (`sluice enqueue --on-await-failure run`)",
    ),
    AttributeRule(
        CONCURRENCY_KEY_ATTRIBUTE,
        _key(CONCURRENCY_KEY_ATTRIBUTE),
        f"a key: a non-empty string of at most {MAX_KEY_BYTES:,} bytes of UTF-8 without control characters",
        "at most the key's cap of payloads with this attribute run at once (`SLUICE_KEY_CONCURRENCY`, "
        "or the key's own cap); the others are parked in the key's line and deleted from the queue, "
        "and start oldest-first as the key's runs end (`sluice enqueue --concurrency-key KEY` or "
        "`--concurrency-key-field FIELD`; [protocol.md](protocol.md#concurrency-keys)). Without it a "
        "payload has no key cap",
    ),
    AttributeRule(
        TICKET_ATTRIBUTE,
        parse_ticket,
        "`<ticket>@<ms>`, each 1 to 18 ASCII digits",
        "set on a waiter Sluice sends back from a key's line (its place, which lets its claim pass "
        "the line). Do not set it yourself: a copied ticket lets a payload pass the line, never the cap",
        sluice_writes=True,
    ),
    AttributeRule(
        ORIGIN_ATTRIBUTE,
        parse_origin,
        "1 to 128 ASCII letters, digits or punctuation",
        "set on a message Sluice sends back to the queue (a parked one, an effect): the id its "
        "execution name derives from, and the stem of the send's deduplication id",
        sluice_writes=True,
    ),
    AttributeRule(
        LANE_ATTRIBUTE,
        _lane,
        f"a lane name (at most {MAX_NAME} lowercase letters, digits and dashes)",
        "the lane a message was received in, so that a parked message goes back to that lane's "
        "queue; on a stack with lanes the queue it arrives in overrides it",
        sluice_writes=True,
    ),
    AttributeRule(
        TRUNCATED_ATTRIBUTE,
        _matching(_COUNT, "a size in bytes, ASCII digits"),
        "the original body's size in bytes",
        "marks a dead-letter note that stands in for a body too big to keep: redriven, it is "
        "dead-lettered again (send the original payload)",
        sluice_writes=True,
    ),
    AttributeRule(
        REASON_ATTRIBUTE,
        _reason,
        f"text, at most {MAX_REASON_BYTES:,} bytes",
        "on a dead-letter copy: why it was dead-lettered. Ignored on the queue (a redriven copy)",
        sluice_writes=True,
    ),
    AttributeRule(
        SOURCE_ATTRIBUTE,
        _matching(ORIGIN_PATTERN, "a message id is 1 to 128 ASCII letters, digits or punctuation"),
        "the source message's id (1 to 128 ASCII letters, digits or punctuation)",
        "on a dead-letter copy: the message it copies. Ignored on the queue",
        sluice_writes=True,
    ),
    AttributeRule(
        RECEIVES_ATTRIBUTE,
        _matching(_COUNT, "a receive count is 1 to 10 ASCII digits"),
        "1 to 10 ASCII digits",
        "on a dead-letter copy: how often the source message was received. Ignored on the queue",
        sluice_writes=True,
    ),
    AttributeRule(
        EFFECT_OF_ATTRIBUTE,
        _matching(NAME_PATTERN, "an execution name is 1 to 80 of A-Z a-z 0-9 _ -"),
        "an execution name",
        "on a dead-lettered effect: the execution whose output named it. Ignored on the queue",
        sluice_writes=True,
    ),
    AttributeRule(
        EFFECT_INDEX_ATTRIBUTE,
        _matching(_INDEX, "an effect's index is -1 or 1 to 3 ASCII digits"),
        "the effect's place in the output's list (-1: the whole list)",
        "on a dead-lettered effect: which one. Ignored on the queue",
        sluice_writes=True,
    ),
)
RULES: dict[str, AttributeRule] = {rule.name: rule for rule in CATALOGUE}


def is_sluices(name: str) -> bool:
    """Whether an attribute name is Sluice's: ``sluice-*`` in any case, ``_`` read as ``-``. SQS
    names are case-sensitive, so ``Sluice-Concurrency-Key`` is not ``sluice-concurrency-key``: it is
    refused, not read as the producer's own (its payload would run uncapped)."""
    return name.casefold().replace("_", "-").startswith(PREFIX)


def check_attributes(message: Message) -> Rejection | None:
    """The first of the message's Sluice attributes (``is_sluices``) that breaks its rule, is no
    attribute Sluice knows by its exact name, or has no string value (SQS's Binary), or None when
    all pass. Other attributes are the producer's own."""
    for name in sorted({*message.attributes, *message.binary_attributes}):
        if not is_sluices(name):
            continue
        rule = RULES.get(name)
        if rule is None:
            return Rejection(
                name,
                f"message attribute {name[:64]!r} is not one Sluice knows (attributes named {PREFIX}* "
                "in any case, or with _ for -, are Sluice's; see docs/configuration.md)",
            )
        if name in message.binary_attributes:
            data_type = message.binary_attributes[name]
            return Rejection(
                name,
                f"message attribute {name!r} is of data type {data_type[:64]!r}: Sluice reads it only "
                "as String or Number",
            )
        try:
            rule.check(message.attributes[name])
        except (InvalidPayload, ValueError, RecursionError) as exc:
            reason = exc.reason if isinstance(exc, InvalidPayload) else str(exc)
            if name not in reason:
                reason = f"message attribute {name!r} {reason}"
            return Rejection(name, reason)
    return None


def reference_table() -> str:
    """The attribute reference of docs/configuration.md, as Markdown."""
    rows = ["| attribute | value | effect |", "| --- | --- | --- |"]
    for rule in CATALOGUE:
        effect = ("Sluice's own: " if rule.sluice_writes else "") + rule.effect
        rows.append(f"| `{rule.name}` | {rule.value} | {effect}. Malformed: dead-lettered with the reason |")
    return "\n".join(rows)
