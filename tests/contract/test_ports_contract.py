"""The launcher's store as four ports (``sluice.ports``): slot pools, payload leases, records and the
waiting room. Both adapters implement each; ``Store`` is their sum and adds nothing; code typed
against one port works with a store that offers that port alone."""

from __future__ import annotations

import inspect
import json

import pytest

from sluice.effects import EFFECTS_FIELD, around
from sluice.model import EffectsLog, PayloadState
from sluice.ports import PayloadLeases, Records, SlotPools, Store, WaitingRoom
from sluice.receipts import ReceiptOutput
from tests.contract.stores import NOW, claim

PORTS = (SlotPools, PayloadLeases, Records, WaitingRoom)


def members(port: type) -> set[str]:
    return {
        name for name, value in vars(port).items() if inspect.isfunction(value) and not name.startswith("_")
    }


class Only:
    """``store`` seen through ``port`` alone: any other attribute is an AttributeError."""

    def __init__(self, store: object, port: type) -> None:
        self._store, self._allowed = store, members(port)

    def __getattr__(self, name: str):
        if name not in self._allowed:
            raise AttributeError(f"{name} is not part of the port")
        return getattr(self._store, name)


@pytest.mark.parametrize("port", PORTS, ids=lambda port: port.__name__)
def test_both_adapters_implement_each_port(store, port):
    assert isinstance(store, port)
    missing = {name for name in members(port) if not callable(getattr(store, name, None))}
    assert missing == set()


def test_the_store_is_the_four_ports_and_nothing_more():
    assert members(Store) == set()
    assert set(Store.__mro__) >= set(PORTS)
    each = [members(port) for port in PORTS]
    assert all(each) and sum(len(names) for names in each) == len(set().union(*each))  # no method in two


def test_a_release_asks_the_records_port_alone_whether_its_effects_were_sent(store):
    sent = EffectsLog("n1", "k", 1, ("a",), (), NOW + 9)
    claim(store, "k", "n1")
    store.release(
        name="n1",
        state=PayloadState.SUCCEEDED,
        now=NOW + 9,
        output=lambda record: ReceiptOutput(inline="{}", size=2, effects=sent),
    )
    claim(store, "k", "n1", now=NOW + 20)  # a redelivered message claims the same name again
    text = json.dumps({EFFECTS_FIELD: [{"payload": {"x": 1}, "key": "e0"}]})
    output = around(
        lambda record: ReceiptOutput(inline=text, size=len(text), text=text),
        None,
        store=Only(store, Records),
        queue=None,  # sending anything would fail here: the effects were sent by the first release
        name="n1",
        state=PayloadState.SUCCEEDED,
        now=NOW + 21,
    )
    released = store.release(name="n1", state=PayloadState.SUCCEEDED, now=NOW + 21, output=output)
    assert released is not None
    assert store.effects("n1") == sent
    assert store.execution("n1").state is PayloadState.SUCCEEDED
