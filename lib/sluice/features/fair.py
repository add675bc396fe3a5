"""Fair lanes: a lane that serves its tenants round-robin instead of in arrival order.

A lane is fair when its setting ends in ``fair`` (``lanes=name:max:priority:weight:fair``). A
tenant is the message's concurrency key (``sluice-concurrency-key``); messages without one are one
tenant, ``lane:<name>``. A fair lane's queue only passes messages through to the waiting room:

    first receives, kept in hand while each brings a tenant not in hand yet (a tenant's messages
    in one FIFO group, as ``sluice enqueue`` sends them: SQS skips the groups in hand)
    receive (any number: nothing waits in the queue, so nothing spends receives there)
      new message      ──► nobody waits: claim at once, no default cap (``fair_newcomer``: the
                           claim checks ``KEYS_WAITING`` is empty); of several tenants in hand,
                           each tenant's share of the free slots (``share_out``), the rest as
                           below; else, or the lane is full ──► park in its tenant's line
                           (sluice.features.keys: KWAIT#, the key marked ``fair = <lane>`` in the
                           same transaction) ──► delete
      woken (ticket)   ──► claim: global slot + lane slot + tenant slot ──► start
                           no room (another waker's, a lowered MAX) ──► park again, at the back
    wake_lane: free = min(lane free, global free) − waiters woken whose claim has not landed;
               each free slot to the backlogged tenant with the fewest runs (holding a slot or
               woken), ties drawn at random; each tenant's oldest waiters sent back

So a tenant with 1,000 payloads queued and one with 10 get the same number of slots while both
are backlogged, and a tenant alone in the lane gets all of them at once (an idle fair lane costs
what an ordinary one does). Nothing running is ever stopped: a tenant that took the lane alone
gives each slot it frees to the tenants that came since. The lane's admission (the tick's
share, a completion's freed slot) is: receive and park what is new, wake, then receive and claim
what was woken. A tenant's own cap (``sluice set-max N --key KEY``) still holds it; the default
``keyConcurrency`` does not apply to a claim from a fair lane (``uncapped``: its lane's MAX does).

Two wakers reading the same room send too many: the extra waiters find no room when they arrive
and park again. Their claim, not the waker, is what is exact. A tenant's waiters are woken only
by its lane's waker (a release, the sweep and ``sluice set-max --key`` leave them to it), so a
release does not hand its slot back to its own tenant.

The cost: every message of a fair lane is parked once and sent once more, and the waker reads
every key with waiters (``KEYS_WAITING``), then their items, to find its lane's tenants, and the
lane's room: in the benchmark's tenants workload about 12 calls per start more than an ordinary
lane. A batch's messages of one tenant park one after another (on the tenant's next ticket), those
of different tenants side by side. A pass over the queue runs until it is empty, so the waiters it
wakes are never left behind messages not parked yet. No receive of a pass waits: a lingering
tick paces its empty rounds with a 1 s sleep instead (``LaneAdmission._lane_rounds``).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Mapping

from sluice.core.model import Message
from sluice.core.ports import Queue
from sluice.core.records import KeyState, Lane
from sluice.features.keys import FAIR_UNCAPPED, KeyStore, concurrency_key, gate_room, wake
from sluice.features.stores import LaunchStore

UNKEYED = "lane:"  # + the lane's name: the tenant of a fair lane's messages without a key
TENANT_GROUP = "tenant:"  # + the tenant: how a fair lane's admission groups a batch's messages


def tenant(message: Message, lane: Lane) -> str:
    """The tenant ``message`` is served as in fair ``lane``. A bad key is an ``InvalidPayload``."""
    return concurrency_key(message) or UNKEYED + lane.name


def share_out(
    free: int,
    states: Mapping[str, KeyState],
    *,
    now: float,
    rng: random.Random,
    gate_rooms: Mapping[str, int] | None = None,
    waiting: Mapping[str, int] | None = None,
) -> dict[str, int]:
    """``free`` slots among the tenants ``states``: one at a time to the tenant with waiters, room
    under its own cap (and its gate, ``gate_rooms``), and the fewest runs (holding or woken); ties
    drawn by ``rng``. A tenant its gate holds gets none: the others take the slots. ``waiting``:
    how many each tenant wants, when not its line's waiters (a pass's newcomers in hand)."""
    heap: list[tuple[int, float, str]] = []
    want: dict[str, int] = {}
    for ckey, state in states.items():
        wanted = state.waiting if waiting is None else waiting.get(ckey, 0)
        want[ckey] = min(wanted, state.room(FAIR_UNCAPPED, now))
        if gate_rooms is not None:
            want[ckey] = min(want[ckey], gate_rooms.get(ckey, want[ckey]))
        if want[ckey] > 0:
            heap.append((len(state.holders) + state.kept(now), rng.random(), ckey))
    heapq.heapify(heap)
    given: dict[str, int] = {}
    for _ in range(max(0, free)):
        if not heap:
            break
        load, tie, ckey = heapq.heappop(heap)
        given[ckey] = given.get(ckey, 0) + 1
        if given[ckey] < want[ckey]:
            heapq.heappush(heap, (load + 1, tie, ckey))
    return given


def wake_lane(
    *,
    store: LaunchStore,
    queue: Queue,
    lane: Lane,
    now: float,
    rng: random.Random,
    at_most: int | None = None,
) -> int:
    """Share fair ``lane``'s free slots (at most ``at_most``) among its backlogged tenants and send
    their waiters back to the queue. Returns how many were sent."""
    keys: KeyStore = store
    waiting = sorted(keys.keys_waiting())
    if not waiting:
        return 0
    states = {k: s for k, s in keys.key_states(waiting).items() if s.fair == lane.name}
    if not states:
        return 0
    room = store.lane_rooms([lane.name], whole=True)[lane.name]
    kept = sum(s.kept(now) for s in states.values())
    free = min(room.free, store.look().free) - kept
    if at_most is not None:
        free = min(free, at_most)
    gate_rooms = {k: gate_room(keys, k, now, s.waiting, s.kept(now)) for k, s in states.items() if s.waiting}
    plan = share_out(free, states, now=now, rng=rng, gate_rooms=gate_rooms)
    sent = 0
    for ckey, state in states.items():
        if plan.get(ckey) or state.stale(now) or (state.waiting == 0 and not state.inflight):
            # Those given slots; those whose woken waiters' slots have lapsed (dropped); those
            # whose line is empty (off the sweep's list, and no longer the lane's tenant).
            sent += wake(
                store=keys,
                queue=queue,
                ckey=ckey,
                now=now,
                at_most=plan.get(ckey, 0),
                by_lane=lane.name,
                tidy=True,
                seen=state,
            )
    return sent
