"""Step Functions as an eventually consistent reader sees it: DescribeExecution and ListExecutions
answer from a view up to ``BOUND`` seconds old.

``History`` keeps each execution's status by virtual time (every start, end and redrive the explorer
sees or makes). ``StaleView`` is a ``StaleList`` fault on a container's clients (the injector runs
it before the model observes the call, so the model sees what the caller got): when an execution's
status changed within the bound, the explorer draws how old the view is, and the answer is the
status at that moment: a just-started execution reads as missing (``ExecutionDoesNotExist``), a
just-ended one as RUNNING, a just-redriven one as ended. Stop and redrive dates are Step Functions' own (``History.dates``):
the end's or the redrive's, as of the view.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tests.support.faults import Call, Injector, StaleList, count
from tests.support.hooks import error_answer

BOUND = 60.0  # seconds: the oldest view Step Functions may answer from (docs/protocol.md)
LAGS = (0.0, 1.0, 15.0, 45.0, BOUND)  # how old a view may be drawn (0: fresh)


@dataclass
class History:
    """Each execution's statuses, by virtual time: name -> [(t, status)], oldest first."""

    clock: Any
    by_name: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    machine: dict[str, str] = field(default_factory=dict)  # name -> its state machine's ARN
    # (name, the change's time) -> the date Step Functions gave it: an end's stopDate, a redrive's redriveDate
    dates: dict[tuple[str, float], datetime] = field(default_factory=dict)

    def record(
        self, name: str, status: str, machine: str | None = None, date: datetime | None = None
    ) -> None:
        self.by_name.setdefault(name, []).append((self.clock.now(), status))
        if machine:
            self.machine.setdefault(name, machine)
        if date is not None:
            self.dates[(name, self.clock.now())] = date

    def stop_at(self, name: str, t: float) -> datetime | None:
        """The stop date Step Functions gave the end ``name`` was in at ``t`` (None: not recorded)."""
        entry = self._entry_at(name, t)
        return None if entry is None else self.dates.get((name, entry[0]))

    def redrives_at(self, name: str, t: float) -> list[datetime]:
        """The dates of the redrives of ``name`` up to ``t``, oldest first."""
        return [
            self.dates[(name, when)]
            for when, status in self.by_name.get(name, [])
            if when <= t and status == "RUNNING" and (name, when) in self.dates
        ]

    def started(self, name: str, machine: str) -> None:
        if name not in self.by_name:
            self.record(name, "RUNNING", machine)

    def at(self, name: str, t: float) -> str | None:
        """The status at ``t`` (None: it did not exist yet)."""
        entry = self._entry_at(name, t)
        return None if entry is None else entry[1]

    def _entry_at(self, name: str, t: float) -> tuple[float, str] | None:
        """(when it began, status): the status ``name`` had at ``t`` (None: it did not exist yet)."""
        entry = None
        for when, status in self.by_name.get(name, []):
            if when > t:
                break
            entry = (when, status)
        return entry

    def changed_since(self, name: str, t: float) -> bool:
        return any(when > t for when, _ in self.by_name.get(name, []))

    def recent(self, t: float) -> list[str]:
        return sorted(n for n, h in self.by_name.items() if any(when > t for when, _ in h))


def _started(history: History, name: str) -> datetime | None:
    """When ``name`` started by the world's clock (its first status), if the explorer saw it start."""
    first = history.by_name.get(name)
    return datetime.fromtimestamp(first[0][0], UTC) if first else None


def _name(arn: str) -> str:
    return arn.rsplit(":", 1)[-1]


