"""Hypothesis profiles for the reliability suite, and the fault report printed at the end.

The profile comes from ``HYPOTHESIS_PROFILE`` (``fast``, the default, or ``soak``). Profiles are
applied to this suite's tests only; other Hypothesis tests keep their own settings.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis.database import DirectoryBasedExampleDatabase

from tests.support.faults import FAULTS, STATS

_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "reliability-fast",
    max_examples=int(os.environ.get("RELIABILITY_EXAMPLES", "10")),
    stateful_step_count=int(os.environ.get("RELIABILITY_STEPS", "20")),
    deadline=None,
    derandomize=True,  # `make test` explores the same programs every run; the soak explores
    database=None,
    print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
)
settings.register_profile(
    "reliability-soak",
    max_examples=int(os.environ.get("SOAK_EXAMPLES", "100")),
    stateful_step_count=int(os.environ.get("SOAK_STEPS", "50")),
    deadline=None,
    derandomize=False,
    database=DirectoryBasedExampleDatabase(".hypothesis/examples"),
    print_blob=True,
    suppress_health_check=_SLOW_IS_FINE,
)


def profile_name() -> str:
    name = os.environ.get("HYPOTHESIS_PROFILE", "fast")
    return name if name.startswith("reliability-") else f"reliability-{name}"


def profile() -> settings:
    return settings.get_profile(profile_name())


def summarise(terminalreporter, exitstatus) -> None:
    """The section printed at the end of a run (tests/conftest.py's ``pytest_terminal_summary``, so
    that the controller of a pytest-xdist run prints it too, with every worker's counts)."""
    if not STATS["examples"]:
        return
    chosen = profile()
    write = terminalreporter.write_line
    terminalreporter.section("reliability suite")
    write(
        f"profile {profile_name()}: {STATS['examples']} examples, {STATS['steps']} steps "
        f"(up to {chosen.stateful_step_count} steps each), {sum(FAULTS.values())} faults injected"
    )
    if profile_name() != "reliability-soak" and not os.environ.get("RELIABILITY_REPORT"):
        return
    for kind, n in sorted(FAULTS.items()):
        write(f"  {kind:<40} {n:>8}")
    rules = {k.removeprefix("action:"): v for k, v in STATS.items() if k.startswith("action:")}
    write("actions: " + ", ".join(f"{k} {v}" for k, v in sorted(rules.items())))
    traffic = {k: v for k, v in STATS.items() if k.startswith(("messages", "executions"))}
    write("traffic: " + ", ".join(f"{k} {v}" for k, v in sorted(traffic.items())))
    report = os.environ.get("RELIABILITY_REPORT")
    if report:
        Path(report).parent.mkdir(parents=True, exist_ok=True)
        Path(report).write_text(
            json.dumps(
                {
                    "profile": profile_name(),
                    "examples": STATS["examples"],
                    "steps": STATS["steps"],
                    "faults": dict(sorted(FAULTS.items())),
                    "actions": dict(sorted(rules.items())),
                    "traffic": dict(sorted(traffic.items())),
                    "exit_status": int(exitstatus),
                },
                indent=2,
            )
            + "\n"
        )
