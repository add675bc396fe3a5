"""MAX at run time: an SSM parameter read on every tick, cached for a few seconds."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sluice.adapters.errors import translated
from sluice.core.errors import ConfigurationError, NotFound, TransientError
from sluice.core.limits import MaxReading
from sluice.core.ports import Clock
from sluice.core.validation import MAX_CEILING, MaxAboveCeiling, whole_number

log = logging.getLogger("sluice.max")


def parse_max(raw: str, *, source: str) -> int:
    try:
        value = whole_number(raw, ceiling=MAX_CEILING)
    except MaxAboveCeiling as exc:
        raise MaxAboveCeiling(f"{source}: MAX {exc} (0 pauses)") from None
    if value is None:
        raise ConfigurationError(
            f"{source}={str(raw)[:40]!r}: MAX must be a whole number from 0 to {MAX_CEILING:,} (0 pauses)"
        )
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


class MaxParameter:
    """The MAX parameter as the operator's commands use it (``sluice.ops.maximum``): its value, its
    reading, writes, and the tags ``pause`` remembers the value in force with."""

    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.name = name

    def _get(self) -> dict[str, Any]:
        with translated("GetParameter"):
            return dict(self.client.get_parameter(Name=self.name)["Parameter"])

    def raw(self) -> str | None:
        """The value as it is written (None: no such parameter)."""
        try:
            return str(self._get()["Value"])
        except NotFound:
            return None

    def reading(self) -> MaxReading:
        """MAX with when it changed; ``NotFound`` when missing, ``ConfigurationError`` when unusable."""
        return reading_of(self._get(), self.name)

    def write(self, value: int) -> None:
        with translated("PutParameter"):
            self.client.put_parameter(Name=self.name, Value=str(value), Type="String", Overwrite=True)

    def create(self, value: int, tags: Mapping[str, str]) -> None:
        """Create the parameter with ``value`` and ``tags`` (it must not exist)."""
        with translated("PutParameter"):
            self.client.put_parameter(Name=self.name, Value=str(value), Type="String", Tags=_tag_list(tags))

    def tags(self) -> dict[str, str]:
        with translated("ListTagsForResource"):
            answer = self.client.list_tags_for_resource(ResourceType="Parameter", ResourceId=self.name)
        return {t["Key"]: t["Value"] for t in answer.get("TagList", [])}

    def tag(self, tags: Mapping[str, str]) -> None:
        with translated("AddTagsToResource"):
            self.client.add_tags_to_resource(
                ResourceType="Parameter", ResourceId=self.name, Tags=_tag_list(tags)
            )

    def untag(self, keys: Sequence[str]) -> None:
        with translated("RemoveTagsFromResource"):
            self.client.remove_tags_from_resource(
                ResourceType="Parameter", ResourceId=self.name, TagKeys=list(keys)
            )


def _tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


class FixedMax:
    """MAX from the deployed default only."""

    def __init__(self, value: int) -> None:
        self.value = value

    def reading(self) -> MaxReading:
        return MaxReading(self.value, 0.0)  # never changes: only the external count orders limits


class SsmMax:
    """The run-time override in SSM; the deployed default when the parameter is missing.

    A value that is not a whole number >= 0 is a configuration error: the tick fails loudly and
    starts nothing, rather than guessing what the operator meant. A whole number above
    ``MAX_CEILING`` is refused without failing the tick (``_refused``): the limit in force stays.
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
        except MaxAboveCeiling as exc:
            value = self._refused(parameter, str(exc))
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

    def _refused(self, parameter: dict[str, Any], reason: str) -> MaxReading:
        """MAX while the parameter holds a number above the ceiling: the deployed default, stamped
        older than any change of the parameter. The slots keep the newer of their stamp and a
        writer's, so the MAX last put in force from the parameter stays in force, whatever this
        container read before; only a pool never set from the parameter takes the default. Not
        this container's last reading: a pool whose stamp is unfenced (the parameter was missing)
        would take it as it is, and it may be older than the default in force."""
        log.error(
            "MAX parameter refused: %s; the MAX in force stays (the deployed default, %d, where none was "
            "set from the parameter) until it is set to a whole number from 0 to %d",
            reason,
            self.default,
            MAX_CEILING,
            extra={"parameter": self.name, "max": self.default, "event": "MaxParameterRefused"},
        )
        return MaxReading(self.default, 0.0)
