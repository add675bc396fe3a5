"""The launcher's store as the launch path uses it: the four ports of ``sluice.ports.Store`` and the
rooms of two features, the key lines (``sluice.keys.KeyStore``) and the awaits
(``sluice.awaits.AwaitStore``). One adapter implements them all (``MemoryStore``, ``DynamoStore``),
because a start writes to several at once; ``ports.py`` stays below the features.
"""

from __future__ import annotations

from typing import Protocol

from sluice.awaits import AwaitStore
from sluice.keys import KeyStore
from sluice.ports import Store


class LaunchStore(Store, KeyStore, AwaitStore, Protocol):
    """``Store`` with the key lines and the awaits: what the launcher, a completion and
    reconciliation hand to ``sluice.keys`` and ``sluice.awaits``."""
