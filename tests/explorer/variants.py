"""``python -m tests.explorer.variants NAME``: can the explorer find a broken variant by itself?

Each variant here is one of the project's broken variants (tests/reliability/test_broken_variants.py),
applied as that file applies it (a patch of Sluice's code for the duration of a run). The explorer
then runs from fresh seeds, with its generic actors and faults only, until it finds a broken
promise or its CPU budget is spent, and reports, per seed: found or not, the CPU time to the first
failure, the shrunk schedule's length.

    python -m tests.explorer.variants renew_always --seeds 5 --minutes 4 [--without forged]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sluice.handover
import sluice.per_message
import sluice.reconcile
from sluice.adapters.dynamodb import DynamoStore
from sluice.model import LimitSource
from tests.explorer.shrink import category, shrink
from tests.explorer.sim import explore


def _random_name(key: str, message_id: str) -> str:
    return f"run-{uuid.uuid4().hex}"


# name -> (what the variant breaks, its patches: (owner, attribute, replacement))
VARIANTS: dict[str, tuple[str, list[tuple[Any, str, Any]]]] = {
    "random_names": (
        "execution names drawn at random (test_random_execution_names_are_caught)",
        [
            (sluice.per_message, "execution_name", _random_name),
            (sluice.handover, "execution_name", _random_name),
        ],
    ),
    "renew_always": (
        "a resume that does not renew its claim (test_a_resume_that_does_not_renew_its_claim_is_caught)",
        [(DynamoStore, "renew", lambda self, **_: True)],
    ),
    "adopt_never": (
        "a redriven execution left out of the ledger (test_a_redriven_execution_left_out_of_the_ledger_is_caught)",
        [(DynamoStore, "adopt", lambda self, **_: False)],
    ),
    "one_stamp": (
        "limits ordered as one stamp (test_limits_ordered_as_one_stamp_are_caught)",
        [(LimitSource, "merged", lambda self, other: self)],
    ),
    "never_sweeps": (
        "a reconciliation that never sweeps the waiting room "
        "(test_a_reconciliation_that_never_sweeps_the_waiting_room_is_caught)",
        [(sluice.reconcile, "sweep", lambda **_: 0)],
    ),
    "start_without_asking": (
        "a resume that starts without asking Step Functions "
        "(test_a_resume_that_starts_without_asking_step_functions_is_caught)",
        [(sluice.per_message.MessageProtocol, "_started_before", lambda self, name: None)],
    ),
}


@contextmanager
def applied(name: str) -> Iterator[None]:
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in VARIANTS[name][1]]
    for owner, attr, value in VARIANTS[name][1]:
        setattr(owner, attr, value)
    try:
        yield
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)


def hunt(
    name: str,
    seed: int,
    minutes: float,
    steps: int,
    without: frozenset[str],
    ignore: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Fresh runs from ``seed`` on, the variant applied, until a failure the variant causes or
    ``minutes`` of CPU. A failure is the variant's when the same draws, replayed on the code as it
    is, do not fail the same way (the code as it is may break promises of its own)."""
    started = time.process_time()
    n = 0
    baseline = 0  # failures the code as it is makes too
    while time.process_time() - started < minutes * 60:
        run_seed = seed + n
        with applied(name):
            outcome = explore(run_seed, steps, without=without)
        n += 1
        if not outcome.failure:
            continue
        if any(x in outcome.failure for x in ignore):  # a break of the code as it is, known
            baseline += 1
            continue
        unpatched = explore(run_seed, steps, outcome.draws, without=without)
        if unpatched.failure and category(unpatched.failure) == category(outcome.failure):
            baseline += 1
            continue
        cpu = time.process_time() - started
        with applied(name):
            shrunk = shrink(run_seed, steps, outcome, budget=60, without=without, log=lambda _: None)
        return {
            "variant": name,
            "seed": seed,
            "found": True,
            "runs": n,
            "baseline_failures_skipped": baseline,
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
        "baseline_failures_skipped": baseline,
        "cpu": round(time.process_time() - started, 1),
    }


def main() -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable, "-m", "tests.explorer.variants", *sys.argv[1:]])
    parser = argparse.ArgumentParser(prog="python -m tests.explorer.variants")
    parser.add_argument("variant", choices=sorted(VARIANTS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--without", default="")
    parser.add_argument(
        "--ignore", default="", help="failures holding one of these ';'-separated texts are passed over"
    )
    args = parser.parse_args()
    ignore = tuple(x for x in args.ignore.split(";") if x)
    without = frozenset(x for x in args.without.split(",") if x)
    print(f"variant {args.variant}: {VARIANTS[args.variant][0]}", flush=True)
    for _ in range(args.seeds):
        seed = random.SystemRandom().randrange(1, 2**31)
        print(hunt(args.variant, seed, args.minutes, args.steps, without, ignore), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
