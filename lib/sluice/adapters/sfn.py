"""Step Functions: one state machine."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError, ConnectionError, HTTPClientError, ReadTimeoutError

from sluice.adapters.errors import THROTTLING, error_code, translate_client_error, translated
from sluice.errors import AmbiguousStartError, InvalidPayload, NotFound, TransientError
from sluice.model import ExecutionInfo, StartResult
from sluice.names import execution_arn

PAGE = 1000


class StepFunctionsExecutions:
    def __init__(self, client: Any, state_machine_arn: str) -> None:
        self.client = client
        self.state_machine_arn = state_machine_arn

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
            if isinstance(error, TransientError) and (code not in THROTTLING or _retried(exc)):
                # A 5xx may have started the execution. So may an earlier attempt of a retried call
                # (a read timeout, say), whatever the last attempt's answer: never take it as "no".
                raise AmbiguousStartError(
                    str(error), operation="StartExecution", code=code, throttled=error.throttled
                ) from exc
            raise error from exc
        except (ConnectionError, HTTPClientError, ReadTimeoutError) as exc:
            raise AmbiguousStartError(
                f"StartExecution: {exc}", operation="StartExecution", code=type(exc).__name__
            ) from exc
        return StartResult(arn=response["executionArn"])

    def describe(self, name: str, arn: str | None = None) -> ExecutionInfo | None:
        try:
            with translated("DescribeExecution"):
                raw = self.client.describe_execution(executionArn=arn or self.arn_for(name))
        except NotFound:
            return None
        return ExecutionInfo(
            name=raw.get("name", name),
            arn=raw["executionArn"],
            status=raw["status"],
            start_date=_ts(raw.get("startDate")),
            stop_date=_ts(raw.get("stopDate")),
            error=raw.get("error"),
            cause=raw.get("cause"),
            output=raw.get("output"),
        )

    def list_running(self) -> set[str]:
        names: set[str] = set()
        token: str | None = None
        while True:
            request: dict[str, Any] = {
                "stateMachineArn": self.state_machine_arn,
                "statusFilter": "RUNNING",
                "maxResults": PAGE,
            }
            if token:
                request["nextToken"] = token
            with translated("ListExecutions"):
                page = self.client.list_executions(**request)
            names.update(e["name"] for e in page.get("executions", []))
            token = page.get("nextToken")
            if not token:
                return names

    def check(self) -> None:
        with translated("DescribeStateMachine"):
            self.client.describe_state_machine(stateMachineArn=self.state_machine_arn)


def _ts(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.timestamp()
    return float(value)


def _retried(exc: ClientError) -> bool:
    return int(exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0) > 0
