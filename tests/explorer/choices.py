"""The explorer's decisions: drawn from a seeded ``random.Random`` and recorded, or replayed.

Every choice the explorer makes (which actor proceeds, what a producer sends, whether a call
crashes, how old a view of Step Functions is) is one ``draw``: an integer in ``range(n)``. A run is
a pure function of its list of draws, so a failing run replays from that list alone, and a shrinker
can delete or lower draws and run again (delta debugging on the choice sequence, as Hypothesis
does). 0 is always the plainest choice (resume the first actor waiting, no fault, a fresh view); a
replayed list that runs out answers 0 from then on, which lets a shortened schedule still run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


class Choices:
    def __init__(self, seed: int = 0, replay: Sequence[int] | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.replay = list(replay) if replay is not None else None
        self.made: list[int] = []

    def draw(self, n: int, weights: Sequence[float] | None = None) -> int:
        """A choice in ``range(n)``; ``weights`` for a fresh draw (none: uniform)."""
        if n <= 1:
            return 0
        if self.replay is not None:
            i = len(self.made)
            value = min(self.replay[i], n - 1) if i < len(self.replay) else 0
            if weights is not None and not weights[value]:
                value = next(v for v, w in enumerate(weights) if w)  # a choice this run leaves out
        elif weights is not None:
            value = self.rng.choices(range(n), weights=weights)[0]
        else:
            value = self.rng.randrange(n)
        self.made.append(value)
        return value

    def chance(self, p: float) -> bool:
        """True with probability ``p`` in a fresh draw (1 of 2 choices; 0 is False)."""
        return self.draw(2, (1.0 - p, p)) == 1

    def pick(self, items: Sequence[object], weights: Sequence[float] | None = None) -> object:
        return items[self.draw(len(items), weights)]
