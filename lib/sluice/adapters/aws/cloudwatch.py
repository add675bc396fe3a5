"""CloudWatch metrics of the stack's queues, for ``sluice status`` (``sluice.ops.status``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sluice.adapters.errors import translated

SQS_NAMESPACE = "AWS/SQS"


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One datapoint: the period's start and its value."""

    at: datetime
    value: float


@dataclass(frozen=True, slots=True)
class Window:
    """The time a metric is asked for, in periods of ``period`` seconds."""

    start: datetime
    end: datetime
    period: int = 60


class QueueMetrics:
    """An SQS queue's metrics in CloudWatch, by queue name."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def maxima(self, queue_name: str, metric: str, window: Window) -> list[MetricPoint]:
        """The ``Maximum`` of ``metric`` per period of ``window``, oldest first (none: no datapoint)."""
        with translated("GetMetricStatistics"):
            points = self.client.get_metric_statistics(
                Namespace=SQS_NAMESPACE,
                MetricName=metric,
                Dimensions=[{"Name": "QueueName", "Value": queue_name}],
                StartTime=window.start,
                EndTime=window.end,
                Period=window.period,
                Statistics=["Maximum"],
            )["Datapoints"]
        return sorted((MetricPoint(p["Timestamp"], float(p["Maximum"])) for p in points), key=lambda p: p.at)
