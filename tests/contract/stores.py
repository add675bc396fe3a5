"""Helpers of the store contract."""

from __future__ import annotations

from typing import Any

from sluice.core.limits import LimitSource
from sluice.core.model import Claim

NOW = 1_800_000_000.0
RETENTION = 7 * 86_400


def claim(
    store, key: str, name: str, *, limit: int = 5, message_id: str = "m", now: float = NOW, **extra: Any
) -> None:
    """Put ``limit`` in force (unfenced, as a tick of one launcher would), then claim under it;
    ``extra``: the claim's other arguments (``ckey``, ``ticket``, ``lane``)."""
    store.set_limit(LimitSource(limit, None))
    store.claim(
        Claim(
            key=key,
            name=name,
            message_id=message_id,
            now=now,
            claim_expires_at=now + 900,
            arn=f"arn:aws:states:us-east-1:123456789012:execution:sm:{name}",
            **extra,
        )
    )
