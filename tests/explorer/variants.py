"""``python -m tests.explorer.variants NAME``: can the explorer find a broken variant by itself?

Each variant here is one of the project's broken variants (tests/reliability/test_broken_variants.py),
applied as that file applies it (a patch of Sluice's code for the duration of a run). The explorer
then runs from fresh seeds, with its generic actors and faults only, until it finds a broken
promise or its CPU budget is spent, and reports, per seed: found or not, the CPU time to the first
failure, the shrunk schedule's length.

    python -m tests.explorer.variants renew_always [b1_listing_order ...|all] --seeds 5 --minutes 4 \\
        [--without forged] [--swarm] [--misses 2]

Each result is one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.explorer.broken import VARIANTS, patch
from tests.explorer.shrink import category, shrink
from tests.explorer.sim import explore
from tests.support.emulator import as_in_the_suite


@contextmanager
def applied(name: str) -> Iterator[None]:
    saved = patch(VARIANTS[name][1])
    try:
        yield
    finally:
        patch(saved)


def hunt(
    name: str,
    seed: int,
    minutes: float,
    steps: int,
    without: frozenset[str],
    ignore: tuple[str, ...] = (),
    swarm: bool = False,
    shrink_budget: float = 60.0,
) -> dict[str, Any]:
    """Fresh runs from ``seed`` on, the variant applied, until a failure the variant causes or
    ``minutes`` of CPU. A failure is the variant's when the same draws, replayed on the code as it
    is, do not fail the same way (the code as it is may break promises of its own)."""
    started = time.process_time()
    n = 0
    baseline: list[int] = []  # seeds where the code as it is fails too
    while time.process_time() - started < minutes * 60:
        run_seed = seed + n
        with applied(name):
            outcome = explore(run_seed, steps, without=without, swarm=swarm)
        n += 1
        if not outcome.failure:
            continue
        if any(x in outcome.failure for x in ignore):  # a break of the code as it is, known
            baseline.append(run_seed)
            continue
        unpatched = explore(run_seed, steps, outcome.draws, without=without, swarm=swarm)
        if unpatched.failure and category(unpatched.failure) == category(outcome.failure):
            baseline.append(run_seed)
            continue
        cpu = time.process_time() - started
        with applied(name):
            shrunk = shrink(
                run_seed,
                steps,
                outcome,
                budget=shrink_budget,
                without=without,
                swarm=swarm,
                log=lambda _: None,
            )
        return {
            "variant": name,
            "seed": seed,
            "found": True,
            "runs": n,
            "baseline_failures_skipped": len(baseline),
            "baseline_seeds": baseline,
            "cpu_to_failure": round(cpu, 1),
            "failing_seed": run_seed,
            "shrunk_draws": len(shrunk.draws),
            "shrunk_steps": shrunk.steps,
            "schedule": ",".join(map(str, shrunk.draws)),
            "failure": shrunk.failure.splitlines()[0][:300],
        }
    return {
        "variant": name,
        "seed": seed,
        "found": False,
        "runs": n,
        "baseline_failures_skipped": len(baseline),
        "baseline_seeds": baseline,
        "cpu": round(time.process_time() - started, 1),
    }


def main() -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tests.explorer.variants", *sys.argv[1:]])
    as_in_the_suite()  # moto as make test meets it (tests/support/emulator.py)
    parser = argparse.ArgumentParser(prog="python -m tests.explorer.variants")
    parser.add_argument("variant", nargs="+", help="variant names (tests/explorer/broken.py), or: all")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--without", default="")
    parser.add_argument("--swarm", action="store_true")
    parser.add_argument("--shrink", type=float, default=60.0, help="seconds to shrink a failure")
    parser.add_argument(
        "--misses", type=int, default=0, help="stop a variant at this many seeds not finding it (0: never)"
    )
    parser.add_argument(
        "--ignore", default="", help="failures holding one of these ';'-separated texts are passed over"
    )
    args = parser.parse_args()
    ignore = tuple(x for x in args.ignore.split(";") if x)
    without = frozenset(x for x in args.without.split(",") if x)
    names = sorted(VARIANTS) if args.variant == ["all"] else args.variant
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(sorted(VARIANTS))}")
    for name in names:
        print(f"variant {name}: {VARIANTS[name][0]}", flush=True)
        missed = 0
        for _ in range(args.seeds):
            seed = random.SystemRandom().randrange(1, 2**31)
            result = hunt(name, seed, args.minutes, args.steps, without, ignore, args.swarm, args.shrink)
            print(json.dumps(result), flush=True)
            missed += not result["found"]
            if args.misses and missed == args.misses:  # at 2 of 5 seeds, the aim (4 of 5) is out of reach
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
