"""``MemoryStore``'s side of concurrency keys (``sluice.features.keys.KeyStore``), for tests and the benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sluice.adapters.memory.table import MemoryTable
from sluice.core.errors import KeyFull
from sluice.core.records import KeyState, ticket_number
from sluice.features.keys import DEFAULT_KEY_CONCURRENCY, FAIR_UNCAPPED, KeyWaiter, check_cap, entry


class MemoryKeys:
    def __init__(self, table: MemoryTable, key_concurrency: int = DEFAULT_KEY_CONCURRENCY) -> None:
        self.table = table
        self.key_concurrency = key_concurrency  # the default cap; an operator may change it
        self.keys: dict[str, KeyState] = {}
        self.key_waiters_at: dict[tuple[str, int], KeyWaiter] = {}
        self.wait_of: dict[str, KeyWaiter] = {}
        self.waiting_keys: set[str] = set()  # as KEYS_WAITING: left only by forget_key

    def any_waiting(self) -> bool:
        """Called under the lock by a fair newcomer's claim: some key has waiters."""
        return bool(self.waiting_keys)

    # -- called under the store's lock by claim, release and adopt ---------------------------------

    def admits(self, ckey: str, *, ticket: str | None, uncapped: bool = False) -> None:
        state = self.keys.get(ckey, KeyState(ckey))
        room = len(state.holders) < state.limit(FAIR_UNCAPPED if uncapped else self.key_concurrency)
        if not room or (ticket is None and (state.waiting > 0 or state.inflight)):
            raise KeyFull(state)

    def hold(self, ckey: str, name: str, ticket: str | None = None) -> None:
        keys = self.keys
        state = keys.get(ckey, KeyState(ckey))
        if ticket is not None and ticket not in state.inflight:
            # Claimed before the wake that sent it noted its entry (``sluice.features.keys``).
            keys[ckey] = replace(state, holders=state.holders | {name}, landed=state.landed | {ticket})
            return
        keys[ckey] = replace(state, holders=state.holders | {name}, inflight=state.inflight - {ticket})

    def free(self, ckey: str, name: str) -> None:
        keys = self.keys
        state = keys.get(ckey, KeyState(ckey))
        keys[ckey] = replace(state, holders=state.holders - {name})

    # -- KeyStore ----------------------------------------------------------------------------------

    def key_state(self, ckey: str) -> KeyState:
        with self.table.lock:
            return self.keys.get(ckey, KeyState(ckey))

    def key_states(self, ckeys: Sequence[str]) -> dict[str, KeyState]:
        with self.table.lock:
            keys = self.keys
            return {k: keys.get(k, KeyState(k)) for k in ckeys}

    def park_for_key(
        self, waiter: KeyWaiter, *, tickets: int, replaces: str | None = None, fair: str | None = None
    ) -> bool:
        with self.table.lock:
            keys, waiters = self.keys, self.key_waiters_at
            state = keys.get(waiter.ckey, KeyState(waiter.ckey))
            if state.tickets != tickets:
                return False
            waiters[(waiter.ckey, tickets)] = replace(waiter, ticket=tickets)
            self.wait_of[waiter.key] = replace(waiter, ticket=tickets)
            self.waiting_keys.add(waiter.ckey)
            keys[waiter.ckey] = replace(
                state,
                tickets=tickets + 1,
                inflight=state.inflight - {replaces},
                landed=state.landed | {replaces} if replaces is not None else state.landed,
                fair=fair if fair is not None else state.fair,
            )
            return True

    def key_waiters(self, ckey: str, tickets: Sequence[int]) -> list[KeyWaiter]:
        with self.table.lock:
            waiters = self.key_waiters_at
            return [waiters[(ckey, t)] for t in sorted(tickets) if (ckey, t) in waiters]

    def advance_key(self, ckey: str, *, woken: int, to: int, now: float, drop: Sequence[str] = ()) -> bool:
        with self.table.lock:
            keys, waiters = self.keys, self.key_waiters_at
            state = keys.get(ckey, KeyState(ckey))
            if state.woken != woken:
                return False
            for ticket in range(woken, to):
                waiters.pop((ckey, ticket), None)
            added = {entry(t, now) for t in range(woken, to)}
            keys[ckey] = replace(
                state,
                woken=to,
                inflight=(state.inflight - set(drop)) | added,
                landed=state.landed - set(drop),
            )
            return True

    def keys_waiting(self) -> frozenset[str]:
        with self.table.lock:
            return frozenset(self.waiting_keys)

    def key_wait_of(self, key: str) -> KeyWaiter | None:
        with self.table.lock:
            return self.wait_of.get(key)

    def drop_inflight(self, ckey: str, entries: Sequence[str]) -> None:
        with self.table.lock:
            keys = self.keys
            if ckey in keys:
                state = keys[ckey]
                unnoted = {e for e in entries if state.woken <= ticket_number(e) < state.tickets}
                keys[ckey] = replace(
                    state, inflight=state.inflight - set(entries), landed=state.landed | unnoted
                )

    def keep_inflight(self, ckey: str, entries: Sequence[str]) -> None:
        with self.table.lock:
            keys = self.keys
            state = keys.get(ckey, KeyState(ckey))
            keys[ckey] = replace(
                state, inflight=state.inflight | set(entries), landed=state.landed - set(entries)
            )

    def forget_key(self, ckey: str) -> None:
        with self.table.lock:
            keys = self.keys
            state = keys.get(ckey, KeyState(ckey))
            if state.waiting == 0 and not state.inflight:
                self.waiting_keys.discard(ckey)
                if ckey in keys:
                    keys[ckey] = replace(state, fair=None, landed=frozenset())

    def set_key_cap(self, ckey: str, cap: int | None) -> None:
        with self.table.lock:
            keys = self.keys
            state = keys.get(ckey, KeyState(ckey))
            keys[ckey] = replace(state, cap=None if cap is None else check_cap(cap))
