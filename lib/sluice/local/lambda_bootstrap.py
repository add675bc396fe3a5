"""One Lambda container: what the Python runtime does with a deployed function's code, on this machine.

``sluice.local.lambdas`` runs this file as a script with ``python -I`` (isolated: the calling process's
working directory, ``PYTHONPATH`` and user site are not on ``sys.path``). It imports only the standard
library, then builds the path Lambda builds from the function's code and nothing else:

    the function's PYTHONPATH    /var/task/lib → <code>/lib; /var/runtime has no counterpart here
    <code>                       the deployment package, extracted (Lambda's /var/task)
    the standard library and this interpreter's site-packages (standing in for the runtime's boto3)

Any other entry (the repository's ``lib/`` that an editable install adds through a ``.pth`` file) is
dropped, so a module the zip lacks fails to import here as it would in Lambda.

Protocol, one JSON document per line:

    stdin   the configuration: {"code", "handler", "name", "arn", "memory", "timeout"}
    stdout  {"ready": true}, or {"ready": false, "error": {...}} when the handler does not import (init)
    stdin   an event                 →  stdout  {"result": ...} or {"error": {...}}
    ...
    end of stdin: the container stops

Errors have Lambda's shape (``errorType``, ``errorMessage``, ``stackTrace``). What the function prints
(its logs, Powertools' metrics) goes to standard error, which the parent points at a log file.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import sysconfig
import time
import traceback
import uuid
from typing import Any

TASK_ROOT = "/var/task"


class LambdaContext:
    """The context object a handler receives; the remaining time counts down from the timeout."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.function_name: str = config["name"]
        self.function_version = "$LATEST"
        self.invoked_function_arn: str = config["arn"]
        self.memory_limit_in_mb = int(config["memory"])
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{self.function_name}"
        self.log_stream_name = f"local/{uuid.uuid4().hex}"
        self._deadline = time.monotonic() + float(config["timeout"])

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def lambda_path(code: str, python_path: str) -> list[str]:
    """``sys.path`` for the function: its PYTHONPATH mapped onto ``code``, ``code``, then the interpreter's own."""
    entries = []
    for entry in python_path.split(os.pathsep) if python_path else []:
        if entry == TASK_ROOT or entry.startswith(TASK_ROOT + "/"):
            entries.append(code + entry[len(TASK_ROOT) :])
    entries.append(code)
    roots = {sysconfig.get_path(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")}
    for entry in sys.path:
        inside = any(entry == root or entry.startswith(root + os.sep) for root in roots)
        if inside or (entry.endswith(".zip") and entry.startswith(sys.base_prefix)):
            entries.append(entry)
    return list(dict.fromkeys(entries))


def error(exc: BaseException, kind: str | None = None) -> dict[str, Any]:
    return {
        "errorType": kind or type(exc).__name__,
        "errorMessage": str(exc),
        "stackTrace": traceback.format_exception(exc),
    }


def main() -> None:
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the function's own output goes with its logs
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[attr-defined]

    def send(message: dict[str, Any]) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    config = json.loads(sys.stdin.readline())
    code = config["code"]
    sys.path[:] = lambda_path(code, os.environ.get("PYTHONPATH", ""))
    os.chdir(code)
    module_path, _, attribute = config["handler"].rpartition(".")
    try:
        handler = getattr(importlib.import_module(module_path.replace("/", ".")), attribute)
    except Exception as exc:  # Lambda's Runtime.ImportModuleError / HandlerNotFound
        send({"ready": False, "error": error(exc, "Runtime.ImportModuleError")})
        return
    send({"ready": True})
    for line in sys.stdin:
        event = json.loads(line)
        try:
            result = handler(event, LambdaContext(config))
        except Exception as exc:
            send({"error": error(exc)})
            continue
        try:
            send({"result": result})
        except (TypeError, ValueError) as exc:
            send({"error": error(exc, "Runtime.MarshalError")})


if __name__ == "__main__":
    main()
