"""A tick that other launchers kept from putting MAX in the caps says so (``contended``), not that
AWS throttled or failed: ``sluice tick``'s stopped row, its JSON and its exit code (0: nothing failed)."""

from __future__ import annotations

from sluice.cli.local_tick import LAUNCHER_WORDS
from sluice.cli.room import CONTENDED, hold_text
from sluice.ops.room import Held, Hold, QueueRoom, Room


def room() -> Room:
    queue = QueueRoom(
        lane="default", waiting=3, in_flight=0, delayed=0, in_key_lines=0, running=1, limit=2, free=1
    )
    return Room(max=2, max_error=None, resume_max=None, limit=2, running=1, queues=(queue,), lanes=False)


def test_a_contended_tick_is_its_own_reason_first_and_alone():
    assert room().stop_reasons("contended") == [Held(Hold.CONTENDED)]
    assert room().stop_reasons("transient") == [Held(Hold.TRANSIENT)]


def test_a_contended_tick_names_the_other_launchers_not_aws():
    text = hold_text(room(), Held(Hold.CONTENDED))
    assert text == CONTENDED and "other launchers" in text and "AWS" not in text
    assert LAUNCHER_WORDS["contended"] == CONTENDED
    assert "throttled" in hold_text(room(), Held(Hold.TRANSIENT))
