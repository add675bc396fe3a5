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

    take       holder = W, again = false, expires_at = when W's fills stop receiving
               IF no item  OR  expires_at <= now  OR  holder = W   (W's SDK, or Lambda, trying again)
    note       again = true                         IF expires_at > now + NOTE_MARGIN
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
                                                 ended → V takes the turn itself; W's turn ends within
                                                 NOTE_MARGIN → V fills without a turn)

W is the Lambda invocation (its request id), the same in Lambda's retries of it. W's fill fails (AWS
throttled past the SDK's retries): W gives the turn back whatever was noted and fails, and Lambda
invokes it again later (an asynchronous invocation is retried twice), which may take the turn again
as W. W crashes holding the turn: wakes are noted until its turn ends, and the scheduled tick starts
their payloads meanwhile (at most one schedule interval late; nothing is lost: the messages wait in
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
# No note within this many seconds of the turn's end: the holder might not fill for it in time, so the
# wake fills by itself (a fill of more than this long near its turn's end may leave a note unfilled,
# its payload then waiting for the scheduled tick).
NOTE_MARGIN = 10.0


class WakeTurns(Protocol):
    """The ``WAKE`` item (see the module)."""

    def take(self, holder: str, *, now: float, expires_at: float) -> bool:
        """Take the turn: True when no one holds it, its holder's turn has ended, or it is ``holder``'s
        own (a take whose answer was lost, or Lambda's retry of the invocation)."""
        ...

    def note(self, *, now: float, margin: float = 0.0) -> bool:
        """Ask the holder to fill once more: False when no one holds a turn that ends more than
        ``margin`` seconds after ``now``."""
        ...

    def again(self, holder: str) -> bool:
        """Clear the note before filling for it: False when ``holder`` no longer holds the turn."""
        ...

    def give_back(self, holder: str, *, noted_or_not: bool = False) -> bool:
        """Give the turn back: False when a wake was noted meanwhile (or the turn is not ``holder``'s).
        ``noted_or_not``: give it back whatever was noted (the invocation is failing)."""
        ...


def woken(
    turns: WakeTurns,
    holder: str,
    *,
    now: Callable[[], float],
    ends_at: float,
    fill: Callable[[], TickSummary],
) -> TickSummary:
    """What a woken launcher does (see the module): fill, once more for each wake noted meanwhile.
    ``ends_at``: when its fills stop receiving (the invocation's deadline less the launcher's time
    reserve), the end of its turn; ``holder``: the same for Lambda's retries of one invocation."""
    try:
        for _ in range(TAKE_ATTEMPTS):
            if turns.take(holder, now=now(), expires_at=ends_at):
                break
            if turns.note(now=now(), margin=NOTE_MARGIN):
                return TickSummary(counted=False, stopped=NOTED)
        else:
            return fill()  # the turn ends within NOTE_MARGIN, or changed under each attempt: fill
        summary = fill()
        while not turns.give_back(holder):
            if not turns.again(holder):
                break  # the turn ended and was taken: its holder fills
            summary = _added(fill(), summary)
    except Exception:
        # Failing, the invocation is retried by Lambda under the same holder, which may take the
        # turn again; given back now, the next wake need not wait for that.
        with contextlib.suppress(Exception):  # the first error is the one to report
            turns.give_back(holder, noted_or_not=True)
        raise
    return summary


def _added(later: TickSummary, earlier: TickSummary) -> TickSummary:
    """One summary for two fills of a turn: the later one's figures, both fills' counts."""
    later.received += earlier.received
    for outcome, n in earlier.outcomes.items():
        later.outcomes[outcome] = later.outcomes.get(outcome, 0) + n
    for lane, figures in earlier.lanes.items():
        mine = later.lanes.setdefault(lane, {})
        for name in ("received", "started"):
            mine[name] = mine.get(name, 0) + figures.get(name, 0)
    later.running_before = earlier.running_before
    return later
