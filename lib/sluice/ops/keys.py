"""Concurrency keys at run time: a key's own cap (``sluice set-max N --key KEY``) and its line."""

from __future__ import annotations

from typing import Any

from sluice.core.errors import ConfigurationError
from sluice.core.records import KeyState
from sluice.core.validation import MAX_CEILING
from sluice.features import keys
from sluice.runtime import Runtime


def describe(state: KeyState, default: int, now: float) -> dict[str, Any]:
    return {
        "key": state.key,
        "cap": state.limit(default),
        "own_cap": state.cap,
        "running": len(state.holders),
        "waiting": state.waiting,
        "on_the_way": state.kept(now),
        **({"fair_lane": state.fair} if state.fair is not None else {}),
    }


def set_key_max(rt: Runtime, key: str, cap: int | None) -> dict[str, Any]:
    """Give ``key`` its own cap (None: back on the stack's ``keyConcurrency``), then wake its line:
    a higher cap starts its oldest waiters now, not at the key's next end. A cap is 0 (pauses the
    key) to ``MAX_CEILING``, as MAX."""
    if cap is not None and not 0 <= cap <= MAX_CEILING:
        raise ConfigurationError(f"a key's cap must be from 0 to {MAX_CEILING:,}, not {cap}")
    store = rt.store()
    now = rt.clock.now()
    before = describe(store.key_state(key), store.key_concurrency, now)
    store.set_key_cap(key, cap)
    woken = keys.wake(store=store, queue=rt.queue(), ckey=key, now=now)
    after = describe(store.key_state(key), store.key_concurrency, now)
    return {"before": before, "after": after, "woken": woken, "default": store.key_concurrency}


def key_status(rt: Runtime, key: str) -> dict[str, Any]:
    store = rt.store()
    return describe(store.key_state(key), store.key_concurrency, rt.clock.now())


def payload_place(rt: Runtime, key: str) -> dict[str, Any] | None:
    """Where payload ``key`` stands in a concurrency key's line, if it ever parked in one."""
    rt.settings.require("table_name")
    store = rt.store()
    place = store.key_wait_of(key)
    if place is None:
        return None
    state = store.key_state(place.ckey)
    waiting = place.ticket >= state.woken
    return {
        "concurrency_key": place.ckey,
        "ticket": place.ticket,
        "message_id": place.message_id,
        "parked_at": place.parked_at,
        "waiting": waiting,
        "ahead": place.ticket - state.woken if waiting else 0,
        "key": describe(state, store.key_concurrency, rt.clock.now()),
    }
