"""Sluice: start AWS Step Functions executions from an SQS FIFO queue, never more than MAX at once.

The package is split in two:

* pure domain logic (``validation``, ``names``, ``launcher``, ``completion``, ``reconcile``,
  ``parking``, ``slots``), which talks to AWS only through the small ports in ``sluice.core.ports`` and
  ``sluice.primitives.slots``;
* adapters (``sluice.adapters``) that implement those ports with boto3 clients passed in by the
  caller, and in-memory ones (``memory*``) for unit tests and large benchmarks.

The tools around it (``cli``, ``ops``, ``enqueue``, ``local``) are not part of the Lambda package.
"""

__version__ = "0.1.0"
