"""The rate book (``sluice.features.rate_limits``) in memory: the same two primitives, atomic under
a lock, for the local runner and the tests."""

from __future__ import annotations

import threading
from dataclasses import replace

from sluice.features.rate_limits import RateBook


class MemoryRates:
    """``RatePersistence`` in memory."""

    def __init__(self) -> None:
        self.book = RateBook()
        self.lock = threading.Lock()

    def load(self) -> RateBook:
        with self.lock:
            return self.book

    def save(self, book: RateBook, expected: int) -> bool:
        with self.lock:
            if self.book.version != expected:
                return False
            self.book = replace(book, version=expected + 1)
            return True
