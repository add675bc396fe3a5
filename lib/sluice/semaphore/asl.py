"""Amazon States Language for the semaphore step: the states to copy, and a wrapper that puts a
section of a workflow between Acquire and Release. Pure: no AWS.

    Acquire ─▶ section (the user's states) ─▶ Release ─▶ next (or End)
       │            │ an error (Catch)
       └────────────┴──────────▶ Release after error ─▶ Reraise (Fail with the original error)

Acquire is a ``lambda:invoke.waitForTaskToken`` Task: the function puts the acquisition in line and
the permit arrives as SendTaskSuccess, its output ``{"semaphore", "acquisitionId"}`` going to
``$.sluicePermit`` so the section still gets its own input. It is retried on Lambda's service errors:
the retry asks again with the same acquisition id, which Sluice takes as the same acquisition (the
same place in line, or the permit already granted, answered on the new token). Every error of the
section's Task, Parallel and Map states (and of Acquire itself: a timeout, an unknown semaphore) goes
to ``Release after error``, which frees the permit or leaves the line, and then to a Fail state that
raises the original error again (``ErrorPath``/``CausePath`` on ``$.sluiceError``). A Succeed state in
the section becomes a Pass to Release, a Fail state a Pass that records its error for the re-raise.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sluice.semaphore.model import check_acquisition_id, check_name

__all__ = [
    "ACQUIRE_RESOURCE",
    "LAMBDA_SERVICE_ERRORS",
    "RELEASE_RESOURCE",
    "StateNames",
    "check_definition",
    "semaphore_states",
    "targets",
    "with_semaphore",
    "wrap_definition",
]

ACQUIRE_RESOURCE = "arn:aws:states:::lambda:invoke.waitForTaskToken"
RELEASE_RESOURCE = "arn:aws:states:::lambda:invoke"
LAMBDA_SERVICE_ERRORS = (
    "Lambda.ServiceException",
    "Lambda.AWSLambdaException",
    "Lambda.SdkClientException",
    "Lambda.TooManyRequestsException",
)
UNKNOWN_SEMAPHORE = "Sluice.UnknownSemaphore"
PERMIT_PATH = "$.sluicePermit"
ERROR_PATH = "$.sluiceError"
RELEASE_ERROR_PATH = "$.sluiceReleaseError"
MAX_STATE_NAME = 80
CATCHING = frozenset({"Task", "Parallel", "Map"})
TERMINAL = frozenset({"Succeed", "Fail"})
MAX_SECONDS = 99_999_999  # TimeoutSeconds' and HeartbeatSeconds' maximum

_LAMBDA_RETRY = {
    "ErrorEquals": list(LAMBDA_SERVICE_ERRORS),
    "IntervalSeconds": 1,
    "MaxAttempts": 6,
    "BackoffRate": 2,
}
_FAILED_RETRY = {
    "ErrorEquals": ["States.TaskFailed"],
    "IntervalSeconds": 2,
    "MaxAttempts": 3,
    "BackoffRate": 2,
}
_ID_CHAR = re.compile(r"[^!-~]|[#|]")


@dataclass(frozen=True)
class StateNames:
    """The names of the four states a semaphore step adds, from a label (default: the semaphore)."""

    acquire: str
    release: str
    release_on_error: str
    reraise: str

    @classmethod
    def of(cls, label: str) -> StateNames:
        names = cls(
            f"Acquire {label}", f"Release {label}", f"Release {label} after error", f"Reraise after {label}"
        )
        for name in names:
            if not name or len(name) > MAX_STATE_NAME:
                raise ValueError(
                    f"state name {name!r} is longer than {MAX_STATE_NAME} characters: pass a shorter label"
                )
        return names

    def __iter__(self) -> Iterator[str]:
        return iter((self.acquire, self.release, self.release_on_error, self.reraise))


def default_acquisition_id(section: str) -> str:
    """An acquisition id from the section's first state name: ASCII without space, ``#``, ``|``; a long
    name is cut and given a hash of the whole, so two sections never share one by accident."""
    text = _ID_CHAR.sub("-", section) or "section"
    if len(text) <= 40:
        return text
    return f"{text[:31]}-{hashlib.sha256(section.encode()).hexdigest()[:8]}"


def _payload(
    action: str, semaphore: str, acquisition_id: str | None, acquisition_id_path: str | None
) -> dict:
    payload: dict[str, Any] = {"action": action, "semaphore": semaphore}
    if acquisition_id_path is not None:
        payload["acquisitionId.$"] = acquisition_id_path
    else:
        payload["acquisitionId"] = acquisition_id
    payload["executionArn.$"] = "$$.Execution.Id"
    if action == "acquire":
        payload["taskToken.$"] = "$$.Task.Token"
    return payload


def _seconds(what: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SECONDS:
        raise ValueError(f"{what} must be a whole number of seconds, 1 to {MAX_SECONDS}, got {value!r}")
    return value


@dataclass(frozen=True)
class _Acquisition:
    """What the semaphore function is called with: the function, the semaphore, and the acquisition's
    id, or the path that gives it at run time."""

    function_arn: str
    semaphore: str
    acquisition_id: str | None
    acquisition_id_path: str | None

    def parameters(self, action: str) -> dict[str, Any]:
        return {
            "FunctionName": self.function_arn,
            "Payload": _payload(action, self.semaphore, self.acquisition_id, self.acquisition_id_path),
        }


def semaphore_states(
    *,
    semaphore: str,
    function_arn: str,
    section: str,
    acquisition_id: str | None = None,
    acquisition_id_path: str | None = None,
    next: str | None = None,
    timeout_seconds: int | None = None,
    heartbeat_seconds: int | None = None,
    result_path: str | None = PERMIT_PATH,
    label: str | None = None,
) -> dict[str, dict[str, Any]]:
    """The four states of a semaphore step around the section starting at ``section``: Acquire
    (first: point the state before the section at it), Release (point the section's end at it; it goes
    on to ``next``, or ends the execution), Release after error (the section's Catch goes to it) and the
    Fail state that re-raises.

    ``acquisition_id`` names this acquisition within the execution (default: from ``section``); inside
    a Map, where iterations share the execution, give ``acquisition_id_path`` instead, such as
    ``"States.Format('item-{}', $$.Map.Item.Index)"``. ``result_path`` is where the permit goes (None:
    dropped, the section gets Acquire's input)."""
    check_name(semaphore)
    if not function_arn or not isinstance(function_arn, str):
        raise ValueError("function_arn: the ARN (or name) of Sluice's semaphore function is required")
    if not section:
        raise ValueError("section: the name of the section's first state is required")
    call = _Acquisition(function_arn, semaphore, *_acquisition(section, acquisition_id, acquisition_id_path))
    timeout, heartbeat = _timeouts(timeout_seconds, heartbeat_seconds)
    names = StateNames.of(label or semaphore)
    if section in set(names) or next in set(names):
        raise ValueError(
            f"state name {section if section in set(names) else next!r} is one the semaphore step adds"
        )
    done = _release(call, f"Give back the permit of semaphore {semaphore} (Sluice)")
    done.update({"Next": next} if next else {"End": True})
    return {
        names.acquire: _acquire(call, names, section, result_path, timeout, heartbeat),
        names.release: done,
        names.release_on_error: _release_on_error(call, names),
        names.reraise: {
            "Type": "Fail",
            "Comment": "The section's error, raised again once the permit is given back",
            "ErrorPath": f"{ERROR_PATH}.Error",
            "CausePath": f"{ERROR_PATH}.Cause",
        },
    }


def _acquisition(
    section: str, acquisition_id: str | None, acquisition_id_path: str | None
) -> tuple[str | None, str | None]:
    """The acquisition id (checked; default: from ``section``), or the path that gives it."""
    if acquisition_id is not None and acquisition_id_path is not None:
        raise ValueError("give acquisition_id or acquisition_id_path, not both")
    if acquisition_id_path is None:
        acquisition_id = check_acquisition_id(acquisition_id or default_acquisition_id(section))
    elif not acquisition_id_path.startswith(("$", "States.")):
        raise ValueError(
            f"acquisition_id_path {acquisition_id_path!r}: a path ($...) or an intrinsic (States.*)"
        )
    return acquisition_id, acquisition_id_path


def _timeouts(timeout_seconds: int | None, heartbeat_seconds: int | None) -> tuple[int | None, int | None]:
    timeout = _seconds("timeout_seconds", timeout_seconds)
    heartbeat = _seconds("heartbeat_seconds", heartbeat_seconds)
    if timeout is not None and heartbeat is not None and heartbeat >= timeout:
        raise ValueError(f"heartbeat_seconds ({heartbeat}) must be less than timeout_seconds ({timeout})")
    return timeout, heartbeat


def _acquire(
    call: _Acquisition,
    names: StateNames,
    section: str,
    result_path: str | None,
    timeout: int | None,
    heartbeat: int | None,
) -> dict[str, Any]:
    """Wait in line for a permit (a task token the permit answers), then go on to ``section``."""
    acquire: dict[str, Any] = {
        "Type": "Task",
        "Comment": f"Wait for a permit of semaphore {call.semaphore} (Sluice)",
        "Resource": ACQUIRE_RESOURCE,
        "Parameters": call.parameters("acquire"),
        "ResultPath": result_path,
    }
    if timeout is not None:
        acquire["TimeoutSeconds"] = timeout
    if heartbeat is not None:
        acquire["HeartbeatSeconds"] = heartbeat
    acquire.update(
        Retry=[
            {"ErrorEquals": [UNKNOWN_SEMAPHORE], "MaxAttempts": 0},
            dict(_LAMBDA_RETRY),
            dict(_FAILED_RETRY),
        ],
        Catch=[{"ErrorEquals": ["States.ALL"], "ResultPath": ERROR_PATH, "Next": names.release_on_error}],
        Next=section,
    )
    return acquire


def _release(call: _Acquisition, comment: str) -> dict[str, Any]:
    return {
        "Type": "Task",
        "Comment": comment,
        "Resource": RELEASE_RESOURCE,
        "Parameters": call.parameters("release"),
        "ResultPath": None,
        "Retry": [dict(_LAMBDA_RETRY), dict(_FAILED_RETRY)],
    }


def _release_on_error(call: _Acquisition, names: StateNames) -> dict[str, Any]:
    """Release, or leave the line, after an error; then on to the re-raise, even if that fails."""
    failed = _release(
        call, f"Give back the permit of semaphore {call.semaphore}, or leave its line; then re-raise"
    )
    failed["Catch"] = [
        {"ErrorEquals": ["States.ALL"], "ResultPath": RELEASE_ERROR_PATH, "Next": names.reraise}
    ]
    failed["Next"] = names.reraise
    return failed


def with_semaphore(
    states: Mapping[str, Mapping[str, Any]],
    start_at: str,
    *,
    semaphore: str,
    function_arn: str,
    acquisition_id: str | None = None,
    acquisition_id_path: str | None = None,
    next: str | None = None,
    timeout_seconds: int | None = None,
    heartbeat_seconds: int | None = None,
    result_path: str | None = PERMIT_PATH,
    label: str | None = None,
) -> dict[str, dict[str, Any]]:
    """The section ``states`` (starting at ``start_at``) held under ``semaphore``: Acquire first (the
    entry: the state before the section goes to it, or make it ``StartAt``), then the section's states
    with every end going to Release and every error caught, then Release (to ``next``, or the end of
    the execution) and the error path. Raises ``ValueError`` when a name is taken twice or a state of
    the section goes to a state outside it (it would leave without releasing)."""
    if start_at not in states:
        raise ValueError(f"start_at {start_at!r} is not one of the section's states")
    if next is not None and next in states:
        raise ValueError(f"next {next!r} is a state of the section: it must come after it")
    added = semaphore_states(
        semaphore=semaphore,
        function_arn=function_arn,
        section=start_at,
        acquisition_id=acquisition_id,
        acquisition_id_path=acquisition_id_path,
        next=next,
        timeout_seconds=timeout_seconds,
        heartbeat_seconds=heartbeat_seconds,
        result_path=result_path,
        label=label,
    )
    taken = sorted(set(added) & set(states))
    if taken:
        raise ValueError(f"state name {taken[0]!r} is taken in the section: pass another label")
    names = StateNames(*added)
    section = {name: _in_section(name, dict(state), names) for name, state in states.items()}
    for name, state in section.items():
        for target in targets(state):
            if target not in states and target not in (names.release, names.release_on_error):
                raise ValueError(
                    f"state {name!r} goes to {target!r}, outside the section: it would leave without "
                    "releasing. Put it in the section, or end the section there"
                )
    acquire, *rest = added.items()
    return dict([acquire, *section.items(), *rest])


def wrap_definition(definition: Mapping[str, Any], **options: Any) -> dict[str, Any]:
    """A whole state machine definition held under a semaphore (its top-level states are the section;
    the execution ends after Release). ``options`` are ``with_semaphore``'s."""
    if "States" not in definition or "StartAt" not in definition:
        raise ValueError("a state machine definition has StartAt and States")
    if options.get("next") is not None:
        raise ValueError("next: the wrapped definition ends after Release")
    states = with_semaphore(definition["States"], definition["StartAt"], **options)
    out = {k: copy.deepcopy(v) for k, v in definition.items() if k not in ("StartAt", "States")}
    return {**out, "StartAt": next(iter(states)), "States": states}


def _in_section(name: str, state: dict[str, Any], names: StateNames) -> dict[str, Any]:
    state = copy.deepcopy(state)
    kind = state.get("Type")
    if kind == "Succeed":
        return _keep(state, "Comment", "InputPath", "OutputPath") | {"Type": "Pass", "Next": names.release}
    if kind == "Fail":
        recorded: dict[str, Any] = {"Type": "Pass", **_keep(state, "Comment")}
        if "ErrorPath" in state or "CausePath" in state:
            recorded["Parameters"] = {
                **(
                    {"Error.$": state["ErrorPath"]}
                    if "ErrorPath" in state
                    else {"Error": state.get("Error", "")}
                ),
                **(
                    {"Cause.$": state["CausePath"]}
                    if "CausePath" in state
                    else {"Cause": state.get("Cause", "")}
                ),
            }
        else:
            recorded["Result"] = {"Error": state.get("Error", ""), "Cause": state.get("Cause", "")}
        return recorded | {"ResultPath": ERROR_PATH, "Next": names.release_on_error}
    if state.pop("End", False):
        state["Next"] = names.release
    if kind in CATCHING:
        catchers = state.setdefault("Catch", [])
        if not any("States.ALL" in c.get("ErrorEquals", ()) for c in catchers):
            catchers.append(
                {"ErrorEquals": ["States.ALL"], "ResultPath": ERROR_PATH, "Next": names.release_on_error}
            )
    return state


def _keep(state: Mapping[str, Any], *fields: str) -> dict[str, Any]:
    return {f: state[f] for f in fields if f in state}


def targets(state: Mapping[str, Any]) -> list[str]:
    """The states a state may go to next, in its own scope (not inside a Parallel's or Map's)."""
    out = [state["Next"]] if "Next" in state else []
    out += [c["Next"] for c in state.get("Catch", ()) if "Next" in c]
    if state.get("Type") == "Choice":
        out += [c["Next"] for c in state.get("Choices", ()) if "Next" in c]
        if "Default" in state:
            out.append(state["Default"])
    return out


def check_definition(definition: Mapping[str, Any]) -> list[str]:
    """What is structurally wrong with a definition's top level (empty: nothing found): StartAt and
    every Next, Default and Catch target exist, each state either goes on or ends (not both), and
    every state is reachable. Step Functions checks more; this catches what a splice can break."""
    problems: list[str] = []
    states = definition.get("States") or {}
    start = definition.get("StartAt")
    if start not in states:
        problems.append(f"StartAt {start!r} is not a state")
    for name, state in states.items():
        if len(name) > MAX_STATE_NAME:
            problems.append(f"state name {name!r} is longer than {MAX_STATE_NAME}")
        kind = state.get("Type")
        for target in targets(state):
            if target not in states:
                problems.append(f"{name!r} goes to {target!r}, which is not a state")
        ends = bool(state.get("End"))
        if kind in TERMINAL:
            if ends or "Next" in state:
                problems.append(f"{name!r} ({kind}) has Next or End")
        elif kind == "Choice":
            if not state.get("Choices") or ends or "Next" in state:
                problems.append(f"{name!r} (Choice) needs Choices and no Next or End")
        elif ends == ("Next" in state):
            problems.append(f"{name!r} ({kind}) needs exactly one of Next and End")
    seen: set[str] = set()
    todo = [start] if start in states else []
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [t for t in targets(states[name]) if t in states]
    problems += [f"{name!r} is never reached" for name in states if name not in seen]
    return problems
