"""The state machines, as the reference model (``tests.support.model``) knows them: which machine
each claim was recorded on, and which machines the operator switched from and deleted.

Two dead letters of a valid payload are documented outcomes of such a deletion (docs/protocol.md),
and the model accepts them only in exactly their situation:

* a claim on a vanished machine: the message's own claim ``N`` was recorded on machine ``M``, ``M``
  was deleted and is not the stack's machine, and the DLQ entry's reason is
  ``its claim N is on state machine M, no longer used and deleted: …`` (whether it ran there cannot
  be known, so it is not started again);
* a run-once key whose run vanished: a ``sluice-once`` message of key ``k``, and a run ``N`` of
  ``k`` (claimed for a run-once message or not) on a machine vanished as above, named by the
  reason ``run-once key 'k': the outcome of its run N is unknown …`` (it may have SUCCEEDED, so the
  key does not run once more by itself).

Anything else (another reason, a machine not deleted, the machine in use, another message's claim)
is still a valid payload dead-lettered: a broken promise.

One final record is documented too (docs/operations.md, "Switch the state machine"): a holder whose
claim was recorded on a machine switched from and deleted before Sluice released it (its end's
event is not heard after the switch, and reconciliation had not asked yet) is released by
reconciliation as ``RELEASED`` with the reason ``execution … does not exist in Step Functions …``:
its outcome is unknown. At rest, a key whose last release is exactly that may be ``RELEASED``
(``unknown_outcome``); a later release of the key (a run of it on the new machine) takes the excuse
back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

VANISHED_REASON = "its claim {name} is on state machine {machine}, no longer used and deleted"
ONCE_UNKNOWN_REASON = "run-once key {key!r}: the outcome of its run {name} is unknown"
VANISHED_RELEASE = "does not exist in Step Functions"  # in the reason of reconciliation's release


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
        self.unknown: dict[str, str] = {}  # key -> its run last released as vanished (outcome unknown)

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

    def released(self, params: Mapping[str, Any]) -> None:
        """A committed release (``TransactItems``): each lease it frees (``PAYLOAD#<key>``, ``REMOVE
        holder``) is the key's last release, documented as of unknown outcome or not."""
        for entry in params.get("TransactItems", []):
            update = entry.get("Update", {})
            pk = update.get("Key", {}).get("pk", {}).get("S", "")
            if not pk.startswith("PAYLOAD#") or "REMOVE holder" not in update.get("UpdateExpression", ""):
                continue
            key, given = pk.removeprefix("PAYLOAD#"), update.get("ExpressionAttributeValues", {})
            name = given.get(":name", {}).get("S", "")
            if (
                given.get(":state", {}).get("S") == "RELEASED"
                and VANISHED_RELEASE in given.get(":reason", {}).get("S", "")
                and self.vanished(name) is not None
            ):
                self.unknown[key] = name
            else:
                self.unknown.pop(key, None)

    def unknown_outcome(self, key: str) -> str | None:
        """The run of ``key`` whose release as vanished is the key's last release, if it is."""
        return self.unknown.get(key)

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
                and key_of(message_id) == key
                and reason.startswith(ONCE_UNKNOWN_REASON.format(key=key, name=name))
            ):
                return True
        return False
