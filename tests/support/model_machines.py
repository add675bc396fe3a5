"""The state machines, as the reference model (``tests.support.model``) knows them: which machine
each claim was recorded on, and which machines the operator switched from and deleted.

Two dead letters of a valid payload are documented outcomes of such a deletion (docs/protocol.md),
and the model accepts them only in exactly their situation:

* a claim on a vanished machine: the message's own claim ``N`` was recorded on machine ``M``, ``M``
  was deleted and is not the stack's machine, and the DLQ entry's reason is
  ``its claim N is on state machine M, no longer used and deleted: …`` (whether it ran there cannot
  be known, so it is not started again);
* a run-once key whose run-once run vanished: a ``sluice-once`` message of key ``k``, and a run
  ``N`` of ``k`` claimed for a ``sluice-once`` message on a machine vanished as above, named by the
  reason ``run-once key 'k': the outcome of its run N is unknown …`` (it may have SUCCEEDED, so the
  key does not run once more by itself).

Anything else (another reason, a machine not deleted, the machine in use, another message's claim)
is still a valid payload dead-lettered: a broken promise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

VANISHED_REASON = "its claim {name} is on state machine {machine}, no longer used and deleted"
ONCE_UNKNOWN_REASON = "run-once key {key!r}: the outcome of its run {name} is unknown"


def machine_of(arn: str) -> str:
    """The state machine's name in a state machine or execution ARN (``arn:aws:states:r:a:kind:M…``)."""
    parts = arn.split(":")
    return parts[6] if len(parts) > 6 else ""


class Machines:
    """Not thread safe on its own: the model calls it under its lock."""

    def __init__(self) -> None:
        self.current: str | None = None  # the stack's machine, once the test switched it
        self.deleted: set[str] = set()
        self.claimed_on: dict[str, str] = {}  # execution name -> the machine its record names

    # -- the test's own actions ------------------------------------------------------------------

    def switched(self, state_machine_arn: str) -> None:
        self.current = machine_of(state_machine_arn)

    def deleted_machine(self, state_machine_arn: str) -> None:
        self.deleted.add(machine_of(state_machine_arn))

    # -- what Sluice wrote -----------------------------------------------------------------------

    def claimed(self, name: str, item: Mapping[str, Any]) -> None:
        """A claim's ``EXEC#`` Put: the execution ARN it records names its machine."""
        arn = item.get("arn", {}).get("S")
        if arn:
            self.claimed_on[name] = machine_of(arn)

    def renewed(self, name: str, params: Mapping[str, Any]) -> None:
        """A renewal that moves the claim to the machine in use now (``:arn``)."""
        arn = params.get("ExpressionAttributeValues", {}).get(":arn", {}).get("S")
        if arn:
            self.claimed_on[name] = machine_of(arn)

    def vanished(self, name: str) -> str | None:
        """The machine ``name``'s claim is on, when it was deleted and is not the stack's."""
        machine = self.claimed_on.get(name)
        if machine is None or machine not in self.deleted or self.current in (None, machine):
            return None  # (no switch seen: the machine deleted is the stack's own)
        return machine

    def excused(
        self,
        message_id: str,
        reason: str,
        *,
        claims: Mapping[str, str],
        key_of: Callable[[str], str | None],
        once: Callable[[str], bool],
    ) -> bool:
        """Whether a valid payload's dead letter is one of the two documented outcomes above.
        ``claims``: execution name -> message id of its claim; ``key_of`` and ``once``: of a message id."""
        for name, claimed_for in claims.items():
            machine = self.vanished(name)
            if machine is None:
                continue
            if claimed_for == message_id and reason.startswith(
                VANISHED_REASON.format(name=name, machine=machine)
            ):
                return True
            key = key_of(claimed_for)
            if (
                key is not None
                and once(message_id)
                and once(claimed_for)
                and key_of(message_id) == key
                and reason.startswith(ONCE_UNKNOWN_REASON.format(key=key, name=name))
            ):
                return True
        return False
