"""Step Functions' task tokens for the semaphore (``sluice.semaphore.step.Tokens``): SendTaskSuccess,
SendTaskFailure and DescribeExecution by ARN.

A token that can no longer be answered is a result, not an error: TaskTimedOut (the task timed out,
or it was closed: answered already, or its execution ended), InvalidToken and TaskDoesNotExist are
``Delivery.GONE``. Throttling and 5xx are ``TransientError`` (a 5xx may have been delivered: the
semaphore never gives a permit back on an unsure answer); anything else is ``ConfigurationError``.
No ``ClientError`` leaves this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import ClientError

from sluice.adapters.errors import error_code, translate_client_error, translated
from sluice.core.errors import NotFound, TransientError
from sluice.semaphore.model import Delivery

GONE = frozenset({"TaskTimedOut", "InvalidToken", "TaskDoesNotExist"})
TRANSIENT = frozenset({"KmsThrottlingException"})  # tokens of executions encrypted with a customer key
ERROR_CHARS = 256  # SendTaskFailure's limits
CAUSE_CHARS = 32_768


class SfnTokens:
    def __init__(self, client: Any) -> None:
        self.client = client

    def succeed(self, token: str, output: Mapping[str, object]) -> Delivery:
        text = json.dumps(dict(output), separators=(",", ":"), sort_keys=True)
        return self._answer(
            "SendTaskSuccess", lambda: self.client.send_task_success(taskToken=token, output=text)
        )

    def fail(self, token: str, error: str, cause: str) -> Delivery:
        return self._answer(
            "SendTaskFailure",
            lambda: self.client.send_task_failure(
                taskToken=token, error=error[:ERROR_CHARS], cause=cause[:CAUSE_CHARS]
            ),
        )

    def execution_status(self, execution_arn: str) -> str | None:
        try:
            with translated("DescribeExecution"):
                raw = self.client.describe_execution(executionArn=execution_arn)
        except NotFound:
            return None
        return str(raw["status"])

    def _answer(self, operation: str, call: Callable[[], Any]) -> Delivery:
        with translated(operation):
            try:
                call()
            except ClientError as exc:
                code = error_code(exc)
                if code in GONE:
                    return Delivery.GONE
                if code in TRANSIENT:
                    raise TransientError(
                        str(translate_client_error(exc, operation)), operation=operation, code=code
                    ) from exc
                raise
        return Delivery.DELIVERED
