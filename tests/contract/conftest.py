"""The store under contract: MemoryStore, and DynamoStore on moto."""

from __future__ import annotations

import pytest

from sluice.adapters.dynamo.store import DynamoStore, create_table
from sluice.adapters.memory.store import MemoryStore
from tests.contract.stores import RETENTION


@pytest.fixture(params=["memory", "dynamodb"])
def store(request):
    if request.param == "memory":
        yield MemoryStore(retention_seconds=RETENTION)
        return
    session = request.getfixturevalue("session")
    client = session.client("dynamodb")
    create_table(client, "contract")
    yield DynamoStore(client, "contract", retention_seconds=RETENTION, slots_per_shard=2)
