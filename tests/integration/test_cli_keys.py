"""``sluice enqueue --concurrency-key / --concurrency-key-field``, ``sluice set-max N --key KEY`` and
what ``sluice status`` says of keys and their lines, on moto."""

from __future__ import annotations

import json

import pytest

from handlers import _shared
from sluice.core.events import StatusChange
from sluice.core.model import Outcome
from tests.support.cli import sluice, use_env


@pytest.fixture
def env(stack, monkeypatch):
    use_env(monkeypatch, stack, SLUICE_MAX_CONCURRENCY="10", SLUICE_KEY_CONCURRENCY="1")
    _shared.reset()
    yield stack
    _shared.reset()


def enqueue(env, capsys, tmp_path, body, *args):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(body))
    return sluice(capsys, "enqueue", path, *args, session=env.session)


def tenants(env) -> list[str]:
    return sorted(json.loads(json.dumps(i))["id"] for i in env.inputs())


def test_a_key_from_a_field_caps_each_tenant_and_status_shows_the_line(env, capsys, tmp_path):
    payloads = [{"id": f"a{n}", "tenant": "acme"} for n in range(3)] + [{"id": "b0", "tenant": 7}]
    assert enqueue(env, capsys, tmp_path, payloads, "--concurrency-key-field", "tenant").code == 0
    summary = env.launcher().tick()
    assert (summary.n(Outcome.STARTED), summary.n(Outcome.KEY_WAITING)) == (2, 2)
    assert tenants(env) == ["a0", "b0"]  # one of acme, and tenant 7 beside it

    shown = sluice(capsys, "status", "a2", session=env.session)
    assert shown.code == 0
    assert (
        "waiting for concurrency key 'acme' (1 of 1 running)" in shown.out
        and "1 payload ahead of it" in shown.out
    )
    as_json = json.loads(sluice(capsys, "status", "a1", "--json", session=env.session).out)
    assert as_json["line"]["ahead"] == 0 and as_json["line"]["key"]["waiting"] == 2

    overview = sluice(capsys, "status", session=env.session).out
    assert "acme: 1 of 1 running, 2 waiting" in overview


def test_set_max_for_a_key_raises_its_cap_and_starts_its_waiters_at_once(env, capsys, tmp_path):
    payloads = [{"id": f"a{n}"} for n in range(3)]
    assert enqueue(env, capsys, tmp_path, payloads, "--concurrency-key", "acme").code == 0
    env.launcher().tick()
    assert len(env.running()) == 1

    raised = sluice(capsys, "set-max", "3", "--key", "acme", session=env.session)
    assert raised.code == 0
    assert "cap 1 → 3 (its own cap)" in raised.out and "2 waiting payloads were sent back" in raised.out
    env.launcher().admit()
    assert len(env.running()) == 3  # no end was needed

    back = sluice(capsys, "set-max", "default", "--key", "acme", "--json", session=env.session)
    assert json.loads(back.out)["after"]["cap"] == 1
    paused = sluice(capsys, "set-max", "0", "--key", "acme", session=env.session)
    assert "Cap 0 pauses the key" in paused.out
    for name in env.running():
        env.launcher().on_status_change(StatusChange.from_event(env.finish(name)))
    assert enqueue(env, capsys, tmp_path, {"id": "a9"}, "--concurrency-key", "acme").code == 0
    assert env.launcher().tick().n(Outcome.KEY_WAITING) == 1 and env.running() == []


def test_bad_keys_get_clear_errors(env, capsys, tmp_path):
    refused = sluice(capsys, "set-max", "2", "--key", "bad\u0007key", session=env.session)
    assert refused.code == 2 and "--key contains a control character" in refused.err
    assert sluice(capsys, "set-max", "default", session=env.session).code == 2

    missing = enqueue(env, capsys, tmp_path, [{"id": "x"}], "--concurrency-key-field", "tenant")
    assert missing.code != 0
    assert "field 'tenant' (--concurrency-key-field) is missing" in missing.err
    assert env.queue_counts() == (0, 0)
