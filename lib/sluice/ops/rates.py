"""Rate limits at run time (``sluice set-rate``) and as they stand (``sluice status``): the rate in
force for the stack, each lane and each concurrency key set at run time, the starts in its current
window and when the next one is due."""

from __future__ import annotations

from typing import Any

from sluice.core.errors import ConfigurationError
from sluice.core.validation import check_key
from sluice.features.rate_limits import (
    KEY_PREFIX,
    NONE,
    STACK,
    Rate,
    ScopeStatus,
    key_scope,
    lane_scope,
    parse_rate,
)
from sluice.runtime import Runtime


def scope_of(rt: Runtime, lane: str | None, key: str | None = None) -> str:
    if key is not None:
        return key_scope(check_key(key, source="--key"))
    if lane is None:
        return STACK
    if not rt.settings.lanes:
        raise ConfigurationError("no lanes configured: a rate is the stack's (leave out --lane)")
    return lane_scope(rt.settings.lane(lane).name)


def set_rate(rt: Runtime, value: str, *, lane: str | None = None, key: str | None = None) -> dict[str, Any]:
    """Set a scope's rate from the next start on: ``N/second|minute|hour``, ``none`` (no rate,
    whatever the stack's parameter) or ``default`` (the parameter's again)."""
    scope = scope_of(rt, lane, key)
    text = value.strip().lower()
    wanted: Rate | str | None = (
        NONE if text == NONE else None if text == "default" else parse_rate(value, source="RATE")
    )
    rates, now = rt.rates(), rt.clock.now()
    (before,) = rates.status([scope], now)
    rates.set(scope, wanted)
    (after,) = rates.status([scope], now)
    return {"scope": scope, "before": as_dict(before), **as_dict(after)}


def rate_status(rt: Runtime) -> list[dict[str, Any]]:
    """Every scope that has a rate in force, or one set at run time; the keys' default
    (``keyRateLimit``) as ``key:*``, and each key whose rate was set at run time."""
    rates = rt.rates()
    scopes = [STACK, *(lane_scope(lane.name) for lane in rt.settings.lanes), *rates.keys_set()]
    out = [as_dict(s) for s in rates.status(scopes, rt.clock.now()) if s.rate or s.overridden]
    if rt.settings.rates.key is not None:
        out.append(
            {**as_dict(ScopeStatus(f"{KEY_PREFIX}*", rt.settings.rates.key, False, 0, None)), "default": True}
        )
    return out


def as_dict(status: ScopeStatus) -> dict[str, Any]:
    return {
        "scope": status.scope,
        "rate": str(status.rate) if status.rate else None,
        "set_at_run_time": status.overridden,
        "in_window": status.in_window,
        "next_due": status.next_due,
    }
