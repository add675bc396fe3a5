from __future__ import annotations

import json
import os
import sys

import pytest

# Never reach a real account from a test, whatever the machine's environment says.
for _name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
    os.environ.pop(_name, None)
os.environ.update(
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_REGION="us-east-1",
    POWERTOOLS_METRICS_NAMESPACE="Sluice",
    POWERTOOLS_SERVICE_NAME="sluice-test",
    POWERTOOLS_TRACE_DISABLED="1",
)

from tests.support.emulator import as_in_the_suite  # noqa: E402

as_in_the_suite()  # moto as every test meets it, the explorer's command lines too

# `--cpu-durations=N`: CPU seconds per test, module and directory (wall times are noisy on a shared machine).
pytest_plugins = ["tests.support.cpu_durations"]


def pytest_sessionfinish(session):
    """A pytest-xdist worker hands the reliability suite's counts to the controller."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        from tests.support.faults import FAULTS, STATS

        output["reliability"] = json.dumps({"stats": STATS, "faults": FAULTS})


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
    """A pytest-xdist worker leaves at once: its results went to the controller at the session's end
    (``workerfinished``, after every fixture's teardown), and nothing it does after that reaches the
    report. Its exit (threads joined, a heap of moto stacks freed) took 5 to 10 s, which the controller
    waited out."""
    if getattr(config, "workerinput", None) is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from tests.support.faults import FAULTS, STATS

    counts = json.loads(getattr(node, "workeroutput", {}).get("reliability", "{}"))
    STATS.update(counts.get("stats", {}))
    FAULTS.update(counts.get("faults", {}))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    from tests.support.faults import STATS

    if STATS["examples"]:
        from tests.reliability.conftest import summarise

        summarise(terminalreporter, exitstatus)


@pytest.fixture
def session():
    from tests.support.aws import moto_session

    with moto_session() as s:
        yield s


@pytest.fixture
def stack(session):
    from tests.support.aws import build_stack

    return build_stack(session)


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test`: ``--dist loadgroup``), the slow tests go first, and the tests
    of a module that share a module- or class-scoped fixture (a packaged stack, a benchmark run) go to
    one worker, so the fixture is built once, as in a serial run; every other test goes wherever a
    worker is free."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    # The tests marked slow or deploy are handed out first, so that no worker is left running one at
    # the end while the others have nothing left.
    items.sort(
        key=lambda item: item.get_closest_marker("slow") is None and item.get_closest_marker("deploy") is None
    )
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d.scope in ("module", "class", "package") for chain in defs for d in chain):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


@pytest.fixture
def make_world():
    """Worlds made by a scenario (``tests.reliability.world.World(**kwargs)``), closed afterwards."""
    from tests.reliability.world import World

    worlds: list[World] = []

    def make(**kwargs):
        worlds.append(World(**kwargs))
        return worlds[-1]

    try:
        yield make
    finally:
        for world in worlds:
            world.close()
