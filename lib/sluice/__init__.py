"""Sluice: start AWS Step Functions executions from an SQS FIFO queue, never more than MAX at once.

The package is split in two:

* pure domain logic (``validation``, ``names``, ``launcher``, ``completion``, ``reconcile``,
  ``enqueue``), which talks to AWS only through the small ports in ``sluice.ports``;
* adapters (``sluice.adapters``) that implement those ports with boto3 clients passed in by the
  caller, plus an in-memory store used by unit tests and large benchmarks.
"""

__version__ = "0.1.0"
