"""Call-granular interleavings of real adapters: an actor runs in a thread whose every call on its
client waits at a botocore ``before-call`` hook until the test lets it go. No production code is
touched; the test decides which actor's next AWS call lands first."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

WRITES = frozenset({"TransactWriteItems", "UpdateItem", "PutItem", "DeleteItem"})


class Stepper:
    """``fn`` run in its own thread, one AWS call of ``client`` at a time."""

    def __init__(self, client: Any, fn: Callable[[], Any], *, service: str = "dynamodb") -> None:
        self.pending: queue.Queue[str | None] = queue.Queue()
        self.permit = threading.Semaphore(0)
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.calls: list[str] = []  # the calls made, in order
        self.waiting: str | None = None  # the call it waits to make; None once finished
        self.thread = threading.Thread(target=self._body, args=(fn,), daemon=True)
        client.meta.events.register(f"before-call.{service}", self._hook)

    def _hook(self, model: Any = None, **_: Any) -> None:
        if threading.current_thread() is not self.thread:
            return
        self.pending.put(model.name)
        self.permit.acquire()
        self.calls.append(model.name)

    def _body(self, fn: Callable[[], Any]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:  # handed to the test by finish()
            self.error = exc
        finally:
            self.done = True
            self.pending.put(None)

    def _next(self) -> str | None:
        self.waiting = self.pending.get(timeout=60)
        return self.waiting

    def start(self) -> str | None:
        self.thread.start()
        return self._next()

    def go(self) -> str | None:
        """Let the waiting call run: the call it waits at next, or None once it returned."""
        self.permit.release()
        return self._next()

    def until_write(self, nth: int = 1) -> None:
        """Run until it waits at its nth write (its reads before it made)."""
        if not self.thread.is_alive() and not self.done:
            self.start()
        while self.waiting is not None and (self.waiting not in WRITES or self.writes() < nth - 1):
            self.go()
        assert self.waiting is not None, f"finished before its write {nth}: {self.calls}"

    def writes(self) -> int:
        return sum(1 for c in self.calls if c in WRITES)

    def finish(self) -> Any:
        while not self.done:
            self.go()
        self.thread.join(timeout=60)
        if self.error is not None:
            raise self.error
        return self.result
