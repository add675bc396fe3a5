"""The woken launchers' turn (``sluice.features.wake``) in memory: the same four writes, atomic under a
lock, for the local runner, the benchmark and the tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class _Turn:
    holder: str
    expires_at: float
    again: bool = False


class MemoryWakeTurns:
    """``WakeTurns`` in memory."""

    def __init__(self) -> None:
        self.turn: _Turn | None = None
        self.lock = threading.Lock()

    def take(self, holder: str, *, now: float, expires_at: float) -> bool:
        with self.lock:
            if self.turn is not None and self.turn.expires_at > int(now) and self.turn.holder != holder:
                return False
            self.turn = _Turn(holder, int(expires_at) + 1)
            return True

    def note(self, *, now: float, margin: float = 0.0) -> bool:
        with self.lock:
            if self.turn is None or self.turn.expires_at <= int(now + margin):
                return False
            self.turn.again = True
            return True

    def again(self, holder: str) -> bool:
        with self.lock:
            if self.turn is None or self.turn.holder != holder:
                return False
            self.turn.again = False
            return True

    def give_back(self, holder: str, *, noted_or_not: bool = False) -> bool:
        with self.lock:
            if self.turn is None or self.turn.holder != holder or (self.turn.again and not noted_or_not):
                return False
            self.turn = None
            return True
