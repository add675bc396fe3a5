"""``python -m tests.explorer``: run the explorer (``make explore``, ``make explore-long``).

    --seed N          the first seed (default: a fresh random one, printed)
    --runs R          runs, seeds N, N+1, ... (default 1 with --seed, else 20)
    --minutes M       instead of a number of runs: fresh seeds until M minutes of CPU have passed
    --steps S         steps per run (default 40)
    --schedule 0,3,1  replay these draws (with --seed and --steps): the line a failure prints
    --shrink S        seconds to spend shrinking a failure (default 120; 0: no shrinking)
    --swarm           each run draws a profile: some actors and faults left out, others more
                      frequent (swarm testing; the profile is part of the run's draws)
    --without a,b     leave these producers out (tests/explorer/actors.py, PRODUCERS: e.g. forged)
    --ignore 'a;b'    a failure whose text holds one of these is counted and passed over (a known
                      break, while its fix is elsewhere): the exploration goes on to the next seed

Stops at the first failure: prints its seed, the failure, the shrunk schedule as a ``make explore``
line and as a pytest function, and exits 1. Runs with PYTHONHASHSEED=0 (it re-executes itself if
need be), so that a schedule replays the same on any machine.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

from tests.explorer.shrink import shrink
from tests.explorer.sim import explore
from tests.support.emulator import as_in_the_suite
from tests.support.faults import FAULTS


def replay_text(seed: int, steps: int, draws: list[int], without: frozenset[str], swarm: bool = False) -> str:
    schedule = ",".join(map(str, draws))
    left_out = ",".join(sorted(without))
    return (
        f"  make explore SEED={seed} STEPS={steps} SCHEDULE={schedule}"
        + (f" WITHOUT={left_out}" if left_out else "")
        + (" SWARM=1" if swarm else "")
        + "\n"
        "or, as a test (tests/explorer/):\n\n"
        "from tests.explorer.replay import replays\n\n\n"
        f"def test_explorer_seed_{seed}():\n"
        f"    replays(seed={seed}, steps={steps}, schedule=[{', '.join(map(str, draws))}]"
        + (f", without={tuple(sorted(without))!r}" if without else "")
        + (", swarm=True" if swarm else "")
        + ")\n"
    )


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tests.explorer", *(argv or sys.argv[1:])])
    as_in_the_suite()  # moto as make test meets it (tests/support/emulator.py)
    parser = argparse.ArgumentParser(prog="python -m tests.explorer")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--runs", type=int)
    parser.add_argument("--minutes", type=float)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--schedule", default="")
    parser.add_argument("--shrink", type=float, default=120.0)
    parser.add_argument("--without", default="")
    parser.add_argument("--swarm", action="store_true")
    parser.add_argument("--ignore", default="")
    parser.add_argument("--trace", action="store_true", help="print every run's trace")
    args = parser.parse_args(argv)
    without = frozenset(x for x in args.without.split(",") if x)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    if args.schedule:
        draws = [int(x) for x in args.schedule.split(",") if x.strip()]
        outcome = explore(seed, args.steps, draws, without=without, swarm=args.swarm)
        print("\n".join(outcome.trace))
        print(
            f"replayed seed {seed}, {args.steps} steps, {len(draws)} draws: "
            + (outcome.failure or "no failure")
        )
        return 1 if outcome.failure else 0
    runs = args.runs if args.runs is not None else (1 if args.seed is not None and not args.minutes else 20)
    started = time.process_time()
    calls = 0
    n = 0
    ignore = [x for x in args.ignore.split(";") if x]
    ignored = 0
    print(f"explorer: first seed {seed}, {args.steps} steps per run", flush=True)
    while True:
        if args.minutes is not None:
            if time.process_time() - started > args.minutes * 60:
                break
        elif n >= runs:
            break
        run_seed = seed + n
        outcome = explore(run_seed, args.steps, without=without, swarm=args.swarm)
        n += 1
        calls += outcome.calls
        if args.trace:
            print("\n".join(outcome.trace))
        cpu = time.process_time() - started
        print(
            f"seed {run_seed}: {'FAILED' if outcome.failure else 'ok'} "
            f"({outcome.calls} calls, {outcome.cpu:.2f} s CPU; total {calls} calls, {cpu:.1f} s CPU, "
            f"{calls / cpu:.0f} calls/CPU-s)",
            flush=True,
        )
        if outcome.failure and any(x in outcome.failure for x in ignore):
            ignored += 1
            print(f"  passed over (--ignore): {outcome.failure.splitlines()[0][:160]}", flush=True)
            continue
        if outcome.failure:
            print(
                f"\nseed {run_seed} broke a promise after {cpu:.1f} s CPU (this process):\n{outcome.failure}\n"
            )
            if args.shrink > 0:
                shrunk = shrink(
                    run_seed, args.steps, outcome, budget=args.shrink, without=without, swarm=args.swarm
                )
                print(
                    f"\nshrunk in {shrunk.runs} runs, {shrunk.seconds:.0f} s: {len(shrunk.draws)} draws, {shrunk.steps} steps"
                )
                print("\n".join(shrunk.outcome.trace))
                print(
                    f"\n{shrunk.failure}\n\nreplay it:\n{replay_text(run_seed, shrunk.steps, shrunk.draws, without, args.swarm)}"
                )
            else:
                print(f"replay it:\n{replay_text(run_seed, args.steps, outcome.draws, without, args.swarm)}")
            return 1
    print(
        f"\n{n} runs ({ignored} passed over), {calls} calls, {time.process_time() - started:.1f} s CPU: no promise broken"
    )
    print(
        "faults: "
        + ", ".join(f"{k} {v}" for k, v in sorted(FAULTS.items()) if k.startswith(("explorer", "stale")))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
