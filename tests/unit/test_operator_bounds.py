"""The bounds of operator input: MAX and a key's cap at most 10,000, whole numbers in ASCII digits
only (``"²".isdigit()`` is true in Python), and input read item by item."""

from __future__ import annotations

import json

import pytest

from sluice.adapters.aws.ssm import parse_max
from sluice.core.errors import ConfigurationError
from sluice.core.validation import MAX_CEILING, MaxAboveCeiling
from sluice.enqueue import read_items
from sluice.features.lanes import parse_lanes
from sluice.launch.settings import Settings
from tests.unit import test_stack_config as stack_config

HUGE = "1" + "0" * 5000

NOT_ASCII = ["²", "١٠", "٣", "𝟓", "1²"]


@pytest.mark.parametrize("digits", NOT_ASCII)
def test_lanes_with_non_ascii_digits_are_a_configuration_error(digits):
    with pytest.raises(ConfigurationError, match="must be a whole number"):
        parse_lanes(f"gpu:{digits}", 5)
    with pytest.raises(ConfigurationError, match="must be a whole number"):
        parse_lanes(f"gpu:2:{digits}", 5)
    with pytest.raises(ConfigurationError, match="must be a whole number"):
        parse_lanes(f"gpu:2:1:{digits}", 5)


@pytest.mark.parametrize("digits", NOT_ASCII)
def test_semaphore_limits_with_non_ascii_digits_are_a_configuration_error(digits):
    with pytest.raises(ConfigurationError, match="SLUICE_SEMAPHORES: limit of 'db' must be 0 to 10000"):
        Settings.from_env({"SLUICE_SEMAPHORES": f"db={digits}"})


def test_a_semaphore_limit_of_five_thousand_digits_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="must be 0 to 10000"):
        Settings.from_env({"SLUICE_SEMAPHORES": f"db={HUGE}"})


@pytest.mark.parametrize("name", ["SLUICE_MAX_CONCURRENCY", "SLUICE_KEY_CONCURRENCY"])
@pytest.mark.parametrize("raw", ["10001", HUGE, *NOT_ASCII])
def test_max_and_key_concurrency_settings_stop_at_the_ceiling(name, raw):
    with pytest.raises(ConfigurationError, match=name):
        Settings.from_env({name: raw})


def test_the_ceiling_itself_is_a_valid_setting():
    s = Settings.from_env({"SLUICE_MAX_CONCURRENCY": "10000", "SLUICE_KEY_CONCURRENCY": "10000"})
    assert (s.max_concurrency, s.key_concurrency) == (MAX_CEILING, MAX_CEILING) == (10_000, 10_000)


@pytest.mark.parametrize("raw", ["10001", "5000000000000", "99999999999999999999999", HUGE, "010001"])
def test_a_max_parameter_above_the_ceiling_is_refused_as_such(raw):
    with pytest.raises(MaxAboveCeiling, match="at most 10,000"):
        parse_max(raw, source="/p")


@pytest.mark.parametrize("raw", [*NOT_ASCII, "1_000", "+5", "-3", "1.5", "abc", ""])
def test_a_max_parameter_in_other_than_ascii_digits_is_not_a_number(raw):
    with pytest.raises(ConfigurationError, match="MAX must be a whole number") as caught:
        parse_max(raw, source="/p")
    assert not isinstance(caught.value, MaxAboveCeiling)


def test_max_values_up_to_the_ceiling_are_read():
    assert parse_max(" 10000 ", source="/p") == 10_000
    assert parse_max("00007", source="/p") == 7


# -- sluice enqueue: one item per element, whatever Python can read ----------------------------------


def test_an_array_is_split_into_its_elements_even_when_one_cannot_be_read():
    text = '[ {"id": "a"} ,{"id": "b", "s": "],[{\\""}, {"n": ' + HUGE + "},\n[], 7 ]"
    items = list(read_items(text))
    assert [i.where for i in items] == ["item 1", "item 2", "item 3", "item 4", "item 5"]
    assert json.loads(items[0].body) == {"id": "a"}
    assert json.loads(items[1].body) == {"id": "b", "s": '],[{"'}
    assert items[2].body == '{"n": ' + HUGE + "}"
    assert (items[3].body, items[4].body) == ("[]", "7")


def test_a_value_that_is_not_one_whole_json_value_is_read_as_json_lines():
    text = '{"n": ' + HUGE + '}\n{"id": "b"}'
    assert [i.where for i in read_items(text)] == ["line 1", "line 2"]
    assert [i.where for i in read_items("[1, 2\n[3]")] == ["line 1", "line 2"]
    assert [i.where for i in read_items('{"n": ' + HUGE + "\n}")] == ["line 1"]
    assert [i.body for i in read_items("[]")] == []


# -- the stack's parameters: keyConcurrency stops at maxConcurrency's ceiling --------------------------


@pytest.mark.skipif(stack_config.NODE is None, reason="node is not installed (osls needs it too)")
def test_key_concurrency_stops_at_max_concurrencys_ceiling():
    assert stack_config.config(keyConcurrency=10000, maxConcurrency=10000)["keyConcurrency"] == 10000
    assert "keyConcurrency must be between 1 and 10000" in stack_config.refusal(keyConcurrency=10001)
    assert "maxConcurrency must be between 1 and 10000" in stack_config.refusal(maxConcurrency=10001)
    assert "keyConcurrency must be a whole number" in stack_config.refusal(keyConcurrency="²")
