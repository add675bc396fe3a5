"""MAX, pause and resume.

MAX is the SSM parameter the launcher reads every tick (cached ``SLUICE_MAX_CACHE_SECONDS``) and
puts in force in the slots' caps. ``set-max``, ``pause`` and ``resume`` write the parameter and then
the caps themselves (``apply_max``), so the new MAX admits or stops the very next claim, from a
completion's refill as from a tick; the caps are stamped with the parameter's change time, and a
launcher still holding the value from before never puts it back. A failure between the two writes
loses nothing: the next tick reads the parameter and moves the caps.

``pause`` first tags the parameter with the value in force (``sluice:resume-max``) and then writes 0,
so a failure in between loses nothing; ``resume`` writes the remembered value back and removes the
tag. Nothing remembered: the deployed default (``SLUICE_MAX_CONCURRENCY``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sluice.adapters.aws.ssm import MaxParameter, parse_max
from sluice.core.errors import ConfigurationError, Contended
from sluice.runtime import Runtime

RESUME_TAG = "sluice:resume-max"
PAUSED_AT_TAG = "sluice:paused-at"
REMEMBERED = (RESUME_TAG, PAUSED_AT_TAG)  # what ``resume`` and a MAX set since the pause remove


@dataclass(frozen=True, slots=True)
class MaxState:
    """The MAX parameter as it stands: its raw value, and what ``pause`` remembered on it."""

    parameter: str
    exists: bool
    raw: str | None = None
    value: int | None = None  # None when missing or not a whole number >= 0
    error: str | None = None  # why ``raw`` is not a usable MAX
    remembered: int | None = None  # the value ``pause`` saved, if any
    paused_at: str | None = None

    @property
    def paused(self) -> bool:
        return self.value == 0


def _parameter(rt: Runtime) -> MaxParameter:
    if not rt.settings.max_parameter:
        raise ConfigurationError(
            "no MAX parameter: the stack output MaxConcurrencyParameter is missing and SLUICE_MAX_PARAMETER "
            "is not set, so MAX is the fixed deployed default and cannot change at run time"
        )
    return rt.max_parameter()


def read_max(rt: Runtime) -> MaxState:
    parameter = _parameter(rt)
    name = parameter.name
    raw = parameter.raw()
    if raw is None:
        return MaxState(parameter=name, exists=False)
    value: int | None = None
    error: str | None = None
    try:
        value = parse_max(raw, source=name)
    except ConfigurationError as exc:
        error = str(exc)
    tags = parameter.tags()
    remembered: int | None = None
    if RESUME_TAG in tags:
        try:
            remembered = parse_max(tags[RESUME_TAG], source=RESUME_TAG)
        except ConfigurationError:
            remembered = None
    return MaxState(name, True, raw, value, error, remembered, tags.get(PAUSED_AT_TAG))


def apply_max(rt: Runtime) -> dict[str, Any]:
    """Put the parameter's MAX in force in the slots' caps now: MAX − external, merged with the
    source of the limit in force (``LimitSource``): a newer MAX or a newer external count that a
    tick put there is kept."""
    reading = _parameter(rt).reading()
    store = rt.store()
    ledger = store.ledger()
    try:
        in_force = store.set_limit(ledger.source(reading))
    except Contended:  # the parameter is written: the next tick's first receive brings it to the caps
        return {
            "limit": store.ledger().in_force,
            "running": len(ledger.holders),
            "external": ledger.external,
            "contended": True,
        }
    return {"limit": in_force, "running": len(ledger.holders), "external": ledger.external}


def set_max(rt: Runtime, value: int) -> dict[str, Any]:
    """Write MAX, and put it in force. A value above 0 also ends a pause: the remembered value is dropped."""
    parse_max(str(value), source="MAX")
    before = read_max(rt)
    parameter = _parameter(rt)
    parameter.write(value)
    cleared = None
    if value > 0 and before.remembered is not None:
        parameter.untag(REMEMBERED)
        cleared = before.remembered
    return {
        "parameter": before.parameter,
        "before": before.value if before.exists else None,
        "before_raw": before.raw,
        "max": value,
        "cleared_resume_max": cleared,
        **apply_max(rt),
    }


def pause(rt: Runtime, deployed_default: Callable[[], int | None] = lambda: None) -> dict[str, Any]:
    """MAX → 0, remembering the value in force on the parameter's tag first."""
    state = read_max(rt)
    running = len(rt.store().ledger().holders)
    result: dict[str, Any] = {"parameter": state.parameter, "running": running, "max": 0}
    if state.paused:
        result.update(changed=False, before=0, remembered=state.remembered, paused_at=state.paused_at)
        return result
    # The value the launcher uses now: the parameter, or the deployed default when it is missing.
    in_force = state.value if state.exists else deployed_default()
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    parameter = _parameter(rt)
    if state.exists:
        if in_force is not None:
            parameter.tag({RESUME_TAG: str(in_force), PAUSED_AT_TAG: now})
        parameter.write(0)
    else:
        tags = {PAUSED_AT_TAG: now}
        if in_force is not None:
            tags[RESUME_TAG] = str(in_force)
        parameter.create(0, tags)
    result.update(
        changed=True,
        before=in_force,
        before_raw=state.raw,
        before_error=state.error,
        remembered=in_force,
        paused_at=now,
        **apply_max(rt),
    )
    return result


def resume(rt: Runtime, deployed_default: Callable[[], int | None] = lambda: None) -> dict[str, Any]:
    """Restore the value ``pause`` remembered, or the deployed default when nothing was remembered."""
    state = read_max(rt)
    result: dict[str, Any] = {"parameter": state.parameter, "before": state.value, "before_raw": state.raw}
    if not state.exists:
        # The launcher uses the deployed default: nothing is paused.
        result.update(changed=False, max=None, dropped_resume_max=None)
        return result
    parameter = _parameter(rt)
    if not state.paused and state.error is None:
        if state.remembered is not None:
            parameter.untag(REMEMBERED)  # MAX was changed by other means since the pause
        result.update(changed=False, max=state.value, dropped_resume_max=state.remembered)
        return result
    default = None if state.remembered is not None else deployed_default()
    if state.remembered is not None:
        target, source = state.remembered, "remembered"
    elif default is not None:
        target, source = default, "deployed default"
    else:
        raise ConfigurationError(
            f"nothing to resume to: {state.parameter} has no {RESUME_TAG} tag and the deployed default is "
            "unknown (set SLUICE_MAX_CONCURRENCY, or use `sluice set-max N`)"
        )
    parameter.write(target)
    if state.remembered is not None or state.paused_at is not None:
        parameter.untag(REMEMBERED)
    result.update(
        changed=True,
        max=target,
        source=source,
        paused_at=state.paused_at,
        **apply_max(rt),
    )
    return result
