"""What the ``sluice`` command's tests share: the plain stack named by SLUICE_* variables (``env``)
and the command run on it in-process (``cli``). A module that needs another stack defines its own."""

from __future__ import annotations

import pytest

from handlers import _shared
from tests.support.cli import sluice, use_env


@pytest.fixture
def env(stack, monkeypatch):
    """The plain stack (MAX 5, no lanes), named by SLUICE_* variables; the handlers' cached
    runtime reset before and after."""
    use_env(monkeypatch, stack, SLUICE_MAX_CONCURRENCY="5")
    _shared.reset()
    yield stack
    _shared.reset()


@pytest.fixture
def cli(env, capsys):
    """``sluice ARGV...`` with the test's boto3 session: service models load once, not per command."""
    return lambda *argv: sluice(capsys, *argv, session=env.session)
