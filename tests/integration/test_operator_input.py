"""Operator input Sluice refuses before any AWS call (exit 2, the option named), a MAX above the
ceiling that never crashes a tick, and ``sluice enqueue`` of an array or object with an item Python
cannot read: the bad item named, the others sent."""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import Any

import pytest

from handlers import _shared
from sluice.adapters.aws.ssm import SsmMax, changed_at
from sluice.core.clock import FakeClock
from sluice.core.limits import MaxReading
from sluice.core.model import Outcome
from tests.support.aws import build_stack
from tests.support.cli import parameter, receive_all, sluice, use_env

HUGE = "1" + "0" * 5000  # a number Python will not read (more than 4,300 digits)


@pytest.fixture
def env(stack, monkeypatch):
    use_env(monkeypatch, stack, SLUICE_MAX_CONCURRENCY="5")
    _shared.reset()
    yield stack
    _shared.reset()


@pytest.fixture
def calls(env):
    """Every AWS call made by a client the session creates from now on, by operation."""
    counted: Counter = Counter()

    def hook(model: Any, **_: Any) -> None:
        counted[model.name] += 1

    env.session.events.register("before-call.*.*", hook)
    yield counted
    env.session.events.unregister("before-call.*.*", hook)


def cli(env, capsys, *argv):
    return sluice(capsys, *argv, session=env.session)


def payload_file(tmp_path, text: str):
    path = tmp_path / "in.json"
    path.write_text(text)
    return path


# -- refused before any AWS call --------------------------------------------------------------------


def test_the_call_counter_sees_the_cli_calls(env, capsys, calls):
    """The control: a valid command's calls are counted, so zero below means none was made."""
    assert cli(env, capsys, "set-max", "10000", "--key", "k").code == 0
    assert calls["UpdateItem"] >= 1
    assert cli(env, capsys, "set-max", "3").code == 0
    assert calls["PutParameter"] == 1 and parameter(env) == "3"


@pytest.mark.parametrize(
    "argv",
    [
        ["set-max", "10001"],
        ["set-max", "5000000000000"],
        ["set-max", "99999999999999999999999"],
        ["set-max", HUGE],
        ["set-max", "10001", "--lane", "default"],
        ["set-max", "10001", "--key", "tenant"],
    ],
    ids=["10001", "5e12", "1e23", "5001-digits", "lane", "key"],
)
def test_a_max_or_a_key_cap_above_the_ceiling_is_refused(env, capsys, calls, argv):
    run = cli(env, capsys, *argv)
    assert run.code == 2
    assert "argument N:" in run.err and "at most 10,000" in run.err
    assert "Traceback" not in run.err
    assert calls == Counter()
    assert parameter(env) == "5"


@pytest.mark.parametrize("timeout", ["nan", "inf", "-5", "0", "-inf", "ten"])
def test_a_wait_timeout_that_is_not_a_positive_number_is_refused(env, capsys, calls, timeout):
    run = cli(env, capsys, "wait", "p", f"--timeout={timeout}")
    assert run.code == 2
    assert "argument --timeout:" in run.err
    assert calls == Counter()


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["set-max", "3", "--key", ""], "--key"),
        (["set-max", "3", "--lane", ""], "--lane"),
        (["enqueue", "FILE", "--concurrency-key", ""], "--concurrency-key"),
        (["enqueue", "FILE", "--concurrency-key-field", ""], "--concurrency-key-field"),
        (["enqueue", "FILE", "--key-field", ""], "--key-field"),
        (["enqueue", "FILE", "--group-by", ""], "--group-by"),
        (["enqueue", "FILE", "--key-field", "  "], "--key-field"),
    ],
    ids=["key", "lane", "concurrency-key", "concurrency-key-field", "key-field", "group-by", "blank"],
)
def test_an_empty_key_or_field_is_refused(env, capsys, calls, tmp_path, argv, option):
    path = payload_file(tmp_path, json.dumps({"id": "a", "": "x"}))
    run = cli(env, capsys, *[str(path) if a == "FILE" else a for a in argv])
    assert run.code == 2
    assert f"argument {option}:" in run.err and "empty" in run.err
    assert calls == Counter()
    assert env.queue_counts() == (0, 0)


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["semaphore", "set", "db", "١٠"], "N"),
        (["semaphore", "set", "db", HUGE], "N"),
        (["set-max", "²"], "N"),
        (["dlq", "list", "--limit", "0"], "--limit"),
        (["dlq", "list", "--limit", "-3"], "--limit"),
        (["dlq", "list", "--width", "0"], "--width"),
        (["tick", "--time-limit", "nan"], "--time-limit"),
        (["tick", "--time-limit", "-1"], "--time-limit"),
        (["enqueue", "FILE", "--pointer-threshold", "١٠"], "--pointer-threshold"),
    ],
    ids=[
        "arabic-limit",
        "huge-limit",
        "superscript-max",
        "limit-0",
        "limit-neg",
        "width-0",
        "nan",
        "neg",
        "threshold",
    ],
)
def test_other_numbers_out_of_their_range_are_refused(env, capsys, calls, tmp_path, argv, option):
    path = payload_file(tmp_path, json.dumps({"id": "a"}))
    run = cli(env, capsys, *[str(path) if a == "FILE" else a for a in argv])
    assert run.code == 2
    assert f"argument {option}:" in run.err and "Traceback" not in run.err and len(run.err) < 1_000
    assert calls == Counter()


