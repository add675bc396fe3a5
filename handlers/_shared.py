"""What both Lambda entry points share: the warm runtime and the metrics of one admission."""

from __future__ import annotations

import logging

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit, single_metric

from sluice.core.model import Outcome
from sluice.core.summary import TickSummary
from sluice.launch.settings import Settings
from sluice.runtime import Runtime

logger = Logger()
metrics = Metrics()
LANE_METRICS = {"started": "LaneStarted", "running": "LaneRunning", "limit": "LaneMax"}
# sluice.launch.launcher, sluice.launch.reconcile, sluice.launch.completion log through the same JSON formatter
# (Powertools configures top-level loggers only; the modules' loggers propagate to "sluice").
logging.getLogger("sluice")
copy_config_to_registered_loggers(source_logger=logger, include={"sluice"})
_runtime: Runtime | None = None


def runtime() -> Runtime:
    """One runtime per warm container, built on the first invocation."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime(Settings.from_env())
    return _runtime


def reset() -> None:
    """Forget the warm runtime (tests change the environment between invocations)."""
    global _runtime
    _runtime = None


def emit(summary: TickSummary, *, level: int = logging.INFO) -> dict[str, object]:
    metrics.add_metric("Started", MetricUnit.Count, summary.n(Outcome.STARTED))
    metrics.add_metric(
        "Duplicates", MetricUnit.Count, summary.n(Outcome.DUPLICATE) + summary.n(Outcome.DEFERRED)
    )
    metrics.add_metric("Invalid", MetricUnit.Count, summary.n(Outcome.INVALID))
    if summary.counted:  # a completion's hand-over reads no count of the slots
        metrics.add_metric("Running", MetricUnit.Count, summary.running_after)
        metrics.add_metric("FreeSlots", MetricUnit.Count, summary.free_after)
    if summary.max_concurrency is not None:
        metrics.add_metric("Max", MetricUnit.Count, summary.max_concurrency)
    if summary.drift is not None:
        metrics.add_metric("LedgerDrift", MetricUnit.Count, summary.drift)
    for lane, figures in summary.lanes.items():
        # One blob per lane with the dimension ``lane`` (sluice.features.lanes): the dashboard's running
        # against MAX per lane, and starts per lane.
        for name, metric in LANE_METRICS.items():
            if name in figures:
                with single_metric(
                    name=metric,
                    unit=MetricUnit.Count,
                    value=figures[name],
                    namespace=metrics.namespace,
                    default_dimensions=metrics.default_dimensions,
                ) as one:
                    one.add_dimension(name="lane", value=lane)
    result = summary.as_dict()
    logger.log(level, "admission finished", extra={"summary": result})
    return result
