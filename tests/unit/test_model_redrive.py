"""The reference model (tests/support/model.py) on an operator's redrive: a redriven execution is
outside Sluice until adopted, unless Sluice never gave its slot back (its end's event lost and no
reconciliation released it before the redrive): then Sluice still holds it, and the world at rest
expects it in the ledger."""

from __future__ import annotations

from tests.unit.test_model_vanished import claim, model, send


def test_a_redriven_execution_still_held_is_sluices():
    m = model()
    send(m, "m1", "p0")
    claim(m, "n1", "m1")
    m.ended("n1", "TIMED_OUT")  # its event lost: the ledger still holds n1
    m.running_again("n1")
    assert "n1" in m.running and "n1" in m.holders and "n1" not in m.outside


def test_a_redriven_execution_released_before_is_outside_until_adopted():
    m = model()
    send(m, "m1", "p0")
    claim(m, "n1", "m1")
    m.ended("n1", "FAILED")
    m.holders.discard("n1")  # its release gave the slot back
    m.running_again("n1")
    assert "n1" in m.running and "n1" in m.outside
