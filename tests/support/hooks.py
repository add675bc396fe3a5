"""Fault injection through botocore event hooks on a client: throttling, crashes, call counting."""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import botocore.endpoint


class Crash(BaseException):
    """The Lambda stopped here (timeout, OOM, kill). Escapes ``except Exception`` like the real thing."""


class _Http:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code
        self.headers: dict[str, str] = {}
        self.content = b""


def error_answer(code: str, status: int) -> tuple[_Http, dict[str, Any]]:
    """What a ``before-call`` hook returns to answer a call with an AWS error, without sending it.

    Use ``before-call``, not ``before-send``: botocore runs every ``before-send`` handler and moto's
    is one of them, so moto would still carry out a request that a ``before-send`` hook "refused".
    """
    parsed = {
        "Error": {"Code": code, "Message": f"{code} (injected)"},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}},
    }
    return _Http(status), parsed


class RawBody(io.BytesIO):
    """The raw body of an ``AWSResponse`` made up by a hook (botocore reads it through ``stream``)."""

    def stream(self, **_: Any) -> Iterator[bytes]:
        contents = self.read()
        while contents:
            yield contents
            contents = self.read()


class _TimeWithoutSleep:
    """``time`` as ``botocore.endpoint`` sees it: ``sleep`` records the delay and returns at once."""

    def __init__(self, delays: list[float]) -> None:
        self.delays = delays

    def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@contextmanager
def retry_sleeps() -> Iterator[list[float]]:
    """botocore's retry backoff recorded instead of slept, for clients that retry as deployed
    (``botocore.endpoint`` sleeps between attempts). Yields the delays asked for."""
    delays: list[float] = []
    original = botocore.endpoint.time
    botocore.endpoint.time = _TimeWithoutSleep(delays)  # type: ignore[assignment]
    try:
        yield delays
    finally:
        botocore.endpoint.time = original  # type: ignore[assignment]


def throttle(client: Any, operation: str, *, times: int | None = None) -> Counter:
    """Answer ``operation`` with ThrottlingException (``times`` times, or always). Nothing is sent."""
    seen: Counter = Counter()

    def hook(**_: Any) -> tuple[_Http, dict[str, Any]] | None:
        if times is not None and seen["throttled"] >= times:
            return None
        seen["throttled"] += 1
        return error_answer("ThrottlingException", 400)

    client.meta.events.register(f"before-call.{_service(client)}.{operation}", hook)
    return seen


def crash_after(client: Any, operation: str, *, after: int = 1) -> Counter:
    """Let ``operation`` succeed, then die on its ``after``-th success (the side effect happened)."""
    seen: Counter = Counter()

    def hook(http_response: Any, parsed: Any, **_: Any) -> None:
        if http_response.status_code < 300:
            seen["calls"] += 1
            if seen["calls"] == after:
                raise Crash(f"stopped after {operation}")

    client.meta.events.register(f"after-call.{_service(client)}.{operation}", hook)
    return seen


def crash_before(client: Any, operation: str) -> None:
    """Die just before ``operation`` is sent."""

    def hook(**_: Any) -> None:
        raise Crash(f"stopped before {operation}")

    client.meta.events.register(f"before-call.{_service(client)}.{operation}", hook)


def lambda_invocations(events: Any) -> list[dict[str, Any]]:
    """Answer every Lambda ``Invoke`` made through ``events`` (a client's ``meta.events``, or a boto3
    session's ``events`` before its clients are made) as Lambda answers an asynchronous one, 202,
    without sending it (moto would try to run the function in Docker). Returns the invocations, in
    order: ``{"function", "type", "event"}``; a test plays Lambda by running the handler with them."""
    seen: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **_: Any) -> None:  # the call's parameters, as the caller gave them
        payload = params.get("Payload", b"{}")
        seen.append(
            {
                "function": params["FunctionName"],
                "type": params.get("InvocationType", "RequestResponse"),
                "event": json.loads(payload.decode() if isinstance(payload, bytes) else payload),
            }
        )

    def answer(**_: Any) -> tuple[_Http, dict[str, Any]]:
        return _Http(202), {"StatusCode": 202, "ResponseMetadata": {"HTTPStatusCode": 202, "HTTPHeaders": {}}}

    events.register("before-parameter-build.lambda.Invoke", record)
    events.register("before-call.lambda.Invoke", answer)
    return seen


def count_calls(*clients: Any) -> Counter:
    """Count every API call the clients make, by operation."""
    calls: Counter = Counter()

    def hook(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    for client in clients:
        client.meta.events.register("before-call.*.*", hook)
    return calls


def receipts_of(client: Any) -> list[str]:
    """The receipt handles of the messages a client receives, in order."""
    seen: list[str] = []
    client.meta.events.register(
        "after-call.sqs.ReceiveMessage",
        lambda parsed, **_: seen.extend(m["ReceiptHandle"] for m in parsed.get("Messages", [])),
    )
    return seen


def unregister_all(client: Any, event: str, handler: Callable[..., Any]) -> None:
    client.meta.events.unregister(event, handler)


def _service(client: Any) -> str:
    return client.meta.service_model.service_id.hyphenize()
