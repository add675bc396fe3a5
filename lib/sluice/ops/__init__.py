"""Operator operations behind the ``sluice`` command, as plain functions over a ``Runtime``.

Each function does one thing an operator asks for and returns plain data (dicts and dataclasses)
that the CLI prints as a table or as JSON. AWS failures arrive as ``sluice.core.errors`` exceptions.

    maximum.py     read MAX, set-max, pause, resume (the SSM parameter and its tags)
    lanes.py       a lane's MAX, pause and resume (its LANE# setting and its pool's caps), every lane
    status.py      the overview and one payload's history
    room.py        what holds starts now (MAX, pause, the pools, lanes, a key's line), why a tick stopped
    dlq.py         list, redrive and delete dead-lettered messages
    local_tick.py  one launcher tick, run here
    semaphore.py   a semaphore's limit, one semaphore's holders and waiters, every semaphore

Nothing here runs in Lambda; the package is left out of the Lambda zip (serverless.yml).
"""

from sluice.ops.dlq import (
    MOVED_BY_SQS,
    DlqListing,
    DlqMessage,
    DlqReport,
    dlq_delete,
    dlq_list,
    dlq_redrive,
    redrive_dedup_id,
)
from sluice.ops.local_tick import tick
from sluice.ops.maximum import PAUSED_AT_TAG, RESUME_TAG, MaxState, pause, read_max, resume, set_max
from sluice.ops.status import oldest_age, overview, payload_history

__all__ = [
    "MOVED_BY_SQS",
    "PAUSED_AT_TAG",
    "RESUME_TAG",
    "DlqListing",
    "DlqMessage",
    "DlqReport",
    "MaxState",
    "dlq_delete",
    "dlq_list",
    "dlq_redrive",
    "oldest_age",
    "overview",
    "pause",
    "payload_history",
    "read_max",
    "redrive_dedup_id",
    "resume",
    "set_max",
    "tick",
]
