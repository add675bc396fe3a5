"""A stack deployed into the embedded AWS: its outputs, its functions as deployed, its EventBridge rules,
and the two things moto does not do with them.

* No EventBridge rule ever fires (no schedule, no Step Functions status events; PutEvents never reaches
  Lambda). ``Deployment.tick`` and ``Deployment.deliver`` play EventBridge: they take the documented
  event (``sluice.local.events``) and invoke every target of every deployed rule whose schedule or
  pattern applies (patterns are matched with moto's own EventPattern).
* Lambda functions are created but never run without Docker. ``Deployment.invoke`` runs the deployed
  function as Lambda does (``sluice.local.lambdas``): the code of its deployment package, in a process
  of its own, the handler found from its Handler setting, with the environment GetFunctionConfiguration
  returns for it plus ``AWS_ENDPOINT_URL`` pointing at the server, and a context whose remaining time
  counts down from the deployed timeout.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sluice.local.events import scheduled_event
from sluice.local.lambdas import Containers, FunctionCode

# What this machine's environment does not hand to a function: its AWS and Sluice settings, and
# whatever would change how Python finds modules. Lambda sets its own.
NOT_INHERITED = ("AWS_", "SLUICE_", "POWERTOOLS_", "LAMBDA_", "PYTHON", "_HANDLER")


class Aws(Protocol):
    """What a deployment uses of the AWS it was deployed into (``sluice.local.embedded.EmbeddedAws``)."""

    region: str

    def client(self, service: str) -> Any: ...

    def environ(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class Function:
    key: str  # the function's name in serverless.yml: "launcher", "completion"
    name: str
    arn: str
    handler: str  # "handlers/launcher.handler"
    timeout: int
    memory: int
    environment: dict[str, str]
    code: Path | None = None  # its deployment package as deployed, extracted


@dataclass(frozen=True)
class Rule:
    name: str
    arn: str
    enabled: bool
    schedule: str | None
    pattern: str | None
    target_arns: list[str]

    def matches(self, event: Mapping[str, Any]) -> bool:
        return self.enabled and self._pattern is not None and self._pattern.matches_event(dict(event))

    @functools.cached_property
    def _pattern(self) -> Any:
        if not self.pattern:
            return None
        from moto.events.models import EventPattern

        return EventPattern.load(self.pattern)


@dataclass
class Deployment:
    aws: Aws
    stack_name: str
    outputs: dict[str, str]
    functions: dict[str, Function]
    rules: list[Rule]
    unsupported: list[str] = field(default_factory=list)
    _containers: dict[str, Containers] = field(default_factory=dict)

    # -- running the deployed code ------------------------------------------------------------------

    def environment(self, function: str) -> dict[str, str]:
        """The environment a container of ``function`` runs with: this machine's (PATH, HOME, locale)
        without its AWS and Sluice settings, the deployed variables, the embedded AWS's endpoint and
        keys, and what Lambda's runtime sets."""
        fn = self.functions[function]
        env = {k: v for k, v in os.environ.items() if not k.startswith(NOT_INHERITED)}
        env.update(fn.environment)
        env.update(self.aws.environ())
        env.update(
            AWS_LAMBDA_FUNCTION_NAME=fn.name,
            AWS_LAMBDA_FUNCTION_MEMORY_SIZE=str(fn.memory),
            AWS_LAMBDA_FUNCTION_TIMEOUT=str(fn.timeout),
            AWS_LAMBDA_FUNCTION_VERSION="$LATEST",
            _HANDLER=fn.handler,
        )
        if fn.code is not None:
            env["LAMBDA_TASK_ROOT"] = str(fn.code)
        return env

    def function_code(self, function: str) -> FunctionCode:
        fn = self.functions[function]
        if fn.code is None:
            raise RuntimeError(f"function {fn.name} has no deployment package in the deployment bucket")
        return FunctionCode(
            name=fn.name,
            arn=fn.arn,
            handler=fn.handler,
            timeout=fn.timeout,
            memory=fn.memory,
            code=fn.code,
            environment=self.environment(function),
        )

    def containers(self, function: str, *, size: int, log: Path | None = None) -> Containers:
        """Up to ``size`` concurrent invocations of ``function``; the caller closes them."""
        return Containers(self.function_code(function), size=size, log=log)

    def invoke(self, function: str, event: Mapping[str, Any]) -> Any:
        """Run the deployed ``function`` with ``event``, as Lambda would: in its warm container (one per
        function, started on the first invocation). Raises ``InvocationError`` when it fails."""
        if function not in self._containers:
            self._containers[function] = self.containers(function, size=1)
        return self._containers[function].invoke(event)

    def close(self) -> None:
        """Stop the containers ``invoke`` started."""
        for containers in self._containers.values():
            containers.close()
        self._containers.clear()

    # -- playing EventBridge ----------------------------------------------------------------------

    def function_for(self, arn: str) -> str | None:
        for key, fn in self.functions.items():
            if arn in (fn.arn, fn.name) or arn.split(":")[-1] == fn.name:
                return key
        return None

    def schedule_rules(self) -> list[Rule]:
        return [r for r in self.rules if r.enabled and r.schedule]

    def scheduled(self, *functions: str) -> list[tuple[str, dict[str, Any]]]:
        """(function, "Scheduled Event") for every target of every schedule rule, as if all fired now;
        only the targets among ``functions`` when any are named."""
        return [
            (key, scheduled_event(rule.arn, self.aws.region))
            for rule in self.schedule_rules()
            for key in self._targets(rule)
            if not functions or key in functions
        ]

    def route(self, event: Mapping[str, Any]) -> list[str]:
        """The functions EventBridge would invoke with ``event``: targets of the rules it matches."""
        return [key for rule in self.rules if rule.matches(event) for key in self._targets(rule)]

    def tick(self, *functions: str) -> list[tuple[str, Any]]:
        """Fire every schedule rule once and run its targets (only ``functions``, when named)."""
        return [(key, self.invoke(key, event)) for key, event in self.scheduled(*functions)]

    def deliver(self, event: Mapping[str, Any]) -> list[tuple[str, Any]]:
        """Deliver ``event`` as EventBridge would, running the targets."""
        return [(key, self.invoke(key, event)) for key in self.route(event)]

    def _targets(self, rule: Rule) -> list[str]:
        return [key for arn in rule.target_arns if (key := self.function_for(arn)) is not None]
