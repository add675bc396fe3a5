"""``@exclusive`` never admits more than its limit, with 16 invocations at once, deadlines, slow
releases and skewed clocks: see tests/reliability/exclusive_machine.py. On MemoryLeases with the
profile's examples; on moto's DynamoDB with a quarter of them."""

from __future__ import annotations

from hypothesis import settings

from tests.reliability.conftest import profile
from tests.reliability.exclusive_machine import DynamoExclusiveMachine, MemoryExclusiveMachine

MOTO_SHARE = 4

TestExclusiveOnMemory = MemoryExclusiveMachine.TestCase
TestExclusiveOnMemory.settings = profile()

TestExclusiveOnDynamo = DynamoExclusiveMachine.TestCase
TestExclusiveOnDynamo.settings = settings(
    profile(), max_examples=max(2, profile().max_examples // MOTO_SHARE)
)
