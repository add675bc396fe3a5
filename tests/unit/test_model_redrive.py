"""The reference model (tests/support/model.py) on an operator's redrive: a redriven execution is
outside Sluice until adopted, unless Sluice never gave its slot back (its end's event lost and no
reconciliation released it before the redrive): then Sluice still holds it, and the world at rest
expects it in the ledger."""

from __future__ import annotations

from tests.unit.test_model_vanished import claim, model, send


def slot(verb: str, redriven_at: float | None = None) -> dict:
    """A transaction that takes (an adoption's) or gives back (a release's) n1's slot; an adoption
    naming the redrive date of the run it took (``redriven_at``)."""
    expression = "SET holders.#n = :now" if verb == "take" else "REMOVE holders.#n"
    update = {
        "Key": {"pk": {"S": "SLOTS#launcher#0"}},
        "UpdateExpression": expression,
        "ExpressionAttributeNames": {"#n": "n1"},
    }
    items: list[dict] = [{"Update": update}]
    if redriven_at is not None:
        values = {":redriven": {"N": str(redriven_at)}}
        items.append({"Update": {"Key": {"pk": {"S": "EXEC#n1"}}, "ExpressionAttributeValues": values}})
    return {"TransactItems": items}


def redriven_after_its_release():
    """The explorer's model with n1 claimed, FAILED, released, and redriven: outside Sluice."""
    from tests.explorer.world import ExplorerModel

    m = model()
    m.__class__ = ExplorerModel
    send(m, "m1", "p0")
    claim(m, "n1", "m1")
    m.ended("n1", "FAILED")
    m.holders.discard("n1")  # released on its failure
    m.running_again("n1")  # redriven: outside
    return m


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


def test_an_adopted_run_redriven_while_held_and_released_on_its_earlier_end_is_outside_and_not_adopted():
    """Explorer seed 1206201057: an adopted run ended, the operator redrove it while Sluice still held
    it, and the completion then released it on the end it had read before the redrive. The run is
    outside Sluice from that release; its old adoption no longer counts it against its key's next
    claim (it counted, and the model blamed that claim for the key's cap)."""
    from tests.support.steps import Call

    m = redriven_after_its_release()
    m.saw(Call("C", "dynamodb", "TransactWriteItems", "adopt", slot("take")), 200, {})
    assert "n1" in m.adopted_at and "n1" not in m.outside
    m.ended("n1", "TIMED_OUT")
    m.running_again("n1")  # redriven again while its adoption holds it
    m.saw(Call("A", "dynamodb", "TransactWriteItems", "release", slot("give")), 200, {})
    assert "n1" in m.outside and "n1" not in m.adopted_at


def test_an_adoption_of_an_earlier_redrive_leaves_the_latest_redrive_outside_after_its_release():
    """Explorer seed 1209700796: an adoption read from the answer that showed redrive 2 lands after
    that run ended and redrive 3 began. It holds a slot (Sluice holds it), and the release on redrive
    2's end leaves redrive 3 outside Sluice, as any redrive behind its back."""
    from tests.explorer.world import ExplorerModel
    from tests.support.steps import Call

    def run(adopted_redrive: float) -> ExplorerModel:
        m = redriven_after_its_release()
        m.redrive_dates["n1"] = 100.0  # redrive 2
        m.ended("n1", "ABORTED")  # its end handled while not adopted: nothing held
        m.running_again("n1")
        m.redrive_dates["n1"] = 200.0  # redrive 3, behind Sluice's back
        m.saw(Call("B", "dynamodb", "TransactWriteItems", "adopt", slot("take", adopted_redrive)), 200, {})
        assert "n1" in m.holders
        m.saw(Call("C", "dynamodb", "TransactWriteItems", "release", slot("give")), 200, {})
        return m

    assert "n1" in run(100.0).outside  # the adoption of redrive 2: redrive 3 is outside
    assert "n1" not in run(200.0).outside  # an adoption of redrive 3 is Sluice's own