# -- break 9: a MAX above the ceiling in SSM never crashes a tick -----------------------------------


def _six_payloads(env) -> None:
    for i in range(6):
        env.send({"id": f"p{i}"}, group=f"p{i}")


def _over_ceiling(env) -> None:
    env.client("ssm").put_parameter(Name=env.settings.max_parameter, Value="5000000000000", Overwrite=True)


def test_a_max_above_the_ceiling_keeps_the_limit_in_force(env, capsys, caplog):
    _six_payloads(env)
    assert cli(env, capsys, "set-max", "2").code == 0
    warm = env.launcher(max_cache_seconds=0)
    assert warm.tick().n(Outcome.STARTED) == 2
    _over_ceiling(env)  # written by hand: the CLI refuses it

    with caplog.at_level(logging.ERROR, logger="sluice.max"):
        summary = warm.tick()  # reconciles, then admits: neither dies
    assert summary.limit == 2 and summary.n(Outcome.STARTED) == 0  # the MAX in force stays
    cold = env.launcher(max_cache_seconds=0)  # a new container: it never read a valid MAX
    assert cold.tick().n(Outcome.STARTED) == 0
    assert len(env.running()) == 2 and env.runtime().store().ledger().in_force == 2
    refused = [r for r in caplog.records if r.getMessage().startswith("MAX parameter refused")]
    assert (
        refused
        and "at most 10,000" in refused[0].getMessage()
        and "MAX in force stays" in refused[0].getMessage()
    )
    assert env.queue_counts()[0] == 4  # the others wait for a valid MAX or an end

    assert cli(env, capsys, "set-max", "4").code == 0  # the operator repairs it
    assert cold.tick().n(Outcome.STARTED) == 2
    assert len(env.running()) == 4


def test_broken_variant_a_kept_default_stamped_with_the_refused_change_undoes_the_limit(
    env, capsys, monkeypatch
):
    """Keep the deployed default, but stamp it with the refused value's change time: a cold
    container then puts 5 in force over the operator's 2, and 5 run."""

    def kept_as_new(self: SsmMax, parameter: dict[str, Any], reason: str) -> MaxReading:
        return MaxReading(self.default, changed_at(parameter), int(parameter.get("Version", 0)))

    _six_payloads(env)
    assert cli(env, capsys, "set-max", "2").code == 0
    assert env.launcher(max_cache_seconds=0).tick().n(Outcome.STARTED) == 2
    _over_ceiling(env)
    monkeypatch.setattr(SsmMax, "_refused", kept_as_new)
    env.launcher(max_cache_seconds=0).tick()
    assert len(env.running()) == 5  # more than the MAX the operator set: caught


# -- break 10: an array or object with an item Python cannot read ----------------------------------


