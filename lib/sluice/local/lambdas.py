"""Lambda's containers on this machine: a deployed function's code, run in processes of its own.

A ``Container`` is one process running ``lambda_bootstrap.py`` over the function's deployment package
(the zip ``osls package`` built, as deployed, extracted): it imports the handler named by the function's
Handler setting once (the init phase, a cold start) and then serves invocations one at a time, warm.
Nothing of this process's ``sys.path`` is visible there: not the repository's ``lib/`` or ``handlers/``,
so a module missing from the zip fails as it would in Lambda. A container whose process died (a crash,
a timeout) is started again on its next invocation, as Lambda would.

``Containers`` is a function's concurrency: EventBridge invokes the completion function once per
status-change event, concurrently, and the launcher's schedule fires whether or not the previous tick is
done. Up to ``size`` invocations run at once, each in a warm container. Separate processes, not threads:
each holds its own warm runtime, logger and metrics, as containers do, and on a small machine they do
not share one interpreter lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import subprocess
import sys
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BOOTSTRAP = Path(__file__).with_name("lambda_bootstrap.py")
START_SECONDS = 60.0  # the init phase: importing the handler
GRACE_SECONDS = 5.0  # past the function's timeout before its container is stopped


class InvocationError(RuntimeError):
    """The function failed: it raised (``errorType`` is the exception's class), its module did not
    import (``Runtime.ImportModuleError``), it timed out or its container died."""

    def __init__(self, error: Mapping[str, Any]) -> None:
        self.error_type = str(error.get("errorType", "Runtime.Unknown"))
        self.error_message = str(error.get("errorMessage", ""))
        self.stack_trace = list(error.get("stackTrace") or [])
        super().__init__(f"{self.error_type}: {self.error_message}")


@dataclass(frozen=True)
class FunctionCode:
    """What a container needs to run one deployed function."""

    name: str
    arn: str
    handler: str  # the Handler setting: "handlers/launcher.handler"
    timeout: int
    memory: int
    code: Path  # the deployment package, extracted (Lambda's /var/task)
    environment: dict[str, str]  # the whole process environment, the function's variables included


class Container:
    """One warm process for one function."""

    def __init__(self, function: FunctionCode, *, log: Path | None = None) -> None:
        self.function = function
        self.log = log
        self._process: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self.busy = False  # serving an invocation

    def interrupt(self) -> None:
        """Kill the process from another thread: the invocation in flight ends as a crash does (its
        thread finds the pipe closed and cleans up)."""
        process = self._process
        if process is not None:
            with contextlib.suppress(OSError):
                process.kill()

    def start(self) -> None:
        """The init phase: start the process and import the handler. Raises ``InvocationError``."""
        if self._process is not None and self._process.poll() is None:
            return
        self._buffer = b""
        err = open(self.log, "ab") if self.log else None  # noqa: SIM115 - handed to the child
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", str(BOOTSTRAP)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=self.function.environment,
                cwd=self.function.code,
            )
        finally:
            if err is not None:
                err.close()
        fn = self.function
        config = {
            "code": str(fn.code),
            "handler": fn.handler,
            "name": fn.name,
            "arn": fn.arn,
            "memory": fn.memory,
            "timeout": fn.timeout,
        }
        ready = self._exchange(config, START_SECONDS)
        if not ready.get("ready"):
            self.stop()
            raise InvocationError(ready.get("error") or {"errorType": "Runtime.InitError"})

    def invoke(self, event: Mapping[str, Any]) -> Any:
        """Run the handler with ``event``; its result, or ``InvocationError``."""
        self.busy = True
        try:
            self.start()
            answer = self._exchange(dict(event), self.function.timeout + GRACE_SECONDS)
        finally:
            self.busy = False
        if "error" in answer:
            raise InvocationError(answer["error"])
        return answer["result"]

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None
        with contextlib.suppress(OSError):  # a broken pipe: the process is gone already
            process.stdin.close()  # the container serves until its stdin closes
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()

    def _exchange(self, message: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(json.dumps(message).encode() + b"\n")
            process.stdin.flush()
        except OSError:
            return self._died()
        deadline = time.monotonic() + timeout
        fd = process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self._kill()
                return {
                    "error": {
                        "errorType": "Sandbox.Timedout",
                        "errorMessage": f"timed out after {timeout:g} s",
                    }
                }
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return self._died()
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _died(self) -> dict[str, Any]:
        process = self._process
        code = process.wait() if process is not None else None
        self.stop()
        return {"error": {"errorType": "Runtime.ExitError", "errorMessage": f"the container exited ({code})"}}

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
        self.stop()


class Containers:
    """Up to ``size`` concurrent invocations of one function, each in a warm ``Container``."""

    def __init__(self, function: FunctionCode, *, size: int, log: Path | None = None) -> None:
        self.function = function
        self.size = size
        self._all = [Container(function, log=log) for _ in range(size)]
        self._idle: queue.SimpleQueue[Container] = queue.SimpleQueue()
        for container in self._all:
            self._idle.put(container)
        self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix=f"lambda-{function.name}")

    def warm(self) -> None:
        """Start every container now (imports take a second each), not on the first events."""
        for future in [self._pool.submit(c.start) for c in self._all]:
            future.result()

    def submit(self, event: Mapping[str, Any]) -> Future[Any]:
        return self._pool.submit(self._run, dict(event))

    def invoke(self, event: Mapping[str, Any]) -> Any:
        return self.submit(event).result()

    def close(self) -> None:
        """Stop every container. One still serving an invocation (a launcher's tick lingering on an
        empty queue, up to its timeout) is killed, as Lambda stops a function: waiting for it would
        hold the caller for as long."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for container in self._all:
            if container.busy:
                container.interrupt()
        self._pool.shutdown(wait=True)
        for container in self._all:
            container.stop()

    def _run(self, event: dict[str, Any]) -> Any:
        container = self._idle.get()
        try:
            return container.invoke(event)
        finally:
            self._idle.put(container)
