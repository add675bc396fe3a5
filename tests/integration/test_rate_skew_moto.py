"""A stack rate under clocks an hour apart (docs/protocol.md promise 8, "Rate limits"), on moto with
the real adapters: a write by a clock ahead drops entries a clock behind still counts.

Found by the explorer (seed 1211301274, tests/explorer/test_explore.py): with the stack's rate at
1/second and launcher B's clock an hour behind, B granted twice in one second of its own clock.
Launcher A, an hour ahead, kept only the latest 32 entries past its own period, and its own grants
of the last minute were those: B's grant, still in B's window, went with the oldest. The book now
remembers what its writes dropped as spans of time; a clock whose window may reach one takes no grant.
"""

from __future__ import annotations

from sluice.core.clock import FakeClock
from sluice.features.rate_limits import KEPT_PAST, STACK, Rate, RateDefaults
from sluice.runtime import Runtime
from tests.integration.test_key_rate_review_attacks import busiest_window, timed_starts
from tests.reliability.actors import SkewedClock
from tests.support.aws import NO_RETRY, build_stack

HOUR = 3_600.0


def test_a_clock_an_hour_ahead_drops_nothing_a_clock_behind_still_counts(session):
    """Stack rate 1/second, MAX 100. Launcher A's clock runs an hour ahead of B's.

    t=0..32 (A: 3600..3632)  A starts one payload a second: 33 entries, 32 past A's next window.
    t=32.5 (B)               B's window (31.5, 33.5] is empty (A's entries are an hour ahead): B
                             starts one, at 32,500 ms of its clock.
    t=33 (A: 3633)           A starts one; its write keeps the latest 32 entries past its period:
                             A's own, 3601..3632. B's entry at 32,500 is dropped (and A's 3600).
    t=33.2 (B)               B's window holds nothing: B started a second payload 700 ms after its
                             first, at 1/second. Fixed: the book keeps the spans dropped (32.5 s,
                             3600 s) and B, whose window reaches the first, takes no grant until its
                             clock is a period past it, at 33.5 (docs/protocol.md, "Rate limits").
    """
    clock = FakeClock()
    stack = build_stack(session, max_concurrency=100, clock=clock, rates=RateDefaults(stack=Rate(1, 1)))
    ahead = SkewedClock(clock, HOUR)
    a = Runtime(stack.settings, session=stack.session, clock=ahead, client_config=NO_RETRY)
    b = Runtime(stack.settings, session=stack.session, clock=clock, client_config=NO_RETRY)
    a_starts, b_starts = timed_starts(a, ahead, []), timed_starts(b, clock, [])
    for i in range(50):
        stack.send({"id": f"p{i}"}, group=f"g{i}")

    for i in range(KEPT_PAST + 1):
        clock.advance(1.0 if i else 0.0)
        a.launcher().tick()
    assert len(a_starts) == KEPT_PAST + 1
    clock.advance(0.5)  # t = 32.5
    b.launcher().tick()
    assert len(b_starts) == 1
    clock.advance(0.5)
    a.launcher().tick()
    book = a.rates().persistence.load()
    assert round(b_starts[0][0] * 1000) not in dict(book.windows[STACK])  # the drop fired
    clock.advance(0.2)
    b.launcher().tick()

    b_times = [t for t, _ in b_starts]
    assert busiest_window(b_times, 1) <= 1, (
        f"B started {len(b_times)} payloads at {b_times} of its clock under a rate of 1/second"
    )
    clock.advance(0.3)  # t = 33.5, a period past B's dropped grant: B starts again
    b.launcher().tick()
    assert len(b_starts) == 2