def test_an_array_with_a_huge_number_sends_the_other_items(env, capsys, calls, tmp_path):
    text = '[{"id": "a"},\n {"id": "big", "n": ' + HUGE + '},\n {"id": "c"}]'
    run = cli(env, capsys, "enqueue", payload_file(tmp_path, text))
    assert run.code == 1
    assert "item 2: a number has more than 4,300 digits" in run.err and "Traceback" not in run.err
    assert run.out.strip() == "sent 2 of 3 payloads; 1 refused (see above)"
    assert sorted(json.loads(m["Body"])["id"] for m in receive_all(env)) == ["a", "c"]


def test_broken_variant_an_array_read_as_json_lines_loses_its_valid_items(env, capsys, tmp_path, monkeypatch):
    """Without the split by structure, an array Python cannot build whole is read line by line:
    every line is refused, the valid items with them."""
    monkeypatch.setattr("sluice.enqueue._one_value", lambda text: False)
    text = '[{"id": "a"},\n {"id": "big", "n": ' + HUGE + '},\n {"id": "c"}]'
    run = cli(env, capsys, "enqueue", payload_file(tmp_path, text))
    assert run.out.strip() == "sent 0 of 3 payloads; 3 refused (see above)"
    assert env.queue_counts() == (0, 0)  # the valid a and c were lost: caught


def test_an_array_with_a_deeply_nested_item_sends_the_other_items(env, capsys, tmp_path):
    text = json.dumps([{"id": "a"}, {"id": "deep"}, {"id": "c"}]).replace(
        '{"id": "deep"}', '{"id": "deep", "x": ' + "[" * 5000 + "]" * 5000 + "}"
    )
    run = cli(env, capsys, "enqueue", payload_file(tmp_path, text))
    assert run.code == 1
    assert "item 2: JSON is nested deeper than" in run.err
    assert sorted(json.loads(m["Body"])["id"] for m in receive_all(env)) == ["a", "c"]


def test_an_object_with_a_huge_number_is_refused_cleanly(env, capsys, tmp_path):
    text = '{\n  "id": "big",\n  "n": ' + HUGE + "\n}\n"
    run = cli(env, capsys, "enqueue", payload_file(tmp_path, text))
    assert run.code == 1
    assert "line 1: a number has more than 4,300 digits" in run.err and "Traceback" not in run.err
    assert run.out.strip() == "sent 0 of 1 payloads; 1 refused (see above)"
    assert env.queue_counts() == (0, 0)


def test_json_lines_whose_first_line_holds_a_huge_number_send_the_others(env, capsys, tmp_path):
    text = '{"id": "big", "n": ' + HUGE + '}\n{"id": "b"}\n{"id": "c"}\n'
    run = cli(env, capsys, "enqueue", payload_file(tmp_path, text))
    assert run.code == 1
    assert "line 1: a number has more than 4,300 digits" in run.err
    assert sorted(json.loads(m["Body"])["id"] for m in receive_all(env)) == ["b", "c"]


def test_a_lane_max_above_the_ceiling_in_the_table_falls_back_to_the_configured_one(session):
    stack = build_stack(session, clock=FakeClock(), max_concurrency=5, lanes="gpu:2:1,default:10")
    for i in range(4):
        stack.send({"id": f"gpu-{i}"}, group=f"gpu-{i}", lane="gpu")
    stack.client("dynamodb").put_item(  # written by hand: the CLI refuses it
        TableName=stack.settings.table_name,
        Item={"pk": {"S": "LANE#gpu"}, "max": {"N": "5000000000000"}, "changed_at": {"N": "1"}},
    )
    assert stack.launcher().tick().n(Outcome.STARTED) == 2  # gpu's configured MAX
    assert stack.runtime().store().lane_rooms(["gpu"])["gpu"].limit == 2


def test_status_shows_a_max_above_the_ceiling_as_invalid_and_the_cli_tick_runs(env, capsys):
    _over_ceiling(env)
    status = cli(env, capsys, "status")
    assert status.code == 0
    assert "INVALID" in status.out and "at most 10,000" in status.out
    assert cli(env, capsys, "tick").code == 0  # keeps the deployed MAX (5): no crash
    run = cli(env, capsys, "set-max", "4")
    assert run.code == 0 and run.out.startswith("MAX 5000000000000 → 4")
