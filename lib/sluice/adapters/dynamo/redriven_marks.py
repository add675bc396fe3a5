"""A key's redriven marks, in the launcher's table (``Store.mark_redriven``, ``clear_redriven``):
reconciliation marks a key for a run redriven behind Sluice's back that it did not adopt, and no
claim takes the key's lease until the mark is lifted or the run adopted. A part of
``sluice.adapters.dynamo.store.DynamoStore``.
"""

from __future__ import annotations

from sluice.adapters.dynamo.codec import payload_pk, values
from sluice.adapters.dynamo.table import TableRef
from sluice.core.model import PayloadRecord

# A key's redriven marks: on a key that has a record, while the run they name does not hold it
# (another run does, or none: a redrive reconciliation is unsure of, ``sluice.launch.redriven``).
NOT_HELD_BY_IT = "attribute_exists(pk) AND (attribute_not_exists(holder) OR holder <> :name) AND "
# A mark this clock may stamp: the key's only one, unmarked or stamped by this clock.
STAMPABLE = (
    "attribute_not_exists(redriven_more) AND "
    "(attribute_not_exists(redriven) OR (redriven = :name AND redriven_by = :by))"
)


class RedrivenMarks:
    def __init__(self, db: TableRef) -> None:
        self.db = db

    def mark_redriven(self, *, key: str, name: str, now: float, by: str | None = None) -> bool:
        # The key's first mark in ``redriven``; one more while it names another run goes into the
        # set ``redriven_more``, never over it (each unadopted redriven run keeps the key marked).
        # Only a key's one mark is stamped (``redriven_at`` by clock ``by``): first on an unmarked
        # key, or again by that clock at each sighting of its run. Any other write of a mark removes
        # the stamp, so no mark is judged by another's sighting, nor by one older than the run's
        # latest redrive a reconciliation saw.
        named = values(name=name, now=now)
        if by is not None and self.db.update_if(
            payload_pk(key),
            "SET redriven = :name, updated_at = :now, redriven_at = :now, redriven_by = :by",
            NOT_HELD_BY_IT + STAMPABLE,
            {**named, ":by": {"S": by}},
            names={},
        ):
            return True
        unstamp = " REMOVE redriven_at, redriven_by"
        free = NOT_HELD_BY_IT + "(attribute_not_exists(redriven) OR redriven = :name)"
        if self.db.update_if(
            payload_pk(key), "SET redriven = :name, updated_at = :now" + unstamp, free, named, names={}
        ):
            return True
        more, named[":names"] = "SET updated_at = :now ADD redriven_more :names" + unstamp, {"SS": [name]}
        return self.db.update_if(payload_pk(key), more, NOT_HELD_BY_IT + "redriven <> :name", named, names={})

    def clear_redriven(self, *, key: str, name: str, as_read: PayloadRecord | None = None) -> bool:
        named = {**values(name=name), ":names": {"SS": [name]}}
        # Lifted on the age of the stamp it read: a sighting since (a new stamp, or none) keeps it.
        condition, first_named = "redriven = :name", values(name=name)
        if as_read is not None and as_read.redriven_at is not None:
            condition += " AND redriven_at = :at AND redriven_by = :by"
            first_named[":at"] = {"N": repr(as_read.redriven_at)}
            first_named[":by"] = {"S": as_read.redriven_by or ""}
        elif as_read is not None:
            condition += " AND attribute_not_exists(redriven_at)"
        first = self.db.update_if(
            payload_pk(key), "REMOVE redriven, redriven_at, redriven_by", condition, first_named, names={}
        )
        more = self.db.update_if(
            payload_pk(key), "DELETE redriven_more :names", "contains(redriven_more, :name)", named, names={}
        )
        return first or more