class StaleView(StaleList):
    """The stale answers of one container's DescribeExecution and ListExecutions."""

    def __init__(self, explorer: Any) -> None:
        super().__init__("explorer")
        self.explorer = explorer
        self.lag: dict[int, float] = {}  # id(call) -> how old its view is

    def _draw(self, call: Call, changed: bool) -> float:
        if not changed or not self.explorer.faulty:
            return 0.0
        lag = LAGS[self.explorer.choices.draw(len(LAGS), self.explorer.lag_weights)]
        if lag:
            self.lag[id(call)] = lag
        return lag

    def _redrives(self, parsed: dict[str, Any], then: float) -> None:
        """DescribeExecution's ``redriveCount`` and ``redriveDate`` (absent until a redrive), as
        AWS gives them, from the view the answer is taken from (moto has no redrive)."""
        dates = self.explorer.history.redrives_at(_name(parsed.get("executionArn", "")), then)
        parsed["redriveCount"] = len(dates)
        parsed.pop("redriveDate", None)
        if dates:
            parsed["redriveDate"] = dates[-1]

    def _on_the_clock(self, call: Call, parsed: dict[str, Any]) -> None:
        """moto stamps ``startDate`` by the wall clock, days away from the world's virtual clock that
        Sluice reads; AWS stamps it by the same time Sluice's clocks keep (within their skew).
        Reconciliation judges a holder's age from it, so an answer names the start by the world's
        clock."""
        history: History = self.explorer.history
        if call.operation == "DescribeExecution":
            started = _started(history, _name(parsed.get("executionArn", "")))
            if started is not None and "startDate" in parsed:
                parsed["startDate"] = started
        elif call.operation == "ListExecutions":
            for execution in parsed.get("executions", []):
                started = _started(history, execution.get("name", ""))
                if started is not None:
                    execution["startDate"] = started

    def before(self, injector: Injector, call: Call) -> tuple[Any, dict[str, Any]] | None:
        history: History = self.explorer.history
        now = self.explorer.world.clock.now()
        if call.operation == "DescribeExecution":
            name = _name(call.params.get("executionArn", ""))
            lag = self._draw(call, history.changed_since(name, now - BOUND))
            if lag and history.at(name, now - lag) is None:
                self.lag.pop(id(call), None)
                count("stale:describe_missing")
                return error_answer("ExecutionDoesNotExist", 400)
        elif call.operation == "ListExecutions" and "nextToken" not in call.params:
            self._draw(call, bool(history.recent(now - BOUND)))
        return None

    def after(self, injector: Injector, call: Call, status: int, parsed: dict[str, Any]) -> None:
        if status < 300:
            self._on_the_clock(call, parsed)
        lag = self.lag.pop(id(call), 0.0)
        if call.operation == "DescribeExecution" and status < 300:
            self._redrives(parsed, self.explorer.world.clock.now() - lag)
        if not lag or status >= 300:
            if call.operation == "StartExecution" and status < 300:
                self.explorer.history.started(call.params["name"], call.params["stateMachineArn"])
            return
        history: History = self.explorer.history
        then = self.explorer.world.clock.now() - lag
        if call.operation == "DescribeExecution":
            was = history.at(_name(parsed.get("executionArn", "")), then)
            if was is not None and was != parsed.get("status"):
                count(f"stale:describe_{was.lower()}")
                parsed["status"] = was
                if was == "RUNNING":
                    for gone in ("stopDate", "output", "error", "cause"):
                        parsed.pop(gone, None)
                else:
                    # The end it shows, with the stop date Step Functions gave it (a redrive's
                    # stale answer: the end before it, as its record and its event have it).
                    stop = history.stop_at(_name(parsed.get("executionArn", "")), then)
                    parsed["stopDate"] = stop or datetime.now(UTC)
        elif call.operation == "ListExecutions" and call.params.get("statusFilter") == "RUNNING":
            machine = call.params.get("stateMachineArn")
            listed = {e["name"]: e for e in parsed.get("executions", [])}
            view = {n: e for n, e in listed.items() if history.at(n, then) in (None, "RUNNING")}
            for name in history.recent(then):
                if history.machine.get(name) == machine and history.at(name, then) == "RUNNING":
                    view.setdefault(
                        name,
                        {
                            "executionArn": machine.replace(":stateMachine:", ":execution:") + f":{name}",
                            "stateMachineArn": machine,
                            "name": name,
                            "status": "RUNNING",
                            "startDate": datetime.now(UTC),
                        },
                    )
            # Started after the view was taken: not in it.
            view = {
                n: e for n, e in view.items() if not (n in history.by_name and history.at(n, then) is None)
            }
            if set(view) != set(listed):
                count("stale:list")
            parsed["executions"] = list(view.values())
