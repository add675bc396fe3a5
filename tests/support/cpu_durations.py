"""CPU seconds per test, for a machine whose wall times are noisy (issue #26).

``pytest --cpu-durations=30`` (tests/conftest.py loads this plugin; ``make test
PYTEST_ARGS=--cpu-durations=30``) prints, after the run, the tests whose setup, call and teardown took
the most CPU (user + system, of the process running the test and of the child processes it waited for:
osls, a moto server, a demo), then the CPU seconds per module and per directory. Under pytest-xdist
each worker measures its own tests and the controller adds them up. Without the option it prints nothing.
"""

from __future__ import annotations

import resource
from collections import defaultdict

import pytest


def _cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_addoption(parser):
    parser.getgroup("terminal reporting").addoption(
        "--cpu-durations",
        type=int,
        default=None,
        metavar="N",
        help="show the N tests that took the most CPU seconds (0: all), and CPU seconds per module",
    )


def _measured(item, when):
    start = _cpu()
    yield
    item.stash.setdefault(_KEY, {})[when] = _cpu() - start


_KEY = pytest.StashKey[dict]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _measured(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _measured(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _measured(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().cpu_seconds = item.stash.get(_KEY, {}).get(call.when, 0.0)


class _Totals:
    def __init__(self) -> None:
        self.by_test: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.by_test[report.nodeid] += float(getattr(report, "cpu_seconds", 0.0) or 0.0)

    def pytest_terminal_summary(self, terminalreporter):
        n = terminalreporter.config.getoption("cpu_durations")
        write = terminalreporter.write_line
        ranked = sorted(self.by_test.items(), key=lambda kv: -kv[1])
        terminalreporter.section(f"CPU seconds: {sum(self.by_test.values()):.1f} in {len(ranked)} tests")
        for nodeid, seconds in ranked[: n or None]:
            write(f"{seconds:8.2f}  {nodeid}")
        modules: dict[str, float] = defaultdict(float)
        dirs: dict[str, float] = defaultdict(float)
        for nodeid, seconds in ranked:
            module = nodeid.split("::", 1)[0]
            modules[module] += seconds
            dirs[module.rsplit("/", 1)[0]] += seconds
        write("per module:")
        for module, seconds in sorted(modules.items(), key=lambda kv: -kv[1]):
            write(f"{seconds:8.2f}  {module}")
        write("per directory:")
        for d, seconds in sorted(dirs.items(), key=lambda kv: -kv[1]):
            write(f"{seconds:8.2f}  {d}")


def pytest_configure(config):
    if config.getoption("cpu_durations") is not None and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Totals(), "cpu-durations-totals")
