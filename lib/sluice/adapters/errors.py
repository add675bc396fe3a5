"""Translate botocore failures into ``sluice.core.errors``. Nothing above the adapters sees ``ClientError``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from botocore.exceptions import BotoCoreError, ClientError, ConnectionError, HTTPClientError, ReadTimeoutError

from sluice.core.errors import ConditionFailed, ConfigurationError, NotFound, TransientError

THROTTLING = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestThrottledException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "TransactionConflictException",  # an item held by another writer's transaction for a moment
        "LimitExceededException",
        "SlowDown",
        "KMS.ThrottlingException",
        "AWS.SimpleQueueService.RequestThrottled",
    }
)
CONFIGURATION = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "ExpiredToken",
        "ExpiredTokenException",
        "StateMachineDoesNotExist",
        "StateMachineDeleting",
        "ResourceNotFoundException",
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "InvalidArn",
        "ParameterNotFound",
        "KMS.DisabledException",
        "KMS.NotFoundException",
        "KMS.AccessDeniedException",
    }
)

NOT_FOUND = frozenset({"ParameterNotFound", "ExecutionDoesNotExist"})


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def http_status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def translate_client_error(exc: ClientError, operation: str) -> Exception:
    code = error_code(exc)
    message = f"{operation}: {code}: {exc.response.get('Error', {}).get('Message', '')}".rstrip(": ")
    if code in THROTTLING or http_status(exc) >= 500:
        return TransientError(message, operation=operation, code=code, throttled=code in THROTTLING)
    if code == "ConditionalCheckFailedException":
        return ConditionFailed(message)
    if code in NOT_FOUND:
        return NotFound(message)
    if code in CONFIGURATION:
        return ConfigurationError(message)
    # Any other 4xx is a request Sluice should never have made: say so loudly.
    return ConfigurationError(message)


@contextmanager
def translated(operation: str) -> Iterator[None]:
    """Run one AWS call; re-raise its failure as a Sluice error."""
    try:
        yield
    except ClientError as exc:
        raise translate_client_error(exc, operation) from exc
    except (ConnectionError, HTTPClientError, ReadTimeoutError) as exc:
        raise TransientError(f"{operation}: {exc}", operation=operation, code=type(exc).__name__) from exc
    except BotoCoreError as exc:
        raise ConfigurationError(f"{operation}: {exc}") from exc
