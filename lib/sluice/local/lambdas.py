"""Concurrent invocations of a deployed function, each in a warm worker process: Lambda's containers.

EventBridge invokes the completion function once per status-change event, concurrently; the
launcher's schedule fires whether or not the previous tick is done. ``Containers`` runs a deployed
function the same way: up to ``size`` invocations at once, each in a process of its own that was
set up once (environment of the deployed function, handler imported, runtime warm) and is reused.
Separate processes, not threads: each holds its own warm runtime, logger and metrics, as containers
do, and on a small machine they do not share one interpreter lock.
"""

from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import sys
from collections.abc import Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.local.embedded import Deployment, LambdaContext


@dataclass(frozen=True)
class Spec:
    """What a worker needs to run one deployed function (picklable)."""

    key: str
    name: str
    arn: str
    handler: str
    timeout: int
    memory: int
    environment: dict[str, str]
    root: str  # the directory ``handlers`` is imported from
    log: str  # where the handler's logs and metrics go


class Containers:
    def __init__(self, deployment: Deployment, function: str, *, size: int, log: Path, root: Path) -> None:
        fn = deployment.functions[function]
        self.spec = Spec(
            key=function,
            name=fn.name,
            arn=fn.arn,
            handler=fn.handler,
            timeout=fn.timeout,
            memory=fn.memory,
            environment=deployment.environment(function),
            root=str(root),
            log=str(log),
        )
        self.size = size
        self._pool = ProcessPoolExecutor(
            max_workers=size,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=(self.spec,),
        )

    def warm(self) -> None:
        """Start every container now (imports take a second each), not on the first events."""
        for future in [self._pool.submit(_ping) for _ in range(self.size)]:
            future.result()

    def submit(self, event: Mapping[str, Any]) -> Future[Any]:
        return self._pool.submit(_invoke, dict(event))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


# -- inside a worker process ------------------------------------------------------------------------

_state: dict[str, Any] = {}


def _start(spec: Spec) -> None:
    sys.path.insert(0, spec.root)
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        os.environ.pop(name, None)
    os.environ.update(spec.environment)
    log = open(spec.log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    sys.stdout = log  # Powertools prints metrics (EMF) to stdout
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    shared = importlib.import_module("handlers._shared")
    shared.logger.registered_handler.setStream(log)
    module, _, attribute = spec.handler.rpartition(".")
    _state.update(spec=spec, handler=getattr(importlib.import_module(module.replace("/", ".")), attribute))
    # Build the warm runtime (settings, clients, launcher) now, as the first invocation would: the
    # demo's containers are provisioned, so the batch does not wait for cold starts.
    shared.runtime().launcher(shared.logger)


def _ping() -> bool:
    return True


def _invoke(event: dict[str, Any]) -> Any:
    spec: Spec = _state["spec"]
    context = LambdaContext(
        function_name=spec.name,
        invoked_function_arn=spec.arn,
        memory_limit_in_mb=spec.memory,
        timeout=spec.timeout,
    )
    return _state["handler"](event, context)
