"""``sluice set-rate`` and the rates ``sluice status`` shows, against a moto stack."""

from __future__ import annotations

import json


def enqueue(cli, tmp_path, n: int) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"p-{i}"}) for i in range(n)))
    assert cli("enqueue", path).code == 0


def test_set_rate_holds_from_the_next_start_and_status_shows_it(env, cli, tmp_path):
    enqueue(cli, tmp_path, 5)
    run = cli("set-rate", "2/hour")
    assert run.code == 0
    assert run.out.splitlines()[0] == "rate of stack: none → 2/hour. In force for the next start."
    assert cli("tick", "--json").json["started"] == 2
    status = cli("status")
    (line,) = [row for row in status.out.splitlines() if row.startswith("rate")]
    assert "stack  2/hour: 2 starts in the current window; the next is due 20" in line
    assert cli("status", "--json").json["rates"][0] == {
        "scope": "stack",
        "rate": "2/hour",
        "set_at_run_time": True,
        "in_window": 2,
        "next_due": cli("status", "--json").json["rates"][0]["next_due"],
    }
    assert cli("set-rate", "none").code == 0
    assert cli("tick", "--json").json["started"] == 3


def test_set_rate_default_goes_back_to_the_parameter(env, cli, monkeypatch):
    monkeypatch.setenv("SLUICE_RATE_LIMIT", "10/minute")
    assert cli("set-rate", "1/second").code == 0
    run = cli("set-rate", "default")
    assert (
        run.out.splitlines()[0]
        == "rate of stack: 1/second → 10/minute (the stack's parameter). In force for the next start."
    )


def test_a_rate_that_is_not_one_exits_with_its_reason(env, cli):
    run = cli("set-rate", "5/day")
    assert run.code != 0 and "RATE='5/day': a rate is N/second, N/minute or N/hour" in run.err
    lane = cli("set-rate", "5/second", "--lane", "gpu")
    assert lane.code != 0 and "no lanes configured" in lane.err


def test_set_rate_key_holds_that_key_and_status_lists_it(env, cli, tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_KEY_CONCURRENCY", "10")
    path = tmp_path / "keyed.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"p-{i}", "tenant": "ab"[i % 2]}) for i in range(6)))
    assert cli("enqueue", path, "--concurrency-key-field", "tenant").code == 0
    run = cli("set-rate", "1/hour", "--key", "a")
    assert run.code == 0
    assert run.out.splitlines()[0] == "rate of key:a: none → 1/hour. In force for the next start."
    # a: 1 (2 wait in its line); b: 3. A tick lingers by the wall clock: on a loaded machine its
    # rounds may end before every start, so ticks run until one starts nothing.
    started = [cli("tick", "--json").json["started"] for _ in range(4)]
    assert sum(started) == 4 and started[-1] == 0, started
    rows = [row for row in cli("status").out.splitlines() if row.startswith("rate")]
    assert len(rows) == 1 and "key:a  1/hour: 1 starts in the current window; the next is due 20" in rows[0]
    both = cli("set-rate", "1/hour", "--key", "a", "--lane", "gpu")
    assert both.code != 0 and "not allowed with argument" in both.err


def test_status_shows_the_keys_default_rate(env, cli, monkeypatch):
    monkeypatch.setenv("SLUICE_KEY_RATE_LIMIT", "10/minute")
    rates = cli("status", "--json").json["rates"]
    assert rates == [
        {
            "scope": "key:*",
            "rate": "10/minute",
            "set_at_run_time": False,
            "in_window": 0,
            "next_due": None,
            "default": True,
        }
    ]
    (line,) = [row for row in cli("status").out.splitlines() if row.startswith("rate")]
    assert line.endswith("key:*  10/minute: every concurrency key's, unless set for the key")
