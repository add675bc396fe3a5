"""Lanes: several limits, queues and priorities in one deployment.

A lane has a name, its own MAX, a priority (higher first, default 0) and a weight (default 1). Each
lane has its own FIFO queue, so the launcher never receives a message it has no room for, and its
own slot pool (``SLOTS#lane-<name>``, sharded like the global pool, ``sluice.primitives.slots``). The global
MAX still caps the sum: a start holds a slot of its lane and one of the global pool, taken in the
claim's one transaction and given back in the release's, so overlapping launchers and completions
never exceed either limit.

Free global slots go to lanes by priority, then by weight among lanes of equal priority:

    tick        for each priority, highest first: the global room is split among its lanes in
                proportion to their weights (each capped by its own room); a lane that runs out of
                messages gives the rest of its share back to the others, then to lower priorities
    completion  the slot one execution freed goes to the first lane, by priority, that has room
                and a message; among lanes of equal priority the order is drawn at random in
                proportion to the weights (no state is shared between completions, and the draw
                gives each lane its weight's share over many of them)

Configuration: ``SLUICE_LANES`` (stack parameter ``lanes``) is ``name:max[:priority[:weight[:fair]]]``,
comma-separated. Without it there is one lane, ``default``, and no lane pool: everything is as
before lanes. The lane ``default`` is the stack's payload queue; if the setting does not name it,
it is implied, and its MAX follows the global MAX in force (each tick puts it in its caps). A lane's MAX is changed at run time by ``sluice set-max N
--lane NAME`` (an override kept in ``LANE#<name>``, until ``sluice set-max default --lane NAME``),
``sluice pause --lane NAME`` and ``sluice resume --lane NAME``. A lane marked ``fair`` serves its tenants (concurrency keys)
round-robin instead of in arrival order (``sluice.features.fair``). A lane starts the stack's state machine
unless ``SLUICE_LANE_STATE_MACHINES`` (stack parameter ``laneStateMachines``, ``lane=arn,...``) gives
it its own (``StepFunctionsExecutions.for_lane``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence

from sluice.core.errors import ConfigurationError
from sluice.core.records import MAX_LANE_LIMIT, Lane

DEFAULT_LANE = "default"
LANE_ATTRIBUTE = "sluice-lane"  # stamped on a lane's messages when received: a parked one goes back there
MAX_LANES = 20
MAX_NAME = 20
_DIGITS = re.compile(r"[0-9]+", re.ASCII)
MAX_PRIORITY = 100
MAX_WEIGHT = 100
NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


def check_lane_name(name: str) -> str:
    if len(name) > MAX_NAME or not NAME.match(name):
        raise ConfigurationError(
            f"bad lane name {name!r}: lowercase letters and digits in words joined by '-', "
            f"starting with a letter, at most {MAX_NAME} characters"
        )
    return name


def parse_lanes(text: str, default_max: int) -> tuple[Lane, ...]:
    """The lanes of ``SLUICE_LANES``: ``()`` when it is empty (one lane, no lane pool); otherwise
    every lane named, with ``default`` added (MAX ``default_max``) if it is not. Raises
    ``ConfigurationError`` naming the bad part."""
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    lanes: list[Lane] = []
    for part in parts:
        if not part:
            raise ConfigurationError(f"lanes {text!r}: an empty lane (two commas, or a trailing comma)")
        fields = part.split(":")
        if len(fields) < 2 or len(fields) > 5:
            raise ConfigurationError(f"lanes: {part!r}: use name:max[:priority[:weight[:fair]]]")
        name = check_lane_name(fields[0].strip())
        maximum = _whole(part, "max", fields[1], 0, MAX_LANE_LIMIT)
        priority = _whole(part, "priority", fields[2], 0, MAX_PRIORITY) if len(fields) > 2 else 0
        weight = _whole(part, "weight", fields[3], 1, MAX_WEIGHT) if len(fields) > 3 else 1
        fair = False
        if len(fields) > 4:
            if fields[4].strip() != "fair":
                raise ConfigurationError(f"lanes: {part!r}: the fifth field may only be 'fair'")
            fair = True
        if any(lane.name == name for lane in lanes):
            raise ConfigurationError(f"lanes: {name!r} is named twice")
        twin = next((lane for lane in lanes if _resource_id(lane.name) == _resource_id(name)), None)
        if twin is not None:  # the stack names each lane's resources after it (stack/lanes.js)
            raise ConfigurationError(
                f"lanes: {twin.name!r} and {name!r} would share the resource name "
                f"Lane{_resource_id(name)}Queue: rename one"
            )
        lanes.append(Lane(name, maximum, priority, weight, fair))
    if not lanes:
        return ()
    if not any(lane.name == DEFAULT_LANE for lane in lanes):
        lanes.append(Lane(DEFAULT_LANE, default_max, implied=True))
    if len(lanes) > MAX_LANES:
        raise ConfigurationError(f"lanes: {len(lanes)} lanes, at most {MAX_LANES}")
    return tuple(lanes)


def _resource_id(name: str) -> str:
    return "".join(word[:1].upper() + word[1:] for word in name.split("-"))


def _whole(part: str, what: str, raw: str, low: int, high: int) -> int:
    text = raw.strip()
    # ASCII digits only: "²".isdigit() is true and int("²") raises ValueError; a short one only.
    if not _DIGITS.fullmatch(text) or len(text) > 9 or not low <= int(text) <= high:
        raise ConfigurationError(f"lanes: {part!r}: {what} must be a whole number from {low} to {high}")
    return int(text)


def parse_lane_queues(text: str) -> dict[str, str]:
    """``SLUICE_LANE_QUEUES``: ``name=url,...`` for the lanes other than ``default``."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, url = part.partition("=")
        if not sep or not url.strip():
            raise ConfigurationError(f"SLUICE_LANE_QUEUES: {part!r}: use name=queue-url")
        out[check_lane_name(name.strip())] = url.strip()
    return out


