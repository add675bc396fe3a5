import pytest

from sluice.adapters.aws.ssm import parse_max
from sluice.core.errors import ConfigurationError
from sluice.launch.settings import DuplicatePolicy, Settings


def test_defaults_and_overrides():
    s = Settings.from_env({"SLUICE_MAX_CONCURRENCY": "25", "SLUICE_DUPLICATE_POLICY": "DEFER"})
    assert s.max_concurrency == 25
    assert s.duplicate_policy is DuplicatePolicy.DEFER
    assert Settings.from_env({}).max_concurrency == 10
    assert Settings.from_env({}).retention_seconds == 30 * 86_400


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLUICE_MAX_CONCURRENCY": "ten"}, "SLUICE_MAX_CONCURRENCY='ten' is not a whole number"),
        ({"SLUICE_MAX_CONCURRENCY": "-1"}, "SLUICE_MAX_CONCURRENCY=-1 must be at least 0"),
        ({"SLUICE_DUPLICATE_POLICY": "drop"}, "use one of suppress, defer"),
        ({"SLUICE_CLAIM_TIMEOUT_SECONDS": "0"}, "must be at least 1"),
        # The second look and reconciliation trust an answer only this long after: below the
        # staleness bound a stale RUNNING answer suppresses a message that should run (promise 3).
        (
            {"SLUICE_CONSISTENCY_WINDOW_SECONDS": "0"},
            "SLUICE_CONSISTENCY_WINDOW_SECONDS=0 must be at least 60",
        ),
        ({"SLUICE_CONSISTENCY_WINDOW_SECONDS": "59"}, "must be at least 60"),
        ({"SLUICE_CONSISTENCY_WINDOW_SECONDS": "43201"}, "must be at most 43,200"),
        ({"SLUICE_SEMAPHORES": "db"}, "SLUICE_SEMAPHORES: 'db' is not name=limit"),
        ({"SLUICE_SEMAPHORES": "=3"}, "'=3' is not name=limit"),
        ({"SLUICE_SEMAPHORES": "db=five"}, "limit of 'db' must be 0 to 10000, got 'five'"),
        ({"SLUICE_SEMAPHORES": "db=-1"}, "limit of 'db' must be 0 to 10000"),
        ({"SLUICE_SEMAPHORES": "db=10001"}, "limit of 'db' must be 0 to 10000"),
        ({"SLUICE_SEMAPHORES": "db=1,db=2"}, "'db' is given twice"),
        ({"SLUICE_SEMAPHORES": "a b=1"}, "bad semaphore name 'a b'"),
        ({"SLUICE_SEMAPHORES": "a#b=1"}, "bad semaphore name"),
    ],
)
def test_bad_settings_are_named(env, message):
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_env(env)


def test_start_concurrency_is_auto_unless_a_whole_number_is_given():
    assert Settings.from_env({}).start_concurrency is None  # auto: sluice.primitives.fanout.start_width
    assert Settings.from_env({"SLUICE_START_CONCURRENCY": " Auto "}).start_concurrency is None
    assert Settings.from_env({"SLUICE_START_CONCURRENCY": "25"}).start_concurrency == 25
    assert Settings().start_concurrency == 1  # the class itself: one after another


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("0", "SLUICE_START_CONCURRENCY=0 must be at least 1"),
        ("-1", "SLUICE_START_CONCURRENCY=-1 must be at least 1"),
        ("abc", "SLUICE_START_CONCURRENCY='abc' is not a whole number"),
        ("²", "SLUICE_START_CONCURRENCY='²' is not a whole number"),
        ("1.5", "SLUICE_START_CONCURRENCY='1.5' is not a whole number"),
    ],
)
def test_bad_start_concurrency_is_refused_naming_it(raw, message):
    with pytest.raises(ConfigurationError, match=message) as refused:
        Settings.from_env({"SLUICE_START_CONCURRENCY": raw})
    assert "use auto, or a whole number from 1" in str(refused.value)


def test_semaphore_limits_are_read_in_order():
    s = Settings.from_env({"SLUICE_SEMAPHORES": " db = 5 ,api=0, , reports=10000"})
    assert s.semaphore_limits == (("db", 5), ("api", 0), ("reports", 10000))
    assert Settings.from_env({}).semaphore_limits == ()


def test_require_names_every_missing_setting():
    with pytest.raises(ConfigurationError, match="SLUICE_QUEUE_URL, SLUICE_TABLE_NAME"):
        Settings().require("queue_url", "table_name")


@pytest.mark.parametrize("raw", ["abc", "-3", "1.5", ""])
def test_max_values_that_are_refused(raw):
    with pytest.raises(ConfigurationError, match="MAX must be"):
        parse_max(raw, source="/p")


def test_max_zero_is_a_pause_not_an_error():
    assert parse_max(" 0 ", source="/p") == 0
