"""The semaphore function: what each event it receives asks of ``sluice.semaphore.step``.

    Acquire task (lambda:invoke.waitForTaskToken)  {"action": "acquire", "semaphore", "acquisitionId",
                                                     "executionArn", "taskToken"}   → line, hand-off
    Release task (lambda:invoke)                   {"action": "release", "semaphore", "acquisitionId",
                                                     "executionArn"}                → free, hand-off
    EventBridge status change (ended execution)    release_execution(executionArn)
    EventBridge schedule                           sweep: create configured semaphores, reconcile each

Bad input raises ``BadSemaphoreRequest`` before any AWS call: Lambda reports the class name as the
error, which a workflow's Retry or Catch matches by ``ErrorEquals``.

Configured limits only create a semaphore: one that exists keeps the limit it has, so a limit changed
at run time (``Semaphores.set_limit``, the CLI) is never undone by a redeploy or a cold start. The
create is conditional (``Semaphores.create``), so this holds while both create it at once (``ensure``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sluice.core.errors import ConfigurationError, SluiceError, TransientError
from sluice.core.events import DETAIL_TYPE, StatusChange
from sluice.semaphore.model import BadSemaphoreName, check_acquisition_id, check_name, pool_of
from sluice.semaphore.step import Semaphores

log = logging.getLogger("sluice.semaphore")

MAX_LIMIT = 10_000
_DIGITS = re.compile(r"[0-9]+", re.ASCII)
SCHEDULED = "Scheduled Event"


class BadSemaphoreRequest(SluiceError, ValueError):
    """The event is not a request the semaphore function understands (missing or bad fields)."""


class Action(StrEnum):
    ACQUIRE = "acquire"
    RELEASE = "release"


@dataclass(frozen=True)
class SemaphoreRequest:
    action: Action
    semaphore: str
    execution_arn: str
    acquisition_id: str
    task_token: str = ""


_FIELDS = {
    Action.ACQUIRE: ("semaphore", "acquisitionId", "executionArn", "taskToken"),
    Action.RELEASE: ("semaphore", "acquisitionId", "executionArn"),
}


def parse_request(event: Any) -> SemaphoreRequest:
    """An Acquire or Release task's payload, checked; every missing field is named at once."""
    if not isinstance(event, Mapping):
        raise BadSemaphoreRequest(f"the payload must be a JSON object, got {type(event).__name__}")
    raw = event.get("action")
    try:
        action = Action(raw)
    except ValueError:
        raise BadSemaphoreRequest(
            f"unknown action {raw!r}: use one of {', '.join(a.value for a in Action)}"
        ) from None
    fields = _FIELDS[action]
    missing = [f for f in fields if not isinstance(event.get(f), str) or not event[f]]
    if missing:
        raise BadSemaphoreRequest(f"{action.value}: missing or empty field(s) {', '.join(missing)}")
    arn = event["executionArn"]
    if not arn.startswith("arn:") or ":execution:" not in arn:
        raise BadSemaphoreRequest(f"executionArn {arn!r} is not an execution ARN: pass $$.Execution.Id")
    try:
        semaphore = check_name(event["semaphore"])
        acquisition_id = check_acquisition_id(event["acquisitionId"])
    except BadSemaphoreName as exc:
        raise BadSemaphoreRequest(str(exc)) from None
    return SemaphoreRequest(action, semaphore, arn, acquisition_id, event.get("taskToken", ""))


