"""MAX at run time: an SSM parameter read on every tick, cached for a few seconds."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sluice.adapters.errors import translated
from sluice.errors import ConfigurationError, NotFound, TransientError
from sluice.model import MaxReading
from sluice.ports import Clock

log = logging.getLogger("sluice.max")


def parse_max(raw: str, *, source: str) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigurationError(f"{source}={raw!r}: MAX must be a whole number >= 0 (0 pauses)") from None
    if value < 0:
        raise ConfigurationError(f"{source}={value}: MAX must be >= 0 (0 pauses)")
    return value


def changed_at(parameter: dict[str, Any]) -> float:
    """When the parameter last changed: orders the limits launchers work out from their readings.
    Its ``Version`` would restart at 1 if the parameter were deleted and created again."""
    modified = parameter.get("LastModifiedDate")
    if isinstance(modified, datetime):
        return modified.timestamp()
    return float(modified or 0.0)


def reading_of(parameter: dict[str, Any], name: str) -> MaxReading:
    """MAX from a GetParameter answer, with when it changed and its version."""
    return MaxReading(
        parse_max(parameter["Value"], source=name), changed_at(parameter), int(parameter.get("Version", 0))
    )


class FixedMax:
    """MAX from the deployed default only."""

    def __init__(self, value: int) -> None:
        self.value = value

    def reading(self) -> MaxReading:
        return MaxReading(self.value, 0.0)  # never changes: only the external count orders limits


class SsmMax:
    """The run-time override in SSM; the deployed default when the parameter is missing.

    A value that is not a whole number >= 0 is a configuration error: the tick fails loudly and
    starts nothing, rather than guessing what the operator meant.
    """

    def __init__(
        self, client: Any, name: str, *, default: int, clock: Clock, cache_seconds: float = 5.0
    ) -> None:
        self.client = client
        self.name = name
        self.default = default
        self.clock = clock
        self.cache_seconds = cache_seconds
        self._cached: tuple[float, MaxReading] | None = None

    def reading(self) -> MaxReading:
        now = self.clock.now()
        if self._cached and now - self._cached[0] < self.cache_seconds:
            return self._cached[1]
        try:
            with translated("GetParameter"):
                parameter = self.client.get_parameter(Name=self.name)["Parameter"]
            value = reading_of(parameter, self.name)
        except NotFound:
            log.warning(
                "MAX parameter missing; using the deployed default",
                extra={"parameter": self.name, "max": self.default},
            )
            value = MaxReading(self.default, None)
        except TransientError:
            # No fallback to the value read before, however recent: it could exceed a MAX the
            # operator has lowered since. End the tick instead; the next one reads MAX again.
            raise
        self._cached = (now, value)
        return value
