"""Every promise, under every fault the suite knows, in random order: see tests/reliability/machine.py."""

from __future__ import annotations

import pytest

from tests.reliability.conftest import profile
from tests.reliability.machine import SluiceMachine

TestSluice = SluiceMachine.TestCase
TestSluice.settings = profile()

pytestmark = pytest.mark.slow
