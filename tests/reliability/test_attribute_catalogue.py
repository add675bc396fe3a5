"""Every ``sluice-*`` attribute is input (``sluice.features.attributes``): values drawn for each attribute of
the catalogue, valid and invalid (unicode digits, huge numbers, deep nesting, control characters,
2 KiB strings), on moto through the real launcher and completion.

* a valid value runs (and the healthy messages beside it run);
* an invalid one is dead-lettered with the attribute named in its reason, and the table's items and
  the executions equal those of the same run without it: one DLQ entry more, nothing else;
* a value SQS itself refuses (an empty value, a character outside XML's) is refused at the send by
  ``sqs_rules``, as SQS would; moto would take it.

Which values are valid is written here from docs/configuration.md, independently of the
catalogue's checks (``DOCUMENTED``); a pure property checks the two agree on many more values than
the moto runs can afford. The reference table in docs/configuration.md is the catalogue's own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.core.clock import FakeClock
from sluice.core.events import StatusChange
from sluice.core.model import Message
from sluice.features import attributes
from sluice.features.attributes import CATALOGUE, check_attributes, reference_table
from tests.support.aws import build_stack, moto_session
from tests.support.sqs_rules import sqs_rules

HEALTHY = (("h1", "g1"), ("h2", "g2"))  # and h3, behind the drawn message in its group
DRAWN_KEY = "x"
UNKNOWN = "sluice-concurency-key"  # misspelt: not an attribute Sluice knows
TRUNCATED = "sluice-body-truncated"  # a dead-letter note: dead-lettered whatever its value
VOLATILE = ("started_at", "ended_at", "stamp", "shard")  # wall clock of moto's events; a random shard
E2E = settings(
    max_examples=2, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
PURE = settings(max_examples=150, deadline=None, derandomize=True, database=None)

# -- the documented rules, written independently of the catalogue's checks -------------------------

_ID = re.compile(r"[!-~]{1,128}", re.ASCII)


def _key_like(v: str) -> bool:
    return 0 < len(v.encode("utf-8", "surrogatepass")) <= 1024 and all(
        ord(c) >= 0x20 and ord(c) != 0x7F for c in v
    )


def _awaits(v: str) -> bool:
    if not v.strip():
        return True  # none
    try:
        value = json.loads(v)
    except (ValueError, RecursionError):
        return False
    return (
        isinstance(value, list)
        and all(isinstance(k, str) and _key_like(k) for k in value)
        and len(set(value)) <= 98
    )


def _reason(v: str) -> bool:
    return len(v.encode("utf-8", "surrogatepass")) <= 4096 and all(c in "\t\n\r" or ord(c) >= 0x20 for c in v)


DOCUMENTED: dict[str, Callable[[str], bool]] = {
    "sluice-key": _key_like,
    "sluice-once": lambda v: v.strip().lower() in ("true", "false"),
    "sluice-awaits": _awaits,
    "sluice-on-await-failure": lambda v: v.strip().lower() in ("", "run", "dead-letter"),
    "sluice-concurrency-key": _key_like,
    "sluice-key-ticket": lambda v: re.fullmatch(r"[0-9]{1,18}@[0-9]{1,18}", v, re.ASCII) is not None,
    "sluice-origin-message-id": lambda v: _ID.fullmatch(v) is not None,
    "sluice-lane": lambda v: len(v) <= 20 and re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", v) is not None,
    TRUNCATED: lambda v: re.fullmatch(r"[0-9]{1,10}", v, re.ASCII) is not None,
    "sluice-error": _reason,
    "sluice-source-message-id": lambda v: _ID.fullmatch(v) is not None,
    "sluice-receive-count": lambda v: re.fullmatch(r"[0-9]{1,10}", v, re.ASCII) is not None,
    "sluice-effect-of": lambda v: re.fullmatch(r"[A-Za-z0-9_-]{1,80}", v, re.ASCII) is not None,
    "sluice-effect-index": lambda v: re.fullmatch(r"-1|[0-9]{1,3}", v, re.ASCII) is not None,
    UNKNOWN: lambda v: False,
}
_XML = re.compile(r"[\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]+")


def sqs_takes(v: str) -> bool:
    """SQS takes a string attribute value that is not empty and holds only XML characters."""
    return _XML.fullmatch(v) is not None


# -- values --------------------------------------------------------------------------------------

HOSTILE = [
    "²",
    "1@²",
    "٣@1",
    "１２@3",
    "9" * 5000,
    "-" + "9" * 5000,
    "1e999",
    "NaN",
    "[" * 5000,
    "{" * 64,
    "[[[]]]",
    "[" + "9" * 5000 + "]",
    "a\tb",
    "a\nb",
    "a\x7fb",
    "a\x85b",
    "x" * 2048,
    "é" * 1100,
    " ",
    "not a valid dedup id",
    "@",
    "0@",
    "1@2@3",
    "1" * 19 + "@1",
    "GPU",
    "a--b",
    "-1x",
    json.dumps(["k" * 1025]),
    json.dumps([f"k{i}" for i in range(99)]),
    '{"a": 1}',
    '"h1"',
    "\x00",  # SQS refuses these two
    "a\x01b",
]
SHAPES: dict[str, st.SearchStrategy[str]] = {
    "sluice-key": st.text(st.characters(min_codepoint=0x20, exclude_categories=("Cs",)), min_size=1).map(
        lambda s: f"k-{s}"
    ),
    "sluice-once": st.sampled_from(["true", "false", "TRUE", " False ", "True"]),
    "sluice-awaits": st.lists(st.sampled_from([k for k, _ in HEALTHY]), max_size=2).map(json.dumps),
    "sluice-on-await-failure": st.sampled_from(["run", "dead-letter", "RUN", " Dead-Letter "]),
    "sluice-concurrency-key": st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1),
    "sluice-key-ticket": st.tuples(st.integers(0, 10**18 - 1), st.integers(0, 10**18 - 1)).map(
        lambda t: f"{t[0]}@{t[1]}"
    ),
    "sluice-origin-message-id": st.from_regex(r"[!-~]{1,128}", fullmatch=True),
    "sluice-lane": st.from_regex(r"[a-z][a-z0-9]{0,8}(-[a-z0-9]{1,4})?", fullmatch=True),
    TRUNCATED: st.integers(0, 9_999_999_999).map(str),
    "sluice-error": st.text(st.characters(min_codepoint=0x20, exclude_categories=("Cs",)), min_size=1),
    "sluice-source-message-id": st.uuids().map(str),
    "sluice-receive-count": st.integers(1, 9_999_999_999).map(str),
    "sluice-effect-of": st.from_regex(r"[A-Za-z0-9_-]{1,80}", fullmatch=True),
    "sluice-effect-index": st.integers(-1, 999).map(str),
    UNKNOWN: st.just("k"),
}
NAMES = sorted(SHAPES)
ANY_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)


def values(name: str) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(HOSTILE), SHAPES[name], ANY_TEXT)


def valid(name: str) -> st.SearchStrategy[str]:
    return SHAPES[name].filter(lambda v: DOCUMENTED[name](v) and sqs_takes(v) and v not in ("k-h1", "k-h3"))


def invalid(name: str) -> st.SearchStrategy[str]:
    return values(name).filter(lambda v: sqs_takes(v) and not DOCUMENTED[name](v))


# -- one run -------------------------------------------------------------------------------------


def run_world(attribute: tuple[str, str] | None) -> dict[str, Any]:
    """h1, h2 in their groups and, in a third, the drawn message (if any) then h3; ticks and
    completions until nothing runs. What AWS holds at the end, with message ids and execution names
    written as the key they belong to."""
    with moto_session() as session, sqs_rules(session) as rules:
        stack = build_stack(session, clock=FakeClock(), max_concurrency=10, max_receive_count=1000)
        sent = {key: stack.send({"id": key}, group=group) for key, group in HEALTHY}
        if attribute is not None:
            try:
                sent[DRAWN_KEY] = stack.send({"id": DRAWN_KEY}, group="gx", **dict([attribute]))
            except ClientError as exc:
                return {"refused": exc.response["Error"]["Code"], "count": len(rules.refused)}
        sent["h3"] = stack.send({"id": "h3"}, group="gx")
        launcher = stack.launcher()
        for _ in range(3):
            launcher.tick()
            for execution in stack.executions("RUNNING"):
                event = stack.finish(execution["name"], "SUCCEEDED")
                launcher.on_status_change(StatusChange.from_event(event))
        assert rules.refused == [], rules.refused
        runs = sorted(
            (
                json.loads(
                    stack.client("stepfunctions").describe_execution(executionArn=e["executionArn"])["input"]
                )["id"],
                e["status"],
            )
            for e in stack.executions()
        )
        dlq = [
            (
                m["MessageAttributes"]["sluice-error"]["StringValue"],
                m["MessageAttributes"]["sluice-source-message-id"]["StringValue"],
            )
            for m in stack.dlq_messages()
        ]
        return {
            "executions": runs,
            "items": _items(stack, sent),
            "dlq": [(reason, _by_key(source, sent)) for reason, source in dlq],
            "left": stack.queue_counts(),
        }


def _by_key(message_id: str, sent: dict[str, str]) -> str:
    return next((f"<message of {k}>" for k, m in sent.items() if m == message_id), message_id)


def _items(stack: Any, sent: dict[str, str]) -> list[str]:
    client = stack.client("dynamodb")
    out: list[str] = []
    for page in client.get_paginator("scan").paginate(TableName=stack.settings.table_name):
        for item in page["Items"]:
            text = json.dumps({k: v for k, v in item.items() if k not in VOLATILE}, sort_keys=True)
            for key, message_id in sent.items():
                text = text.replace(message_id, f"<message of {key}>")
            out.append(re.sub(r"-[0-9a-f]{32}\b", "-<name>", text))
    return sorted(out)


@cache
def baseline() -> dict[str, Any]:
    return run_world(None)


# -- the properties ------------------------------------------------------------------------------


def test_the_catalogue_is_every_attribute_sluice_reads() -> None:
    names = {rule.name for rule in CATALOGUE}
    assert names == set(DOCUMENTED) - {UNKNOWN}
    lib = Path(__file__).resolve().parents[2] / "lib" / "sluice"
    read = set()
    for path in lib.rglob("*.py"):
        read |= set(re.findall(r'_ATTRIBUTE = "(sluice-[a-z-]+)"', path.read_text()))
    assert read <= names, f"attributes Sluice names but the catalogue lacks: {read - names}"


def test_the_attribute_reference_in_the_docs_is_the_catalogue() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert reference_table() in docs, "docs/configuration.md: paste attributes.reference_table() there"


@pytest.mark.parametrize("name", NAMES)
def test_the_catalogue_agrees_with_the_documented_rules(name: str) -> None:
    @PURE
    @given(values(name).filter(sqs_takes))
    def agree(value: str) -> None:
        rejected = check_attributes(Message("m", "r", "{}", "g", attributes={name: value}))
        assert (rejected is None) == DOCUMENTED[name](value), (value, rejected)
        if rejected is not None:
            assert rejected.attribute == name and name[:60] in rejected.reason

    agree()


def respelt(name: str) -> st.SearchStrategy[str]:
    """The name in another case, or with ``_`` for some of its ``-``: a name SQS holds apart."""
    flips = st.lists(st.booleans(), min_size=len(name), max_size=len(name))
    return flips.map(
        lambda flip: "".join(
            ("_" if c == "-" else c.upper()) if f else c for c, f in zip(name, flip, strict=True)
        )
    ).filter(lambda spelt: spelt != name)


@pytest.mark.parametrize("name", NAMES)
def test_a_name_spelt_another_way_is_refused_naming_it(name: str) -> None:
    @PURE
    @given(respelt(name), values(name))
    def refused(spelt: str, value: str) -> None:
        rejected = check_attributes(Message("m", "r", "{}", "g", attributes={spelt: value}))
        assert rejected is not None and rejected.attribute == spelt and spelt in rejected.reason, (
            spelt,
            rejected,
        )

    refused()


@pytest.mark.parametrize("name", NAMES)
def test_a_binary_value_is_refused_naming_it(name: str) -> None:
    rejected = check_attributes(Message("m", "r", "{}", "g", binary_attributes={name: "Binary"}))
    assert rejected is not None and rejected.attribute == name and name in rejected.reason, rejected


@pytest.mark.parametrize("name", NAMES)
def test_an_invalid_value_is_dead_lettered_naming_it_and_changes_nothing_else(name: str) -> None:
    @E2E
    @given(invalid(name))
    def dead_lettered(value: str) -> None:
        seen, before = run_world((name, value)), baseline()
        [(reason, source)] = seen["dlq"]
        assert name in reason and source == f"<message of {DRAWN_KEY}>"
        assert {k: v for k, v in seen.items() if k != "dlq"} == {
            k: v for k, v in before.items() if k != "dlq"
        }
        assert before["dlq"] == []

    dead_lettered()


@pytest.mark.parametrize("name", [n for n in NAMES if n not in (UNKNOWN, TRUNCATED)])
def test_a_valid_value_runs(name: str) -> None:
    @E2E
    @given(valid(name))
    def runs(value: str) -> None:
        seen = run_world((name, value))
        assert seen["dlq"] == [] and seen["left"] == (0, 0)
        assert seen["executions"] == sorted([*baseline()["executions"], (DRAWN_KEY, "SUCCEEDED")])

    runs()


def test_a_valid_dead_letter_note_is_still_a_note() -> None:
    seen = run_world((TRUNCATED, "300000"))
    [(reason, _)] = seen["dlq"]
    assert TRUNCATED in reason and "dead-letter note" in reason
    assert seen["executions"] == baseline()["executions"]


def test_a_value_sqs_refuses_is_refused_at_the_send() -> None:
    """moto would take each of these; SQS refuses them, and so does the hook, before Sluice sees one."""
    refused = ["\x00", "a\x01b", "\ufffe", "x\x1fy", "\x0b"]
    with moto_session() as session, sqs_rules(session) as rules:
        stack = build_stack(session, clock=FakeClock())
        for name, value in zip(NAMES, refused * len(NAMES), strict=False):
            assert not sqs_takes(value)
            with pytest.raises(ClientError, match="InvalidParameterValue"):
                stack.send({"id": DRAWN_KEY}, group="gx", **{name: value})
        assert len(rules.refused) == len(NAMES)
        assert stack.queue_counts() == (0, 0)


def test_the_dead_letter_annotations_are_the_adapters() -> None:
    from sluice.adapters.aws import sqs

    assert (sqs.REASON_ATTRIBUTE, sqs.SOURCE_ATTRIBUTE, sqs.RECEIVES_ATTRIBUTE) == (
        attributes.REASON_ATTRIBUTE,
        attributes.SOURCE_ATTRIBUTE,
        attributes.RECEIVES_ATTRIBUTE,
    )
