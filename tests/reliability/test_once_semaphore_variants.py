"""Broken variants of two fences, each patched in for one test: the scenario that pins the fence down
passes on Sluice as it is and must fail with the variant, on a broken promise or a wrong AWS state.

- A run-once key's success put back under TTL (sluice.receipts): by a plain run's release, or by
  a dead letter of the key (tests/integration/test_once_ttl_moto.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from sluice.adapters.dynamodb import DynamoStore
from sluice.model import PayloadState
from tests.integration import test_once_ttl_moto as once_ttl
from tests.support.aws import moto_session

# -- a run-once key's success re-armed for TTL ----------------------------------------------------


def test_a_release_that_sets_an_expiry_on_a_once_keys_success_is_caught(monkeypatch):
    release_items = DynamoStore._release_items

    def expiring(self: DynamoStore, record: Any, ending: Any, *, awaited: bool, kept: bool = False) -> Any:
        items = release_items(self, record, ending, awaited=awaited, kept=False)
        lease = items[1]["Update"]
        lease["ConditionExpression"] = lease["ConditionExpression"].replace(
            " AND attribute_not_exists(once_by)", ""
        )
        return items

    monkeypatch.setattr(DynamoStore, "_release_items", expiring)
    with pytest.raises(AssertionError, match="ran again after retentionDays"), moto_session() as session:
        once_ttl.test_a_once_success_outlives_retention_whatever_touches_its_key_after_it(
            session, (once_ttl.PLAIN_RUN,)
        )


def test_a_dead_letter_that_sets_an_expiry_on_a_once_keys_success_is_caught(monkeypatch):
    def expiring(self: DynamoStore, *, key: str, reason: str, now: float) -> None:
        self._update_if(
            f"PAYLOAD#{key}",
            "SET #key = :key, #state = :invalid, reason = :reason, updated_at = :now, expires_at = :exp",
            "attribute_not_exists(holder)",
            {
                ":key": {"S": key},
                ":invalid": {"S": PayloadState.INVALID.value},
                ":reason": {"S": reason},
                ":now": {"N": repr(now)},
                ":exp": {"N": str(int(now) + self.retention_seconds)},
            },
            names={"#key": "key", "#state": "state"},
        )

    monkeypatch.setattr(DynamoStore, "record_invalid", expiring)
    with pytest.raises(AssertionError, match="ran again after retentionDays"), moto_session() as session:
        once_ttl.test_a_once_success_outlives_retention_whatever_touches_its_key_after_it(
            session, (once_ttl.DEAD_LETTER,)
        )
