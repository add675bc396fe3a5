"""Each concurrency key's rate (``keyRateLimit``, ``sluice set-rate --key``;
``sluice.features.rate_limits``) as the launcher's per-message steps take it: a grant before the
claim, given back unless it may have started; a message it holds waits in the key's line
(``sluice.features.keys``), and the keys it held are woken by a lingering tick once their room is
due (``wake_held``), besides the key's next release and the next tick's sweep."""

from __future__ import annotations

import contextlib
from typing import Protocol

from sluice.core.errors import TransientError
from sluice.core.ports import Clock, Queue
from sluice.features import keys
from sluice.features.rate_limits import Grant, RateLimiter, key_scope


class Launching(Protocol):
    """What the grants take from a launch (``sluice.launch.context.LaunchContext``)."""

    @property
    def rates(self) -> RateLimiter | None: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def store(self) -> keys.KeyStore: ...
    @property
    def queue(self) -> Queue: ...


class KeyRates:
    def __init__(self, ctx: Launching) -> None:
        self.ctx = ctx
        # Keys whose rate held a message of this launcher, with when their room is due.
        self.held: dict[str, float] = {}

    def take(self, ckey: str) -> Grant | None:
        """A grant of ``ckey``'s rate, taken before its claim (the key is known only once
        received); None where it has no rate in force. None to take: the key is noted as held."""
        if self.ctx.rates is None:
            return None
        scope, now = key_scope(ckey), self.ctx.clock.now()
        try:
            grant = self.ctx.rates.take([scope], 1, now)
        except TransientError:
            grant = Grant(0, scopes=(scope,))  # unsure of the room: it waits in the line, as if none
        if not grant.scopes:
            return None
        if grant.n == 0:
            self.held[ckey] = grant.due if grant.due is not None else now + 1.0
        return grant

    def give_back(self, grant: Grant | None) -> None:
        if grant is not None and grant.n > 0 and self.ctx.rates is not None:
            with contextlib.suppress(TransientError):  # kept spent: one start fewer, never one more
                self.ctx.rates.give_back(grant, grant.n)

    def wake_held(self) -> None:
        """Wake each key its rate held once its room is due: a lingering tick receives its
        waiters then. A wake AWS refuses is left to the sweep."""
        now = self.ctx.clock.now()
        for ckey, due in sorted(self.held.items()):
            if due > now:
                continue
            del self.held[ckey]
            with contextlib.suppress(TransientError):
                sent = keys.wake(store=self.ctx.store, queue=self.ctx.queue, ckey=ckey, now=now)
                # Some sent: looked at again next round, once they took their grants. None sent:
                # held again until the window next has room (none due: room, or no rate).
                scope = key_scope(ckey)
                again = now if sent else self.ctx.rates.next_due(scope, now) if self.ctx.rates else None
                if again is not None:
                    self.held[ckey] = again

    def held_due(self) -> float | None:
        """When the first key a rate held has room again (None: none held)."""
        return min(self.held.values(), default=None)
