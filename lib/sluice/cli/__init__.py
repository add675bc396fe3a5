"""``sluice``: the operator's command line.

    sluice enqueue FILE|-            send payloads (one JSON object, a JSON array, or JSON Lines)
    sluice status [PAYLOAD_ID]       overview, or one payload's record and execution history (no
                                     record: what holds starts; --lane, --concurrency-key narrow it)
    sluice set-max N                 change MAX at run time (0 pauses)
    sluice pause | resume            MAX to 0 and back to the value it had
    sluice dlq list                  show dead-lettered messages without consuming them
    sluice dlq redrive --id ID|--all send them back to the main queue
    sluice dlq delete --id ID        drop them (after re-enqueueing a fixed payload, say)
    sluice tick                      one launcher tick, run here
    sluice semaphore set NAME N      put a semaphore's limit in force (creates it; 0 pauses the section)
    sluice semaphore status [NAME]   one semaphore's holders and waiters, or every semaphore
    sluice semaphore asl NAME [--function ARN]  the Acquire/Release states to copy (no AWS call
                                     with --function; else the stack output SemaphoreFunctionArn)

Resources are found from the CloudFormation stack's outputs (``--stage`` → stack ``sluice-<stage>``,
or ``--stack``; ``--region``); any ``SLUICE_*`` environment variable set overrides its output, and
when the variables name every resource a command uses, no stack is read (``context.py``). boto3
honours ``AWS_ENDPOINT_URL``, so the same commands work on a real account and on the embedded AWS.
Tables for people by default, ``--json`` for scripts (``render.py``).

    app.py         the parser, ``main`` and what an error means for the exit code
    context.py     finding the stack and the deployed launcher's settings
    render.py      exit codes, tables, times, the progress bar
    room.py        what holds starts, in words (status of a payload with no record; why a tick stopped)
    enqueue.py, status.py, maximum.py, dlq.py, local_tick.py, semaphore.py: one command group each

Nothing here runs in Lambda; the package is left out of the Lambda zip (serverless.yml).

Exit codes:
    0  success (also: nothing to do, such as ``pause`` when already paused)
    1  partly done or not found: some payloads or DLQ messages failed, no record for a payload
    2  usage or configuration: bad arguments, stack or credentials missing, setting invalid
    3  AWS unavailable or throttling: nothing is known to be wrong, try again
  130  interrupted (Ctrl-C); DLQ messages in hand are made visible again first
  141  standard output closed (``sluice ... | head``): stopped quietly, as shells report SIGPIPE
"""

from sluice.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
