"""The launcher's store as the launch path uses it: the four ports of ``sluice.core.ports.Store`` and the
rooms of two features, the key lines (``sluice.features.keys.KeyStore``) and the awaits
(``sluice.features.awaits.AwaitStore``). One adapter implements them all (``MemoryStore``, ``DynamoStore``),
because a start writes to several at once; ``ports.py`` stays below the features.
"""

from __future__ import annotations

from typing import Protocol

from sluice.core.ports import Store
from sluice.features.awaits import AwaitStore
from sluice.features.keys import KeyStore


class LaunchStore(Store, KeyStore, AwaitStore, Protocol):
    """``Store`` with the key lines and the awaits: what the launcher, a completion and
    reconciliation hand to ``sluice.features.keys`` and ``sluice.features.awaits``."""
