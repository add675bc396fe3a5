"""The launcher's store as four ports (``sluice.core.ports``): slot pools, payload leases, records and the
waiting room. Both adapters implement each; ``Store`` is their sum and adds nothing; code typed
against one port works with a store that offers that port alone."""

from __future__ import annotations

import inspect
import json

import pytest

from sluice.adapters.memory.aws import MemoryQueue
from sluice.core.clock import FakeClock
from sluice.core.model import Ending, PayloadState
from sluice.core.ports import PayloadLeases, Records, SlotPools, Store, WaitingRoom
from sluice.core.records import ReceiptOutput
from sluice.features.awaits import AwaitStore
from sluice.features.effects import EFFECTS_FIELD, around
from sluice.features.keys import KeyStore
from sluice.features.stores import LaunchStore
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


def test_both_adapters_are_a_launch_store(store):
    """``LaunchStore`` (``sluice.features.stores``) adds the key lines' and the awaits' rooms to ``Store``, and
    nothing of its own: the store the launcher, a completion and reconciliation hold offers all of it."""
    assert members(LaunchStore) == set()
    assert set(LaunchStore.__mro__) >= {Store, KeyStore, AwaitStore}
    wanted = members(KeyStore) | members(AwaitStore)
    assert wanted and {name for name in wanted if not callable(getattr(store, name, None))} == set()


def test_the_store_is_the_four_ports_and_nothing_more():
    assert members(Store) == set()
    assert set(Store.__mro__) >= set(PORTS)
    each = [members(port) for port in PORTS]
    assert all(each) and sum(len(names) for names in each) == len(set().union(*each))  # no method in two


def test_a_release_sends_its_effects_asking_the_records_port_alone(store):
    """``effects.around`` is typed against ``Records``: it works with a store that offers nothing
    else (any other call would be an AttributeError), sends the effect once and the release writes
    what it sent."""
    claim(store, "k", "n1")
    queue = MemoryQueue(clock=FakeClock(NOW))
    text = json.dumps({EFFECTS_FIELD: [{"payload": {"x": 1}, "key": "e0"}]})
    output = around(
        lambda record: ReceiptOutput(inline=text, size=len(text), text=text),
        None,
        store=Only(store, Records),
        queue=queue,
        name="n1",
        state=PayloadState.SUCCEEDED,
        now=NOW + 9,
    )
    assert store.release("n1", Ending(PayloadState.SUCCEEDED, NOW + 9), output=output) is not None
    assert [m.attributes.get("sluice-key") for m in queue.receive(10, 0)] == ["e0"]
    assert store.effects("n1").sent == ("e0",)
