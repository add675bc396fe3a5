"""The two EventBridge events Sluice's functions receive, as AWS documents them."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sluice.local.moto_server import ACCOUNT, REGION


def scheduled_event(rule_arn: str, region: str = REGION) -> dict[str, Any]:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": rule_arn.split(":")[4] if rule_arn.count(":") >= 5 else ACCOUNT,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [rule_arn],
        "detail": {},
    }


def status_change_event(execution: Mapping[str, Any], region: str = REGION) -> dict[str, Any]:
    """ "Step Functions Execution Status Change" for one DescribeExecution result."""

    def millis(value: Any) -> int | None:
        return None if value is None else int(value.timestamp() * 1000)

    arn = execution["executionArn"]
    status = execution["status"]
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Step Functions Execution Status Change",
        "source": "aws.states",
        "account": arn.split(":")[4],
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [arn],
        "detail": {
            "executionArn": arn,
            "stateMachineArn": execution["stateMachineArn"],
            "name": execution["name"],
            "status": status,
            "startDate": millis(execution.get("startDate")),
            "stopDate": millis(execution.get("stopDate")),
            "input": execution.get("input"),
            "output": execution.get("output"),
            "inputDetails": {"included": True},
            "outputDetails": {"included": True} if status == "SUCCEEDED" else None,
            "error": execution.get("error"),
            "cause": execution.get("cause"),
        },
    }
