"""Gates: limits beside MAX and the caps, asked by a launch at named points (the hooks below).

A gate lets a number of starts through, or holds them until it has room again. It is asked at
these points, and nothing else of it is known:

- ``before_receive``: before each receive, which it sizes (a payload a gate holds stays in the
  queue, never received); the launcher's rounds and a completion's hand-over ask it.
- ``before_claim``: before the claim of a message with a concurrency key, known only once received
  (a message it holds waits in its key's line, ``sluice.features.keys``).
- ``key_room`` and ``key_due``: every key's wake (a release, the sweep, a fair lane's waker) sends
  no more waiters than the gate has room for, through the store's ``key_gate``; a lingering tick
  wakes a key it held once its room is due.

Given back (``give_back``): a receive's grants that no message came for (a message received spends
its grant, started or not), and a keyed claim's grant when its claim did not start. A crash keeps
every grant spent: fewer starts, never more. The runtime hands the same gate to the launch and to
the store: ``sluice.features.rate_limits.RateLimiter`` on every deployed stack (it reads its book
at most once per 5 s where no rate is set). ``OPEN`` holds nothing: the default where nothing is
wired (the tests' and the benchmark's launchers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Grant:
    """``n`` starts let through at ``at_ms`` in ``scopes`` (those with a limit in force: none, not
    held at all); with ``n`` 0, ``due`` is when every one of them has room again (None: unknown)."""

    n: int
    at_ms: int = 0
    scopes: tuple[str, ...] = ()
    due: float | None = None

    @property
    def gated(self) -> bool:
        """Some scope had a limit in force: the grant is to be given back if not used."""
        return bool(self.scopes)


class Gate(Protocol):
    """A limit on starts beside MAX (module docstring). Each method may raise ``TransientError``."""

    # Why a round stopped when the gate held it (``TickSummary.stopped``; also in its log lines and
    # park reasons): unlike the other reasons ("full", "empty", "time", ...), which admission tells apart.
    name: str

    def before_receive(self, lane: str | None, wanted: int, now: float) -> Grant:
        """Up to ``wanted`` starts from the stack's pool (``lane`` None) or a lane's."""
        ...

    def before_claim(self, ckey: str, now: float) -> Grant:
        """One start of concurrency key ``ckey``."""
        ...

    def give_back(self, grant: Grant, unused: int) -> None:
        """Return ``unused`` of ``grant``, never started. Best effort: one not returned stays spent."""
        ...

    def key_room(self, ckey: str, now: float) -> int | None:
        """Starts ``ckey`` may take now; None: no limit in force for it."""
        ...

    def key_due(self, ckey: str, now: float) -> float | None:
        """When ``ckey`` next has room; None: it has room now, or no limit."""
        ...


class OpenGate:
    """No limit: everything through, nothing read."""

    name = "open"

    def before_receive(self, lane: str | None, wanted: int, now: float) -> Grant:
        return Grant(max(wanted, 0))

    def before_claim(self, ckey: str, now: float) -> Grant:
        return Grant(1)

    def give_back(self, grant: Grant, unused: int) -> None:
        pass

    def key_room(self, ckey: str, now: float) -> int | None:
        return None

    def key_due(self, ckey: str, now: float) -> float | None:
        return None


OPEN: Gate = OpenGate()
