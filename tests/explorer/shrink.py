"""Shrinking a failing run: delta debugging on its list of draws, each candidate run again.

A candidate is kept when it fails the same way (``category``). Passes, repeated while one helps:
fewer steps (a failure before the end needs none after it), chunks of draws deleted (halves down to
single draws), draws set to 0 (the plainest choice), draws lowered by one. Trailing zeros are
dropped: a replayed list that runs out answers 0.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.explorer.sim import Outcome, explore


def category(failure: str) -> str:
    """What kind of failure: the promise named on its first line, or the exception an invocation raised."""
    first = failure.splitlines()[0] if failure else ""
    raised = re.search(r"raised (\w+)", first)
    if raised:
        return f"raised {raised.group(1)}"
    if "failed with no fault" in first:
        return "failed with no fault"
    return first.split(":", 1)[0].strip()


def failed_at(failure: str) -> int | None:
    """The step a failure was found after, if it was found during the steps."""
    found = re.findall(r"\(step (\d+)\)", failure)
    return int(found[-1]) if found else None


def normal(draws: list[int]) -> list[int]:
    out = list(draws)
    while out and out[-1] == 0:
        out.pop()
    return out


@dataclass
class Shrunk:
    seed: int
    steps: int
    draws: list[int]
    failure: str
    runs: int
    seconds: float
    outcome: Outcome


def shrink(
    seed: int,
    steps: int,
    outcome: Outcome,
    *,
    budget: float = 120.0,
    without: frozenset[str] = frozenset(),
    swarm: bool = False,
    log: Callable[[str], None] = print,
) -> Shrunk:
    assert outcome.failure is not None
    kind = category(outcome.failure)
    best = normal(outcome.draws)
    best_steps = steps
    best_outcome = outcome
    deadline = time.monotonic() + budget
    runs = 0
    start = time.monotonic()

    def attempt(draws: list[int], n_steps: int) -> bool:
        nonlocal best, best_steps, best_outcome, runs
        if time.monotonic() > deadline:
            return False
        runs += 1
        out = explore(seed, n_steps, draws, without=without, swarm=swarm)
        if out.failure is None or category(out.failure) != kind:
            return False
        best, best_steps, best_outcome = normal(out.draws), n_steps, out
        return True

    at = failed_at(outcome.failure)
    if at is not None and at + 1 < steps:
        attempt(best, at + 1)
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        at = failed_at(best_outcome.failure or "")
        if at is not None and at + 1 < best_steps and attempt(best, at + 1):
            improved = True
        size = max(1, len(best) // 2)
        while size >= 1 and time.monotonic() < deadline:
            i = 0
            while i < len(best) and time.monotonic() < deadline:
                candidate = best[:i] + best[i + size :]
                if candidate != best and attempt(candidate, best_steps):
                    improved = True
                else:
                    i += size
            size //= 2
        for i in range(len(best)):
            if i < len(best) and best[i] and attempt([*best[:i], 0, *best[i + 1 :]], best_steps):
                improved = True
        for i in range(len(best)):
            if (
                i < len(best)
                and best[i] > 1
                and attempt([*best[:i], best[i] - 1, *best[i + 1 :]], best_steps)
            ):
                improved = True
        log(f"  shrinking: {len(best)} draws, {best_steps} steps after {runs} runs")
    assert best_outcome.failure is not None
    return Shrunk(seed, best_steps, best, best_outcome.failure, runs, time.monotonic() - start, best_outcome)
