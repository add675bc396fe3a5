"""The operator switches the stack's state machine, as docs/operations.md describes it.

A new machine is created and the stack redeployed with it as ``stateMachineArn``: every Lambda
container starts again with the new settings (one busy in an invocation when the deploy lands
starts again once it ends). With ``previousStateMachineArn`` the old machine stays describable;
without it, Sluice may not describe the old machine's executions (IAM answers AccessDenied). Once
none of the old machine's executions runs, the operator may delete it: its executions are then
gone (``ExecutionDoesNotExist``).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from moto.core import DEFAULT_ACCOUNT_ID

from sluice.runtime import Runtime
from tests.support.aws import WORKFLOW
from tests.support.faults import Call, count
from tests.support.hooks import error_answer

if TYPE_CHECKING:
    from tests.explorer.sim import Explorer


class MachineSwitch:
    def __init__(self, explorer: Explorer) -> None:
        self.explorer = explorer
        self.old: str | None = None  # the machine switched from
        self.previous = False  # deployed with previousStateMachineArn
        self.deleted = False
        self.redeploy: set[str] = set()  # containers busy when the deploy landed

    def switch(self, previous: bool) -> None:
        """``previous``: with ``previousStateMachineArn``; docs/operations.md asks for it while any of
        the machine's runs holds a slot or runs, so it is set then whatever was drawn. Also while an
        invocation is in flight: it goes on with the old settings and may still claim and start on
        the old machine after the deploy (the procedure without it pauses first, so none can)."""
        ex = self.explorer
        w = ex.world
        current = w.settings.state_machine_arn
        # A holder not started yet (a claim whose answer was lost, say) is on the current machine too:
        # its message may come back and resume it there.
        if any(ex.history.machine.get(n, current) == current for n in set(w.model.running) | w.model.holders):
            previous = True
        if ex.busy():
            previous = True
        name = w.settings.state_machine_arn.rsplit(":", 1)[-1] + "-2"
        new = w.sfn.create_state_machine(
            name=name,
            definition=json.dumps(WORKFLOW),
            roleArn=f"arn:aws:iam::{DEFAULT_ACCOUNT_ID}:role/{name}-sfn",
        )["stateMachineArn"]
        self.old, self.previous = w.settings.state_machine_arn, previous
        w.machines.append(new)
        settings = replace(w.settings, state_machine_arn=new)
        w.stack.settings = w.settings = settings
        w.operator = Runtime(settings, session=w.session, clock=w.clock)
        busy = ex.busy()
        for c in w.containers.values():
            if c.name in busy:
                self.redeploy.add(c.name)
            else:
                self.restart(c.name)
        ex.machine = new
        w.model.machine_switched(new)
        count("explorer:machine_switched" + (":with_previous" if previous else ":without_previous"))

    def restart(self, name: str) -> None:
        w = self.explorer.world
        c = w.containers[name]
        self.redeploy.discard(name)
        c.injector.revive()
        c.runtime = Runtime(
            w.settings, session=w.session, clock=c.clock, client_config=c.config, _clients=dict(c._clients)
        )

    def deletable(self) -> bool:
        """The old machine, once none of its executions runs and every container runs the new settings."""
        ex = self.explorer
        if self.old is None or self.deleted or self.redeploy:
            return False
        return not any(ex.history.machine.get(n) == self.old for n in ex.world.model.running)

    def delete(self) -> None:
        assert self.old is not None
        self.explorer.world.sfn.delete_state_machine(stateMachineArn=self.old)
        self.deleted = True
        self.explorer.world.model.machine_deleted(self.old)
        count("explorer:old_machine_deleted")

    def answer(self, call: Call) -> tuple[Any, dict[str, Any]] | None:
        """DescribeExecution of the old machine's executions: refused without previousStateMachineArn,
        gone once the machine is deleted."""
        if self.old is None or call.operation != "DescribeExecution":
            return None
        arn = call.params.get("executionArn", "")
        if not arn.startswith(self.old.replace(":stateMachine:", ":execution:") + ":"):
            return None
        if self.deleted:
            count("explorer:describe_deleted_machine")
            return error_answer("ExecutionDoesNotExist", 400)
        if not self.previous:
            count("explorer:describe_denied")
            return error_answer("AccessDeniedException", 400)
        return None
