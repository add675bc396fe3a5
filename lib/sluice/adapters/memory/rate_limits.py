"""The rate book (``sluice.features.rate_limits``) in memory: the same two primitives, atomic under
a lock, for the local runner and the tests."""

from __future__ import annotations

import threading
from dataclasses import replace

from sluice.features.rate_limits import MAIN, RateBook


class MemoryRates:
    """``RatePersistence`` in memory."""

    def __init__(self) -> None:
        self.books: dict[str, RateBook] = {}
        self.lock = threading.Lock()

    def load(self, where: str = MAIN) -> RateBook:
        with self.lock:
            return self.books.get(where, RateBook())

    def save(self, book: RateBook, expected: int, where: str = MAIN) -> bool:
        with self.lock:
            if self.books.get(where, RateBook()).version != expected:
                return False
            self.books[where] = replace(book, version=expected + 1)
            return True
