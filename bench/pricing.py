"""Public AWS list prices (us-east-1) and the cost of what a run measured.

Prices are the published on-demand list prices for us-east-1 as they stood in 2025 (DynamoDB on-demand
after the 1 November 2024 reduction). They were not re-checked against the live pricing pages from the
machine that produced the results (it has no internet access); ``PRICES_AS_OF`` says so.

Left out, because they are the same for every system compared or free:
- Step Functions Standard state transitions ($25 per million): the same executions run under each
  system. StartExecution, ListExecutions and DescribeExecution are not charged per call.
- SSM Parameter Store standard parameters with standard throughput: GetParameter is free.
- EventBridge: scheduled rules and AWS service events (the Step Functions status change) are free.
- The producer's SendMessage calls: the same for every system.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

PRICES_AS_OF = "AWS list prices for us-east-1 as published in 2025; not re-checked live"

PRICES: dict[str, float] = {
    "lambda_request": 0.20 / 1e6,  # per invocation
    # Per GB-second in the first tier (the first 6 billion GB-seconds a month on x86_64, 7.5 billion on
    # arm64), by architecture.
    "lambda_gb_second_x86_64": 0.0000166667,
    "lambda_gb_second_arm64": 0.0000133334,
    "sqs_fifo_request": 0.50 / 1e6,  # per API request (up to 64 KB)
    "sqs_standard_request": 0.40 / 1e6,
    "dynamodb_wru": 0.625 / 1e6,  # on-demand write request unit (1 KB; transactions 2 per KB)
    "dynamodb_rru": 0.125 / 1e6,  # on-demand read request unit (4 KB strongly consistent)
    "logs_ingested_gb": 0.50,  # CloudWatch Logs standard ingestion (EMF included)
    "ssm_get_parameter": 0.0,  # standard parameter, standard throughput
    "stepfunctions_transition": 0.025 / 1e3,  # listed for reference; equal across systems, excluded
}

SECONDS_PER_MONTH = 30 * 86_400


def cost_usd(
    *,
    calls: dict[str, int],
    rru: float,
    wru: float,
    lambda_requests: int,
    gb_seconds: Mapping[str, float],
    log_bytes: int,
    fifo: bool,
) -> dict[str, float]:
    """Dollars by service for the usage of one run. ``gb_seconds``: Lambda GB-seconds by architecture."""
    sqs_requests = sum(n for api, n in calls.items() if api.startswith("sqs:"))
    sqs_price = PRICES["sqs_fifo_request"] if fifo else PRICES["sqs_standard_request"]
    out = {
        "lambda": lambda_requests * PRICES["lambda_request"]
        + sum(gb_s * PRICES[f"lambda_gb_second_{arch}"] for arch, gb_s in gb_seconds.items()),
        "sqs": sqs_requests * sqs_price,
        "dynamodb": wru * PRICES["dynamodb_wru"] + rru * PRICES["dynamodb_rru"],
        "logs": log_bytes / 1024**3 * PRICES["logs_ingested_gb"],
    }
    out["total"] = sum(out.values())
    return out


def per_million(costs: dict[str, float], launches: int) -> dict[str, Any]:
    if launches <= 0:
        return {k: None for k in costs}
    return {k: round(v / launches * 1e6, 2) for k, v in costs.items()}