def parse_limits(text: str, *, variable: str = "SLUICE_SEMAPHORES") -> tuple[tuple[str, int], ...]:
    """``name=limit,name=limit`` (spaces allowed around each) → ((name, limit), ...), checked."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, number = (s.strip() for s in part.rpartition("="))
        if not sep or not name:
            raise ConfigurationError(f"{variable}: {part!r} is not name=limit")
        try:
            pool_of(name)
        except (BadSemaphoreName, ValueError) as exc:
            raise ConfigurationError(f"{variable}: {exc}") from None
        # ASCII digits only: "²".isdigit() is true and int("²") raises ValueError.
        if not _DIGITS.fullmatch(number) or len(number) > 9 or int(number) > MAX_LIMIT:
            raise ConfigurationError(
                f"{variable}: limit of {name!r} must be 0 to {MAX_LIMIT}, got {number[:40]!r}"
            )
        if name in out:
            raise ConfigurationError(f"{variable}: {name!r} is given twice")
        out[name] = int(number)
    return tuple(out.items())


class SemaphoreService:
    def __init__(
        self,
        semaphores: Semaphores,
        limits: Mapping[str, int],
        *,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
    ) -> None:
        self.semaphores = semaphores
        self.limits = dict(limits)
        self.log = logger or log
        self._exists: set[str] = set()  # configured semaphores seen to exist by this container

    def handle(self, event: Any) -> dict[str, object]:
        """One invocation of the semaphore function, whatever invoked it."""
        if isinstance(event, Mapping) and event.get("detail-type") == SCHEDULED:
            return {"swept": self.sweep()}
        if isinstance(event, Mapping) and event.get("detail-type") == DETAIL_TYPE:
            change = StatusChange.from_event(event)
            return {"execution": change.execution_arn, "released": self.on_status_change(change)}
        request = parse_request(event)
        if request.action is Action.ACQUIRE:
            return self.acquire(request)
        return self.release(request)

    def acquire(self, request: SemaphoreRequest) -> dict[str, object]:
        self.ensure(request.semaphore)
        result = self.semaphores.acquire(
            request.semaphore, request.execution_arn, request.acquisition_id, request.task_token
        )
        self.log.info(
            "acquire",
            extra={"semaphore": result.semaphore, "outcome": result.outcome.value, "ticket": result.ticket},
        )
        return {
            "semaphore": result.semaphore,
            "acquisitionId": result.acquisition_id,
            "outcome": result.outcome.value,
            "ticket": result.ticket,
        }

    def release(self, request: SemaphoreRequest) -> dict[str, object]:
        released = self.semaphores.release(request.semaphore, request.execution_arn, request.acquisition_id)
        self.log.info("release", extra={"semaphore": request.semaphore, "released": released.value})
        return {
            "semaphore": request.semaphore,
            "acquisitionId": request.acquisition_id,
            "released": released.value,
        }

    def on_status_change(self, change: StatusChange) -> list[dict[str, str]]:
        """The execution ended (any path): free whatever it holds or waits for. One read when nothing."""
        if not change.terminal or not change.execution_arn:
            return []
        freed = self.semaphores.release_execution(change.execution_arn)
        out = [{"semaphore": n, "acquisitionId": a, "released": r.value} for n, a, r in freed]
        if out:
            self.log.info("released at the end of the execution", extra={"released": out})
        return out

    def ensure(self, semaphore: str) -> None:
        """Create a configured semaphore that does not exist yet, with its configured limit."""
        if semaphore not in self.limits or semaphore in self._exists:
            return
        # The configured limit is written only where no pool exists: a conditional create, whose
        # refusal means someone else created it, whose limit stays. A read then a plain write
        # would undo the operator's limit:
        #
        #   cold start (configured 5)            operator (`sluice semaphore set db 1`)
        #   ─────────────────────────            ──────────────────────────────────────
        #   read SLOTS#sem:db: absent
        #                                        create the pool, limit 1
        #   write limit 5                   ✗    (5 in force: the operator's 1 undone)
        #   create IF attribute_not_exists  ✓    refused: read again, the pool exists → keep 1
        if self.semaphores.create(semaphore, self.limits[semaphore]):
            self.log.info(
                "semaphore created", extra={"semaphore": semaphore, "limit": self.limits[semaphore]}
            )
        self._exists.add(semaphore)

    def sweep(self) -> dict[str, object]:
        """For each configured semaphore: create it if absent, free the permits of ended executions
        (a lost status event), hand off. A failure on one is reported and the others still run."""
        out: dict[str, object] = {}
        for name in sorted(self.limits):
            try:
                self.ensure(name)
                freed = self.semaphores.reconcile(name)
            except TransientError as exc:
                self.log.warning("sweep skipped a semaphore", extra={"semaphore": name, "error": str(exc)})
                out[name] = {"error": str(exc)}
                continue
            out[name] = {
                "freed": [{"executionArn": h.execution_arn, "acquisitionId": h.acquisition_id} for h in freed]
            }
        return out