STATE_MACHINE_ARN = re.compile(r"^arn:aws[a-zA-Z-]*:states:[a-z0-9-]+:[0-9]{12}:stateMachine:[^:\s]{1,80}$")


def parse_lane_state_machines(text: str, lanes: Sequence[Lane]) -> dict[str, str]:
    """``SLUICE_LANE_STATE_MACHINES`` (stack parameter ``laneStateMachines``): ``lane=arn,...``, the
    state machine a lane starts instead of the stack's. Each lane must be configured, each ARN a
    state machine's. Raises ``ConfigurationError`` naming the bad part."""
    out: dict[str, str] = {}
    names = {lane.name for lane in lanes}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, arn = (x.strip() for x in part.partition("="))
        if not sep or not arn:
            raise ConfigurationError(f"lane state machines: {part!r}: use lane=state-machine-arn")
        if name not in names:
            known = ", ".join(sorted(names)) or "none (SLUICE_LANES is empty)"
            raise ConfigurationError(f"lane state machines: {name!r} is not a lane; the lanes are {known}")
        if not STATE_MACHINE_ARN.match(arn):
            raise ConfigurationError(
                f"lane state machines: {arn!r} (lane {name!r}) is not a state machine ARN"
            )
        if name in out:
            raise ConfigurationError(f"lane state machines: lane {name!r} is given twice")
        out[name] = arn
    return out


def by_priority(lanes: Sequence[Lane]) -> list[list[Lane]]:
    """The lanes in groups of equal priority, highest first, each group in its declared order."""
    groups: dict[int, list[Lane]] = {}
    for lane in lanes:
        groups.setdefault(lane.priority, []).append(lane)
    return [groups[p] for p in sorted(groups, reverse=True)]


def split(room: int, lanes: Sequence[Lane], rooms: Mapping[str, int]) -> dict[str, int]:
    """``room`` global slots shared among ``lanes`` (of one priority) by weight, none past its own
    room (``rooms``): largest remainders, then what a lane cannot take goes to the others."""
    share = {lane.name: 0 for lane in lanes}
    open_ = [lane for lane in lanes if rooms.get(lane.name, 0) > 0]
    left = room
    while left > 0 and open_:
        total = sum(lane.weight for lane in open_)
        exact = {lane.name: left * lane.weight / total for lane in open_}
        give = {name: int(x) for name, x in exact.items()}
        rest = left - sum(give.values())
        for name in sorted(exact, key=lambda n: exact[n] - give[n], reverse=True)[:rest]:
            give[name] += 1
        moved = 0
        for lane in open_:
            take = min(give[lane.name], rooms[lane.name] - share[lane.name])
            share[lane.name] += take
            moved += take
        left -= moved
        open_ = [lane for lane in open_ if share[lane.name] < rooms[lane.name]]
        if moved == 0:
            break
    return share


def refill_order(lanes: Sequence[Lane], rng: random.Random) -> list[Lane]:
    """The order a completion offers its freed slot in: by priority; within a priority, a draw
    without replacement weighted by the lanes' weights."""
    order: list[Lane] = []
    for group in by_priority(lanes):
        order.extend(sorted(group, key=lambda lane: rng.random() ** (1.0 / lane.weight), reverse=True))
    return order
