"""The semaphore's promises under crashes, late events and limit changes, in random programs: see
tests/reliability/semaphore_machine.py. On the memory store with the profile's examples; on moto's
DynamoDB with a quarter of them (each example there costs a few hundred requests)."""

from __future__ import annotations

from hypothesis import settings

from tests.reliability.conftest import profile
from tests.reliability.semaphore_machine import DynamoSemaphoreMachine, MemorySemaphoreMachine

MOTO_SHARE = 4

TestSemaphoreOnMemory = MemorySemaphoreMachine.TestCase
TestSemaphoreOnMemory.settings = profile()

TestSemaphoreOnDynamo = DynamoSemaphoreMachine.TestCase
TestSemaphoreOnDynamo.settings = settings(
    profile(), max_examples=max(2, profile().max_examples // MOTO_SHARE)
)
