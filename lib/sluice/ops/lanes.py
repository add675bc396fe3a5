"""Lanes at run time (``sluice.features.lanes``): a lane's MAX, pause and resume, and every lane's state.

``set-max N --lane``, ``pause --lane`` and ``resume --lane`` write the lane's setting
(``LANE#<name>``) and then its pool's caps (``Store.set_lane_limit``), both stamped with the
setting's ``changed_at``: the new limit binds the very next claim in the lane, from a completion's
refill as from a tick, and a tick that read the setting before never puts the old limit back. A
failure between the two writes loses nothing: the next tick reads the setting and moves the caps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluice.core.records import Lane, LaneRoom, LaneSetting
from sluice.ops.parked import parked_by_lane
from sluice.runtime import Runtime

STAMP_STEP = 0.001  # a setting's stamp is after the one it replaces, whatever this machine's clock says


class Keep:
    """A field of the lane's setting that the command leaves as it is."""


KEEP = Keep()


def describe(lane: Lane, setting: LaneSetting | None, room: LaneRoom) -> dict[str, Any]:
    """One lane as an operator reads it: its configuration, its setting, its pool."""
    setting = setting or LaneSetting(lane.name)
    return {
        "lane": lane.name,
        "priority": lane.priority,
        "weight": lane.weight,
        "fair": lane.fair,
        "configured_max": lane.max,
        "max": setting.max,  # the run-time MAX (None: the configured one)
        "paused": setting.paused,
        "changed_at": setting.changed_at or None,
        "wanted": setting.limit(lane),  # the limit the setting asks for
        "limit": room.limit if room.exists else None,  # the limit in force in the pool (None: no tick yet)
        "running": room.running,
        "free": room.free if room.exists else None,
    }


def lane_states(rt: Runtime, lanes: Sequence[Lane]) -> list[dict[str, Any]]:
    """Every lane's configuration, setting and pool (one read of the settings, one of the pools)."""
    names = [lane.name for lane in lanes]
    store = rt.store()
    settings = store.lane_settings(names)
    rooms = store.lane_rooms(names, whole=True)
    return [describe(lane, settings.get(lane.name), rooms[lane.name]) for lane in lanes]


def lane_overview(rt: Runtime, lanes: Sequence[Lane]) -> list[dict[str, Any]]:
    """``lane_states`` with each lane's queue: visible (waiting), in flight and delayed messages;
    what waits parked in the table to go back to it (``sluice.ops.parked``); a fair lane's also
    with its tenants and the payloads waiting in their lines (``sluice.features.fair``)."""
    queue = rt.queue()
    out = []
    tenants: dict[str, list[Any]] = {}
    if any(lane.fair for lane in lanes):
        store = rt.store()
        for key_state in store.key_states(sorted(store.keys_waiting())[:100]).values():
            if key_state.fair is not None:
                tenants.setdefault(key_state.fair, []).append(key_state)
    parked = parked_by_lane(rt.store())
    for state in lane_states(rt, lanes):
        state.update(parked=parked.of(state["lane"]), parked_partial=parked.partial)
        if state["fair"]:
            own = tenants.get(state["lane"], [])
            state.update(tenants=len(own), in_lines=sum(k.waiting for k in own))
        depth = queue.for_lane(state["lane"]).depth()
        state.update(
            waiting=depth.get("ApproximateNumberOfMessages", 0),
            in_flight=depth.get("ApproximateNumberOfMessagesNotVisible", 0),
            delayed=depth.get("ApproximateNumberOfMessagesDelayed", 0),
        )
        out.append(state)
    return out


def change_lane(
    rt: Runtime, lane: Lane, *, maximum: int | Keep | None = KEEP, paused: bool | Keep = KEEP
) -> dict[str, Any]:
    """Write ``lane``'s setting with ``maximum`` (None: back to the configured MAX) and ``paused``,
    each kept as it is when not given, then put its limit in force in the lane's pool at once."""
    store = rt.store()
    old = store.lane_settings([lane.name]).get(lane.name) or LaneSetting(lane.name)
    before = describe(lane, old, store.lane_rooms([lane.name], whole=True)[lane.name])
    new_max = old.max if isinstance(maximum, Keep) else maximum
    new_paused = old.paused if isinstance(paused, Keep) else paused
    if (new_max, new_paused) == (old.max, old.paused) and before["limit"] == old.limit(lane):
        return {"lane": lane.name, "changed": False, "in_force": True, "before": before, "after": before}
    setting = LaneSetting(
        lane.name,
        max=new_max,
        paused=new_paused,
        changed_at=max(rt.clock.now(), old.changed_at + STAMP_STEP),
    )
    store.write_lane_setting(setting)
    written = store.set_lane_limit(lane.name, setting.limit(lane), setting.changed_at)
    after = describe(lane, setting, store.lane_rooms([lane.name], whole=True)[lane.name])
    return {
        "lane": lane.name,
        "changed": True,
        "in_force": written is not None,  # False: a limit with a newer stamp is in the pool
        "before": before,
        "after": after,
    }
