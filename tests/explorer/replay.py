"""Replaying a schedule the explorer printed, as a plain test."""

from __future__ import annotations

from tests.explorer.sim import explore


def replays(
    *, seed: int, steps: int, schedule: list[int], without: tuple[str, ...] = (), swarm: bool = False
) -> None:
    """Run seed ``seed`` for ``steps`` steps with these draws; fail as the run fails."""
    outcome = explore(seed, steps, schedule, without=frozenset(without), swarm=swarm)
    assert outcome.failure is None, outcome.failure + "\n" + "\n".join(outcome.trace[-40:])
