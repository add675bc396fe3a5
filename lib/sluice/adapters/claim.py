"""A claim as a store is asked for it (``Store.claim``): one value, for both stores' parts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Claim:
    key: str
    name: str
    message_id: str
    now: float
    claim_expires_at: float
    arn: str | None = None
    once: bool = False
    ckey: str | None = None  # its concurrency key (sluice.features.keys), ``ticket`` when a wake sent it
    ticket: str | None = None
    lane: str | None = None  # its lane (sluice.features.lanes)
    fair_newcomer: bool = False  # refused while any concurrency key has waiters
    uncapped: bool = False  # its key has no default cap (a claim from a fair lane, sluice.features.fair)
    copy_id: str | None = None  # the SQS message id of the copy claiming: the owner of its start mark
