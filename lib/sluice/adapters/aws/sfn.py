"""Step Functions: the stack's state machine, and the lanes' own (``laneStateMachines``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, ReadTimeoutError

from sluice.adapters.errors import THROTTLING, error_code, translate_client_error, translated
from sluice.core.errors import (
    AmbiguousStartError,
    ConfigurationError,
    InvalidPayload,
    NotFound,
    TransientError,
)
from sluice.core.model import ExecutionInfo, StartResult
from sluice.core.names import execution_arn

PAGE = 1000
REDRIVEN_PAGES = 3  # redriven executions listed per state machine and reconciliation: 3,000 at most


class StepFunctionsExecutions:
    """Starts on ``state_machine_arn``; with ``lane_machines`` (lane → ARN), ``for_lane`` gives the
    executions of a lane's own machine, and the listing and the check cover every machine."""

    def __init__(
        self, client: Any, state_machine_arn: str, lane_machines: Mapping[str, str] | None = None
    ) -> None:
        self.client = client
        self.state_machine_arn = state_machine_arn
        self.lane_machines = dict(lane_machines or {})

    @property
    def state_machine_arns(self) -> tuple[str, ...]:
        """Every state machine the stack starts: its own first, then the lanes' (each once)."""
        return tuple(dict.fromkeys([self.state_machine_arn, *self.lane_machines.values()]))

    def for_lane(self, lane: str) -> StepFunctionsExecutions:
        """The executions ``lane`` starts: of its own state machine, else of the stack's."""
        arn = self.lane_machines.get(lane)
        if arn is None or arn == self.state_machine_arn:
            return self
        return StepFunctionsExecutions(self.client, arn)

    def arn_for(self, name: str) -> str:
        return execution_arn(self.state_machine_arn, name)

    def start(self, name: str, input_json: str) -> StartResult:
        try:
            response = self.client.start_execution(
                stateMachineArn=self.state_machine_arn, name=name, input=input_json
            )
        except ClientError as exc:
            code = error_code(exc)
            if code == "ExecutionAlreadyExists":
                return StartResult(arn=self.arn_for(name), already_existed=True)
            if code in ("InvalidExecutionInput", "InvalidName"):
                raise InvalidPayload(f"Step Functions refused the input: {exc}") from exc
            error = translate_client_error(exc, "StartExecution")
            if (isinstance(error, TransientError) and code not in THROTTLING) or _retried(exc):
                # A 5xx may have started the execution. So may an earlier attempt of a retried call
                # (a read timeout, say), whatever the last attempt's answer, a 4xx included
                # (ExecutionLimitExceeded, StateMachineDeleting): never take it as "no".
                raise AmbiguousStartError(
                    str(error),
                    operation="StartExecution",
                    code=code,
                    throttled=isinstance(error, TransientError) and error.throttled,
                ) from exc
            raise error from exc
        except (ConnectionError, HTTPClientError, ReadTimeoutError) as exc:
            raise AmbiguousStartError(
                f"StartExecution: {exc}", operation="StartExecution", code=type(exc).__name__
            ) from exc
        return StartResult(arn=response["executionArn"])

    def describe(self, name: str, arn: str | None = None) -> ExecutionInfo | None:
        """None: Step Functions says no such execution; on a state machine the stack no longer
        uses, also when it says that machine does not exist (deleted: a state machine is deleted
        only once its executions have ended). The stack's own machine missing stays a
        ConfigurationError: the stack is misconfigured."""
        asked = arn or self.arn_for(name)
        try:
            with translated("DescribeExecution"):
                raw = self.client.describe_execution(executionArn=asked)
        except NotFound:
            return None
        except ConfigurationError as exc:
            gone = (
                isinstance(exc.__cause__, ClientError)
                and error_code(exc.__cause__) == "StateMachineDoesNotExist"
            )
            if gone and _machine_of(asked) not in {_machine_of(m) for m in self.state_machine_arns}:
                return None
            raise
        return ExecutionInfo(
            name=raw.get("name", name),
            arn=raw["executionArn"],
            status=raw["status"],
            start_date=_ts(raw.get("startDate")),
            stop_date=_ts(raw.get("stopDate")),
            error=raw.get("error"),
            cause=raw.get("cause"),
            output=raw.get("output"),
            redrive_count=raw.get("redriveCount"),
            redrive_date=_ts(raw.get("redriveDate")),
        )

    def vanished(self, arn: str | None) -> bool:
        """Whether execution ``arn`` is on a state machine the stack no longer uses that Step
        Functions says does not exist (deleted after a switch: its executions went with it)."""
        if not arn or _machine_of(arn) in {_machine_of(m) for m in self.state_machine_arns}:
            return False
        parts = arn.split(":")
        machine = ":".join([*parts[:5], "stateMachine", *parts[6:7]])
        try:
            with translated("DescribeStateMachine"):
                self.client.describe_state_machine(stateMachineArn=machine)
        except ConfigurationError as exc:  # a lost answer or a throttle is a TransientError
            if (
                isinstance(exc.__cause__, ClientError)
                and error_code(exc.__cause__) == "StateMachineDoesNotExist"
            ):
                return True
            raise
        return False

    def list_running(self) -> set[str]:
        """The RUNNING executions of every state machine the stack starts (names are unique across
        them: each names a payload and a message)."""
        names: set[str] = set()
        for arn in self.state_machine_arns:
            names |= self._running_on(arn)
        return names

    def _running_on(self, state_machine_arn: str) -> set[str]:
        return {e["name"] for e in self._listed(state_machine_arn, statusFilter="RUNNING")}

    def redriven_succeeded(self) -> dict[str, float | None]:
        """ListExecutions filtered to redriven executions (``redriveFilter``), of every state
        machine the stack starts; the SUCCEEDED ones, at most ``REDRIVEN_PAGES`` pages each."""
        return {
            e["name"]: _ts(e.get("stopDate"))
            for arn in self.state_machine_arns
            for e in self._listed(arn, pages=REDRIVEN_PAGES, redriveFilter="REDRIVEN")
            if e.get("status") == "SUCCEEDED"
        }

    def _listed(
        self, state_machine_arn: str, *, pages: int | None = None, **filters: str
    ) -> Iterator[dict[str, Any]]:
        """ListExecutions of one state machine, page after page (all of them, or ``pages``)."""
        token: str | None = None
        for _ in itertools.count() if pages is None else range(pages):
            request: dict[str, Any] = {"stateMachineArn": state_machine_arn, "maxResults": PAGE, **filters}
            if token:
                request["nextToken"] = token
            with translated("ListExecutions"):
                page = self.client.list_executions(**request)
            yield from page.get("executions", [])
            token = page.get("nextToken")
            if not token:
                return

    def check(self) -> None:
        for arn in self.state_machine_arns:
            with translated("DescribeStateMachine"):
                self.client.describe_state_machine(stateMachineArn=arn)


def _machine_of(arn: str) -> str:
    """The state machine's name in a state machine or execution ARN (field 7)."""
    return ":".join(arn.split(":")[6:7])


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value)


def _retried(exc: ClientError) -> bool:
    return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0) > 0
