"""A producer's wake: ``sluice enqueue`` invokes the launcher asynchronously after sending
(``sluice.enqueue.LauncherWake``), and the woken launcher fills the free slots now, without
reconciling or lingering. Woken launchers take turns: one fills at a time.

Why turns. A fill reads the room, receives that many messages, then claims them. Many producers
waking at once would each read the same room and receive a batch, and every claim that loses the race
returns its message: one of its ``maxReceiveCount`` receives spent for nothing, until healthy payloads
reach the dead-letter queue. So a wake that finds another woken launcher at work leaves it a note and
returns; the one at work fills once more for each note before it gives its turn back. The scheduled
tick and the completions do not take turns: they are few, and a completion takes one slot at most.

One item, ``WAKE``, in the launcher's table (``sluice.adapters.dynamo.wake``):

    take       holder = W, again = false, expires_at = W's deadline
               IF no item  OR  expires_at <= now  OR  holder = W   (W's SDK retrying a take whose answer was lost)
    note       again = true                         IF expires_at > now
    again      again = false                        IF holder = W
    give back  DELETE                               IF holder = W  AND  again = false

    woken W                                      woken V (its payload sent while W fills)
    ───────                                      ────────────────────────────────────────
    take ✓
    fill: receive … claim … start
                                                 take ✗ (W holds it)
                                                 note ✓ → returns: W fills for it
    give back ✗ (again)
    again ✓ → fill: V's payload
    give back ✓
                                                 (a note refused: W gave back meanwhile, or its turn
                                                 expired → V takes the turn itself)

W's fill fails (AWS throttled past the SDK's retries): W gives the turn back whatever was noted and
fails, and Lambda invokes it again later (an asynchronous invocation is retried twice). W crashes
holding the turn: wakes are noted until W's deadline passes, and the scheduled tick starts their
payloads meanwhile (at most one schedule interval late; nothing is lost: the messages wait in
the queue). Clocks: a taker whose clock runs ahead of W's may take W's turn up to that much early, and
two woken launchers then fill at once, as two ticks may: no promise rests on the turn, only the
receives a crowd of wakes would spend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

from sluice.core.summary import TickSummary

TAKE_ATTEMPTS = 3  # take or note: each refusal of one means the other's condition changed meanwhile
NOTED = "noted: another woken launcher fills the slots"
MIN_FILL_SECONDS = 5.0  # fill again for a note only with this much of the invocation left


class WakeTurns(Protocol):
    """The ``WAKE`` item (see the module)."""

    def take(self, holder: str, *, now: float, expires_at: float) -> bool:
        """Take the turn: True when no one holds it or its holder's expired."""
        ...

    def note(self, *, now: float) -> bool:
        """Ask the holder to fill once more: False when no one holds an unexpired turn."""
        ...

    def again(self, holder: str) -> bool:
        """Clear the note before filling for it: False when ``holder`` no longer holds the turn."""
        ...

    def give_back(self, holder: str, *, noted_or_not: bool = False) -> bool:
        """Give the turn back: False when a wake was noted meanwhile (or the turn is not ``holder``'s).
        ``noted_or_not``: give it back whatever was noted (the invocation's time is up)."""
        ...


def woken(
    turns: WakeTurns,
    holder: str,
    *,
    now: Callable[[], float],
    deadline: float,
    fill: Callable[[], TickSummary],
) -> TickSummary:
    """What a woken launcher does (see the module): fill, once more for each wake noted meanwhile."""
    for _ in range(TAKE_ATTEMPTS):
        if turns.take(holder, now=now(), expires_at=deadline):
            break
        if turns.note(now=now()):
            return TickSummary(counted=False, stopped=NOTED)
    else:
        return fill()  # the item changed under each attempt: fill, as any tick may
    try:
        summary = fill()
        while not turns.give_back(holder):
            if deadline - now() < MIN_FILL_SECONDS:
                turns.give_back(holder, noted_or_not=True)  # the scheduled tick takes what was noted
                break
            if not turns.again(holder):
                break  # the turn expired and was taken: its holder fills
            summary = _added(fill(), summary)
    except Exception:
        with contextlib.suppress(Exception):  # the fill's error is the one to report
            turns.give_back(holder, noted_or_not=True)
        raise
    return summary


def _added(later: TickSummary, earlier: TickSummary) -> TickSummary:
    """One summary for two fills of a turn: the later one's figures, both fills' counts."""
    later.received += earlier.received
    for outcome, n in earlier.outcomes.items():
        later.outcomes[outcome] = later.outcomes.get(outcome, 0) + n
    later.running_before = earlier.running_before
    return later
