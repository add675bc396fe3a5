"""The broken variants the explorer hunts (``python -m tests.explorer.variants NAME``).

Each is a patch of Sluice's code for the duration of a run: the code as it was before one of the
breaks of docs/reliability.md was fixed (``b1`` .. ``b8``), or one of the project's broken variants
(tests/reliability/test_*variants.py), applied as that test applies it. A patch is
``(owner, attribute, replacement)``; an owner that is a dict has the item replaced.
"""

from __future__ import annotations

import inspect
import json
import re
import uuid
from dataclasses import replace
from typing import Any

import sluice.adapters.aws.sfn
import sluice.adapters.aws.sqs
import sluice.adapters.aws.sqs_dead_letters
import sluice.adapters.aws.ssm
import sluice.adapters.dynamo.claims
import sluice.adapters.dynamo.launch_slots
import sluice.adapters.dynamo.records
import sluice.adapters.dynamo.release
import sluice.core.errors
import sluice.core.model
import sluice.core.names
import sluice.core.records
import sluice.enqueue
import sluice.features.attributes
import sluice.features.awaits
import sluice.features.keys
import sluice.features.rate_limits
import sluice.launch.admission
import sluice.launch.completion
import sluice.launch.handover
import sluice.launch.lane_admission
import sluice.launch.message_branches
import sluice.launch.per_message
import sluice.launch.reconcile
import sluice.launch.redriven
from sluice.adapters.dynamo.codec import execution_pk, park_pk, values
from sluice.adapters.dynamo.keys import KeysTable
from sluice.adapters.dynamo.lanes import LaneSlots
from sluice.adapters.dynamo.parking import ParkingTable
from sluice.adapters.dynamo.release import ReleasesTable
from sluice.adapters.dynamo.slots import DynamoSlots
from sluice.adapters.dynamo.store import DynamoStore
from sluice.core.errors import InvalidPayload
from sluice.core.external import ExternalCount
from sluice.core.limits import LimitSource
from sluice.core.model import Ending, ExecutionInfo, ParkedMessage
from sluice.enqueue import Item
from sluice.features import attributes
from sluice.features.awaits import AWAITS_ATTRIBUTE, Waiter, check_awaits
from sluice.features.keys import TICKET_ATTRIBUTE
from sluice.launch.lane_admission import LaneAdmission
from sluice.launch.redriven import Rerun
from sluice.primitives.slots import Capacity
from sluice.semaphore.step import Semaphores, pool_of
from tests.reliability.test_broken_variants import (
    creating_the_lanes_pools_only,
    keeping_the_lane_slot,
    without_the_lane_slot,
)
from tests.reliability.test_caps_variants import past_the_cap
from tests.reliability.test_key_variants import lifted_on_any_end, unfenced_block, unfenced_mark
from tests.reliability.test_once_semaphore_variants import expiring_invalid, expiring_release
from tests.reliability.test_redriven_variants import one_redriven_mark

Patch = tuple[Any, str, Any]
_line_item = KeysTable._line_item
_busiest = sluice.features.rate_limits.busiest
_with_override = sluice.features.rate_limits.RateBook.with_override


def _earlier_end_of_any_status(info: Any, record: Any) -> bool:
    """``earlier_end`` before seed 111160034's fix: a SUCCEEDED answer could be taken for an end
    from before a redrive."""
    same = sluice.launch.completion._same_stop
    if record is None or not info.ended or record.state.value == "SUCCEEDED":
        return False
    return same(info.stop_date, record.ended_at) or same(info.stop_date, record.earlier_end_at)


def _not_its_earlier_end_any_status(change: Any, now: float, window: float, judge: Any) -> Any:
    """``completion._not_its_earlier_end`` before seed 111160034's fixes: a SUCCEEDED event with the
    adoption's earlier stop released nothing either."""
    same = sluice.launch.completion._same_stop
    return lambda record: not same(change.stop_date, record.earlier_end_at)


def _granted_alone(self: Any, scopes: Any, n: int, now_ms: int, periods: Any) -> Any:
    return replace(self, windows={**self.windows, **{s: ((now_ms, n),) for s in scopes}})


def _young_for_one_window(record: Any, now: float, window: float, judge: Any) -> bool:
    return record.adopted_at is not None and now - record.adopted_at < window


def _seen_by_untagged(self: Any, clock: Any) -> Any:
    return next((at for who, _, at in self.adoption_seen if who == clock), None)


def _young_by_any_clock(record: Any, now: float, window: float, judge: Any) -> bool:
    return record.adopted_at is not None and now - record.adopted_at < 2 * window


completion, reconcile = sluice.launch.completion, sluice.launch.reconcile

_RAN_AGAIN = sluice.launch.redriven.ran_again


def _unsure_taken_for_ended(p: Any, info: Any, record: Any) -> Rerun:
    rerun = _RAN_AGAIN(p, info, record)
    return Rerun.ENDED if rerun is Rerun.UNSURE else rerun


def _override_resetting(self: Any, scope: str, value: Any) -> Any:
    book = _with_override(self, scope, value)
    return replace(book, windows={k: v for k, v in book.windows.items() if k != scope})


_process = sluice.launch.per_message.MessageProtocol._one


class _NoGrant:
    def take(self, ckey: str) -> None:
        return None

    def give_back(self, grant: Any) -> None:
        pass


def _one_but_woken_take_no_grant(self: Any, message: Any, *args: Any, **kwargs: Any) -> Any:
    """A woken waiter's claim takes no grant of its key's rate: the wake sent it for the room."""
    if TICKET_ATTRIBUTE not in message.attributes:
        return _process(self, message, *args, **kwargs)
    held, self.held_keys = self.held_keys, _NoGrant()
    try:
        return _process(self, message, *args, **kwargs)
    finally:
        self.held_keys = held


def _random_name(key: str, message_id: str) -> str:
    return f"run-{uuid.uuid4().hex}"


def _isdigit_ticket(raw: str) -> str:
    """Break 7: ``str.isdigit`` takes "²", which ``int`` refuses."""
    ticket, at, ms = raw.partition("@")
    if not (ticket.isdigit() and at and ms.isdigit() and len(raw) <= 40):
        raise InvalidPayload(f"{TICKET_ATTRIBUTE!r} is {raw!r}, not <ticket>@<ms>")
    return raw


def _unguarded_awaits(raw: str, *, key: str | None = None) -> tuple[str, ...]:
    """Break 8: ``json.loads`` with ValueError caught, not RecursionError."""
    try:
        value = json.loads(raw)
    except ValueError:
        raise InvalidPayload(f"{AWAITS_ATTRIBUTE} is not JSON", key=key) from None
    return check_awaits(value, key=key)


def _read_items_whole(text: str) -> Any:
    """Break 10: an array or an object parsed whole, so one element Python cannot build (a number
    of 5,000 digits, nesting past the recursion limit) fails the command (JSON Lines went line by line)."""
    stripped = text.strip()
    if not stripped:
        return
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        pass
    else:
        if isinstance(whole, list):
            for i, element in enumerate(whole, start=1):
                yield Item(f"item {i}", json.dumps(element, ensure_ascii=False, separators=(",", ":")))
        else:
            yield Item("line 1", stripped)
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield Item(f"line {lineno}", line.strip())


def _read_then_write(self: Semaphores, semaphore: str, limit: int) -> bool:
    """Break 11: absent when read, so the configured limit is written whatever came since."""
    if self.slots.occupancy(pool_of(semaphore)).version:
        return False
    self.set_limit(semaphore, limit)
    return True


RULES = attributes.RULES

# name -> (what the variant breaks, its patches)
_LEASE_TERMS = sluice.adapters.dynamo.release._lease_terms


def _line_item_unlanded(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A woken waiter's park again that only takes its entry out of ``inflight`` (the code before)."""
    made = _line_item(self, *args, **kwargs)
    update = made["Update"]
    update["UpdateExpression"] = update["UpdateExpression"].replace(" ADD #landed :replaces", "")
    update["ExpressionAttributeNames"].pop("#landed", None)
    return made


def _drop_unlanded(self: Any, ckey: str, entries: Any) -> None:
    """``forgo`` as before: out of ``inflight`` only (a no-op before the wake notes the entry)."""
    self.db.client.update_item(
        TableName=self.db.table,
        Key={"pk": {"S": f"CKEY#{ckey}"}},
        UpdateExpression="DELETE #inflight :drop",
        ExpressionAttributeNames={"#inflight": "inflight"},
        ExpressionAttributeValues={":drop": {"SS": list(entries)}},
    )


def _stale_by_clock(self: Any, now: float) -> tuple[str, ...]:
    """``KeyState.stale`` before seed 1206004492's fix: every entry, a ``landed`` note too, judged by
    the reader's clock (a reader an hour behind drops a fresh note as dated ahead)."""
    lo, hi = now - sluice.core.records.INFLIGHT_SECONDS, now + sluice.core.records.INFLIGHT_SECONDS
    done = self.inflight & self.landed
    return tuple(
        sorted(
            e
            for e in self.inflight | self.landed
            if e in done or not lo < sluice.core.records.sent_at(e) <= hi
        )
    )


def _stale_landed_at_once(self: Any, now: float) -> tuple[str, ...]:
    """Every ``landed`` note dropped at the next wake, its wake's note still to come or not."""
    return tuple(sorted(set(_stale_by_clock(self, now)) | set(self.landed)))


def _stale_landed_unbounded(self: Any, now: float) -> tuple[str, ...]:
    """``KeyState.stale`` at seed 1206004492's fix: every ``landed`` note in the line kept, however
    many (forged tickets in a line that stands still pile up until the key's item is full)."""
    lo, hi = now - sluice.core.records.INFLIGHT_SECONDS, now + sluice.core.records.INFLIGHT_SECONDS
    number, sent_at = sluice.core.records.ticket_number, sluice.core.records.sent_at
    done = self.inflight & self.landed
    unnoted = {e for e in self.landed - self.inflight if not self.woken <= number(e) < self.tickets}
    lapsed = {e for e in self.inflight - self.landed if not lo < sent_at(e) <= hi}
    return tuple(sorted(done | unnoted | lapsed))


def _park_checked_by_the_payloads_index(store: Any, waiter: Any, *, replaces: Any, fair: Any) -> bool:
    """``keys._park`` before seed 1206101088's fix: a park whose answer was lost is known landed by
    the payload's index (``KWAITOF#<key>``), which a later park of another message of it rewrites."""
    try:
        return store.park_for_key(waiter, tickets=waiter.ticket, replaces=replaces, fair=fair)
    except sluice.core.errors.TransientError:
        place = store.key_wait_of(waiter.key)
        mine = (waiter.ckey, waiter.ticket, waiter.message_id)
        if place is None or (place.ckey, place.ticket, place.message_id) != mine:
            raise
        return True


def _park_checked_by_message_id_alone(store: Any, waiter: Any, *, replaces: Any, fair: Any) -> bool:
    """``keys._park`` at seed 1206101088's fix: a lost park judged by the message id in the line's
    item alone, which another payload's message may carry (a producer's origin)."""
    try:
        return store.park_for_key(waiter, tickets=waiter.ticket, replaces=replaces, fair=fair)
    except sluice.core.errors.TransientError:
        if [w.message_id for w in store.key_waiters(waiter.ckey, [waiter.ticket])] != [waiter.message_id]:
            raise
        return True


def _settle_ended_unconfirmed(self: Any, name: str, info: Any) -> None:
    """``MessageBranches._settle_ended`` before seed 1206301599's fix: the end is not judged again
    against the record the release reads (a redrive and its adoption since the answer)."""
    sluice.launch.message_branches.complete(
        store=self.ctx.store,
        queue=self.ctx.queue,
        name=name,
        ending=Ending(
            sluice.core.model.PayloadState.after(info.status),
            self.ctx.clock.now(),
            error=info.error,
            cause=info.cause,
            ended_at=info.stop_date,
            started_at=info.start_date,
        ),
        output=sluice.launch.message_branches.output_from(info.output, self.ctx.outputs),
        effects=self.ctx.effects,
    )


_REAL_RECORD_CONDITION = sluice.adapters.dynamo.release._record_condition


def _record_condition_without_adoption(record: Any, fence: Any, named: dict[str, Any]) -> str:
    """``release._record_condition`` before the adoption was held as read: an adoption between a
    release's read and its write is released on an end judged against the record before it."""
    r = sluice.adapters.dynamo.release
    condition = r.LIVE_RECORD
    if fence is not None:
        condition = r.FENCED_CLAIM
        named.update(r.values(version=fence.claim_version))
        if fence.suspect_since is not None:
            condition += r.SAME_MARK
            named.update(r.values(suspect=fence.suspect_since))
    if not record.parked:
        return condition + r.NONE_PARKED
    named[":nparked"] = {"N": str(len(record.parked))}
    return condition + r.PARKED_AS_READ


def _plain_vanished_unmarked(record: Any, ending: Any, known: frozenset[str]) -> Any:
    if ending.end.outcome_unknown and not record.once:
        ending = replace(ending, end=replace(ending.end, outcome_unknown=False))
    return _LEASE_TERMS(record, ending, known)


VARIANTS: dict[str, tuple[str, list[Patch]]] = {
    # -- the breaks, as the code was before each fix -----------------------------------------------
    "b1_listing_order": (
        "break 1: external counts ordered by when they were saved, not by their listing",
        [(ExternalCount, "began", property(lambda self: self.count))],
    ),
    "b2_adopt_past_cap": (
        "break 2: an adoption past a full shard's cap with no freeze first",
        [(DynamoSlots, "adoption", past_the_cap)],
    ),
    "b3_start_after_block": (
        "break 3: a start mark and a block that ignore each other (a blocked claim starts anyway)",
        [(DynamoStore, "mark_starting", unfenced_mark), (DynamoStore, "block", unfenced_block)],
    ),
    "b4_vanished_kept": (
        "break 4: a holder on a deleted state machine kept for good",
        [(sluice.launch.reconcile, "_release_vanished", lambda *args, **kwargs: 0)],
    ),
    "b5_once_ttl": (
        "break 5: a run-once success put back under TTL by a release or a dead letter of its key",
        [
            (ReleasesTable, "_release_items", expiring_release),
            (DynamoStore, "record_invalid", expiring_invalid),
        ],
    ),
    "b6_forged_origin": (
        "break 6: any 1 to 128 characters taken as an origin id, and re-sent raw as a deduplication id",
        [
            (sluice.core.names, "ORIGIN_PATTERN", re.compile(r".{1,128}", re.DOTALL)),
            (sluice.features.attributes, "ORIGIN_PATTERN", re.compile(r".{1,128}", re.DOTALL)),
            (sluice.adapters.aws.sqs, "_dedup_stem", lambda message_id, limit=90: message_id[:limit]),
        ],
    ),
    "b7_ticket_digits": (
        "break 7: a key ticket read with str.isdigit (unicode digits pass)",
        [
            (sluice.features.keys, "parse_ticket", _isdigit_ticket),
            (sluice.core.records, "sent_at", lambda entry: int(entry.partition("@")[2]) / 1000),
            (RULES, TICKET_ATTRIBUTE, replace(RULES[TICKET_ATTRIBUTE], check=_isdigit_ticket)),
        ],
    ),
    "b8_awaits_depth": (
        "break 8: sluice-awaits parsed with no depth guard, and not checked at receipt",
        [
            (sluice.features.awaits, "parse_awaits", _unguarded_awaits),
            (RULES, AWAITS_ATTRIBUTE, replace(RULES[AWAITS_ATTRIBUTE], check=lambda raw: raw)),
        ],
    ),
    "b9_max_unbounded": (
        "break 9: a MAX above the ceiling read from the parameter and planned (no ceiling)",
        [(sluice.adapters.aws.ssm, "MAX_CEILING", 10**40)],
    ),
    "b10_enqueue_whole": (
        "break 10: sluice enqueue parses an array whole, and one unbuildable item fails the command",
        [(sluice.enqueue, "read_items", _read_items_whole)],
    ),
    "b11_semaphore_cold_start": (
        "break 11: a cold start that reads the semaphore, then writes its configured limit unfenced",
        [(Semaphores, "create", _read_then_write)],
    ),
    # -- held out until the actors and faults were frozen ------------------------------------------
    "renew_always": (
        "a resume that does not renew its claim (test_a_resume_that_does_not_renew_its_claim_is_caught)",
        [(DynamoStore, "renew", lambda self, **_: True)],
    ),
    "adopt_never": (
        "a redriven execution left out of the ledger (test_a_redriven_execution_left_out_of_the_ledger_is_caught)",
        [(DynamoStore, "adopt", lambda self, **_: False)],
    ),
    "one_stamp": (
        "limits ordered as one stamp (test_limits_ordered_as_one_stamp_are_caught)",
        [(LimitSource, "merged", lambda self, other: self)],
    ),
    "never_sweeps": (
        "a reconciliation that never sweeps the waiting room "
        "(test_a_reconciliation_that_never_sweeps_the_waiting_room_is_caught)",
        [(sluice.launch.reconcile, "sweep", lambda **_: 0)],
    ),
    # -- more of the project's broken variants -------------------------------------------------------
    "random_names": (
        "execution names drawn at random (test_random_execution_names_are_caught)",
        [
            (sluice.launch.per_message, "execution_name", _random_name),
            (sluice.launch.handover, "execution_name", _random_name),
        ],
    ),
    "start_without_asking": (
        "a resume that starts without asking Step Functions "
        "(test_a_resume_that_starts_without_asking_step_functions_is_caught)",
        [(sluice.launch.message_branches.MessageBranches, "_started_before", lambda self, name: None)],
    ),
    "ignores_redriven_mark": (
        "a resume that ignores the redriven mark (test_a_resume_that_ignores_the_redriven_mark_after_a_crash_is_caught)",
        [(sluice.launch.message_branches.MessageBranches, "_yield_to_redriven", lambda *args: False)],
    ),
    "one_redriven_mark": (
        "a key that keeps one redriven mark (test_a_key_that_keeps_one_redriven_mark_is_caught)",
        [(DynamoStore, "mark_redriven", one_redriven_mark)],
    ),
    "earlier_end_taken_as_new": (
        "an earlier end taken for a new one (test_an_earlier_end_taken_for_a_new_one_is_caught)",
        [
            (sluice.launch.message_branches.MessageBranches, "_still_runs", lifted_on_any_end),
            (
                sluice.launch.message_branches.MessageBranches,
                "_adopted_within_the_window",
                lambda self, record: False,
            ),
        ],
    ),
    "completion_asks_earlier_end": (
        "a completion that asks about an earlier end (test_a_completion_that_asks_about_an_earlier_end_is_caught)",
        [
            (
                sluice.launch.completion,
                "_not_its_earlier_end",
                lambda change, now, window, judge: lambda record: True,
            )
        ],
    ),
    "redrive_count_ignored": (
        "an adoption that ignores the reported redrive count "
        "(test_an_adoption_that_ignores_the_reported_redrive_count_is_caught)",
        [(ExecutionInfo, "not_redriven_since", lambda self, ended_at: False)],
    ),
    "vanished_as_unstarted": (
        "a resume that takes a vanished machine for never started "
        "(test_a_resume_that_takes_a_vanished_machine_for_never_started_is_caught)",
        [(sluice.adapters.aws.sfn.StepFunctionsExecutions, "vanished", lambda self, arn: False)],
    ),
    "drop_on_first_running": (
        "a duplicate dropped on its first RUNNING answer, which may be stale "
        "(test_a_duplicate_check_that_drops_on_its_first_running_answer_is_caught)",
        [(DynamoStore, "first_sighting", lambda self, **_: False)],
    ),
    "vanished_holder_runs": (
        "a holder whose state machine was deleted taken for a running one "
        "(test_a_duplicate_check_that_drops_behind_a_vanished_holder_is_caught)",
        [
            (DynamoStore, "first_sighting", lambda self, **_: False),
            (sluice.launch.message_branches.MessageBranches, "_vanished", lambda self, record: False),
        ],
    ),
    "behind_unsighted": (
        "a recheck that hands its group back unsighted "
        "(test_a_recheck_that_does_not_sight_its_group_behind_it_is_caught)",
        [
            (
                sluice.launch.message_branches.MessageBranches,
                "sight_behind",
                lambda self, message, behind: None,
            )
        ],
    ),
    "later_success_ignored": (
        "a redriven run's success after its release not recorded: its event releases nothing, so "
        "the key's succeeded_by and its effects are left out (the code before it was fixed)",
        [(sluice.launch.completion, "_later_success", lambda change, **kw: None)],
    ),
    "redriven_listing_skipped": (
        "reconciliation that never lists the redriven runs: a redriven run's success whose event "
        "was lost stays unwritten (the code before it was fixed)",
        [(sluice.launch.reconcile, "redriven_successes", lambda p: 0)],
    ),
    "plain_vanished_unmarked": (
        "a plain run released with an unknown outcome marks no once_unknown (the code before it was fixed)",
        [(sluice.adapters.dynamo.release, "_lease_terms", _plain_vanished_unmarked)],
    ),
    "vanished_name_reclaimed": (
        "a name released as vanished is claimed afresh by its own message back (the code before it was fixed)",
        [
            (
                sluice.adapters.dynamo.claims,
                "NOT_ENDED",
                "NOT #state IN (:ended_s, :ended_f, :ended_t, :ended_a)",
            )
        ],
    ),
    "missing_released_at_once": (
        "a run seen running that a stale answer reports missing is released as vanished (the code before it was fixed)",
        [(sluice.launch.reconcile, "HISTORY_KEPT_SECONDS", 0)],
    ),
    "redrive_named_by_the_copy": (
        "a redriven copy named by its DLQ message, not the message it came from (the code before it was fixed)",
        [(sluice.adapters.aws.sqs_dead_letters, "logical_id", lambda m: m.message_id)],
    ),
    "rate_over_refills": (
        "a rate's room counted over half its period: it refills twice as fast",
        [(sluice.features.rate_limits, "busiest", lambda w, period, now: _busiest(w, period // 2, now))],
    ),
    "rate_forgets_other_grants": (
        "a grant that keeps only its own entry: the window forgets another launcher's grants",
        [(sluice.features.rate_limits.RateBook, "granted", _granted_alone)],
    ),
    "rate_drop_forgotten": (
        "a window that may reach an entry a write dropped counted without it (the code before seed 1211301274's fix)",
        [(sluice.features.rate_limits.RateBook, "_reaches_dropped", lambda self, scope, rate, now_ms: False)],
    ),
    "rate_change_resets_window": (
        "a rate set at run time that empties its scope's window",
        [(sluice.features.rate_limits.RateBook, "with_override", _override_resetting)],
    ),
    "redrive_hidden_by_a_stale_describe": (
        "a run listed RUNNING long after its release not adopted on a stale DescribeExecution "
        "(the code before seed 818180473's fix)",
        [
            (
                sluice.launch.redriven,
                "ran_again",
                lambda p, info, record: (
                    Rerun.AGAIN
                    if not info.ended and not info.not_redriven_since(record.ended_at)
                    else Rerun.ENDED
                ),
            )
        ],
    ),
    "unsure_redrive_left_unmarked": (
        "a run listed RUNNING within the window of its end, which DescribeExecution says ended, "
        "left to the next pass with its key free (the code before the mark on a free key)",
        [(sluice.launch.redriven, "ran_again", _unsure_taken_for_ended)],
    ),
    "ambiguous_start_back_at_once": (
        "a message whose StartExecution may have landed given back to the queue at once (the code "
        "before seed 131310309's fix)",
        [(sluice.launch.admission, "away_after", lambda exc, settings: 0)],
    ),
    "key_waiter_takes_no_grant": (
        "a waiter woken from its key's line that starts on the room its wake read, without a grant",
        [(sluice.launch.per_message.MessageProtocol, "_one", _one_but_woken_take_no_grant)],
    ),
    "success_taken_for_an_earlier_end": (
        "a SUCCEEDED answer taken for an end from before a redrive, and a message behind such an end "
        "suppressed (the code before seed 111160034's fixes)",
        [
            (sluice.launch.message_branches, "earlier_end", _earlier_end_of_any_status),
            (sluice.launch.completion, "_not_its_earlier_end", _not_its_earlier_end_any_status),
            (
                sluice.launch.message_branches.MessageBranches,
                "_parks_behind",
                lambda self, info: self.ctx.settings.duplicate_policy.value == "defer",
            ),
        ],
    ),
    "redrive_date_ignored": (
        "an adopted run's redrive date not consulted: an end before it that Sluice never recorded, "
        "read stale, taken for the adopted run's end (the code before seed 1203230958's fix)",
        [
            (module, "before_its_redrive", lambda stop_date, record: False)
            for module in (sluice.launch.completion, sluice.launch.reconcile, sluice.launch.message_branches)
        ],
    ),
    "young_adoption_trusted": (
        "an end read within the window of an adoption taken for the adopted run's (the code before "
        "the fixes of tests/integration/test_redrive_date_attacks.py)",
        [
            *[
                (module, "young_adoption", lambda record, now, window, judge: False)
                for module in (completion, reconcile)
            ],
            (
                sluice.launch.message_branches.MessageBranches,
                "_adopted_within_the_window",
                lambda self, record: False,
            ),
        ],
    ),
    "young_adoption_one_window": (
        "an adoption judged young for one consistency window by any clock (the code before "
        "test_young_adoption_attacks.py's attack 3): a judge ahead of the adopter believes a stale end",
        [
            *[(module, "young_adoption", _young_for_one_window) for module in (completion, reconcile)],
            (
                sluice.launch.message_branches.MessageBranches,
                "_adopted_within_the_window",
                lambda self, record: (
                    record is not None
                    and record.adopted_at is not None
                    and not self._window_past(record.adopted_at)
                ),
            ),
        ],
    ),
    "adoption_judged_by_any_clock": (
        "an adoption judged two consistency windows old by any clock, not only by the one that "
        "stamped it (the code before seed 629934866's fix): a judge an hour ahead believes a stale end",
        [
            *[(module, "young_adoption", _young_by_any_clock) for module in (completion, reconcile)],
            (
                sluice.launch.message_branches.MessageBranches,
                "_adopted_within_the_window",
                lambda self, record: (
                    record is not None
                    and record.adopted_at is not None
                    and not self._window_past(record.adopted_at, windows=2)
                ),
            ),
        ],
    ),
    "mark_judged_by_any_clock": (
        "a key's redriven mark judged two consistency windows old from the record's updated_at by "
        "any clock, not only by the one that stamped it, and written only at its first sighting "
        "(the code before seed 247667414's fix)",
        [
            (
                sluice.launch.message_branches.MessageBranches,
                "_mark_old",
                lambda self, marked: self._window_past(marked.updated_at, windows=2),
            ),
            (
                sluice.core.model.PayloadRecord,
                "sighting_moves_nothing",
                lambda self, name: self.redriven == name or name in self.redriven_more,
            ),
        ],
    ),
    "mark_stamp_kept": (
        "a key's mark stamped at its first sighting only: a reconciliation that sees the marked run "
        "again writes nothing, so the stamping clock judges the mark old seconds after a later redrive "
        "(the code at 9f944cc; tests/integration/test_mark_stamp_attacks.py)",
        [
            (
                sluice.core.model.PayloadRecord,
                "sighting_moves_nothing",
                lambda self, name: self.redriven == name or name in self.redriven_more,
            )
        ],
    ),
    "mark_lift_unconditioned": (
        "a mark lifted on the age of a stamp whatever was written since: a sighting between the "
        "claim's fresh answer and its lift is lost (test_claim_clears_a_mark_a_reconciler_just_saw_running)",
        [
            (
                DynamoStore,
                "clear_redriven",
                lambda self, *, key, name, as_read=None: self.marks.clear_redriven(key=key, name=name),
            )
        ],
    ),
    "adoption_sightings_untagged": (
        "a clock's sighting of an adoption counted for any adoption of the run, also a later one an "
        "older version wrote over the map (test_adoption_clock_review.py's first break)",
        [(sluice.core.model.ExecutionRecord, "seen_by", _seen_by_untagged)],
    ),
    "retried_start_taken_for_a_refusal": (
        "a StartExecution refused after the SDK retried it taken as refused for certain, its fresh "
        "claim given back (test_a_retried_start_taken_for_a_refusal_is_caught)",
        [(sluice.adapters.aws.sfn, "_retried", lambda exc: False)],
    ),
    "described_missing_taken_as_ended": (
        "a run its record says ended, listed RUNNING and described as missing (a stale view) taken "
        "for ended, neither adopted nor counted against MAX (the code before seed 1204130804's fix)",
        [
            (
                sluice.launch.redriven,
                "listed_again",
                lambda p, info, record: (
                    sluice.launch.redriven.Rerun.ENDED
                    if info is None
                    else sluice.launch.redriven.ran_again(p, info, record)
                ),
            )
        ],
    ),
    "dropped_claim_hides_a_success": (
        "a claim dropped unstarted leaves its key RELEASED over a success recorded while it held, "
        "and an already-done run-once message leaves it so (the code before seed 1204141390's fix)",
        [
            (sluice.adapters.dynamo.release._Release, "drops_once_claim", lambda self, record: False),
            (
                DynamoStore,
                "record_already_done",
                lambda self, *, key, message_id, now, seen=None: self.records.record_already_done(
                    key=key, message_id=message_id, now=now
                ),
            ),
        ],
    ),
    "overtaken_count_dropped": (
        "a reconciliation whose count was numbered below the one saved writes nothing, even where "
        "the two listings overlap and its count is the larger (the merge's larger count lost)",
        [(sluice.adapters.dynamo.records, "adds_nothing", lambda merged, saved, latest: not latest)],
    ),
    "woken_copy_unlanded": (
        "a woken waiter that parks again or gives its slot back before its wake noted its entry "
        "leaves the entry keeping a slot for nobody (the code before it was fixed)",
        [(KeysTable, "_line_item", _line_item_unlanded), (KeysTable, "drop_inflight", _drop_unlanded)],
    ),
    "landed_dropped_by_clock": (
        "a landed note judged by the reader's clock: one an hour behind its waker drops a fresh "
        "note as dated ahead before the wake notes its entry (the code before seed 1206004492's fix)",
        [(sluice.core.records.KeyState, "stale", _stale_by_clock)],
    ),
    "landed_dropped_at_once": (
        "every landed note dropped at the next wake, before the wake that sent its copy noted it",
        [(sluice.core.records.KeyState, "stale", _stale_landed_at_once)],
    ),
    "landed_kept_unbounded": (
        "every landed note in the line kept, however many: forged tickets forgone in a paused key's "
        "line pile up in its item (the code between seed 1206004492's fix and its bound)",
        [(sluice.core.records.KeyState, "stale", _stale_landed_unbounded)],
    ),
    "park_checked_by_the_payloads_index": (
        "a park whose answer was lost judged by the payload's index, which another message of the "
        "payload parked since rewrote: the parked message handed back (the code before seed 1206101088's fix)",
        [(sluice.features.keys, "_park", _park_checked_by_the_payloads_index)],
    ),
    "park_checked_by_message_id_alone": (
        "a park whose answer was lost judged by the message id in the line's item alone: another "
        "payload's message of the same origin took the ticket, and the refused one is deleted",
        [(sluice.features.keys, "_park", _park_checked_by_message_id_alone)],
    ),
    "settle_unconfirmed": (
        "a duplicate check's settle of a holder it read as ended releases it though it was redriven "
        "and adopted since the answer (the code before seed 1206301599's fix)",
        [(sluice.launch.message_branches.MessageBranches, "_settle_ended", _settle_ended_unconfirmed)],
    ),
    "release_ignores_adoption": (
        "a release whose record condition does not hold the adoption as read: one adopted between "
        "its read and its write is released (a helper's attack on seed 1206301599's fix)",
        [(sluice.adapters.dynamo.release, "_record_condition", _record_condition_without_adoption)],
    ),
    "lane_claim_without_slot": (
        "a claim whose transaction leaves out its lane's slot (test_a_claim_without_its_lane_slot_is_caught)",
        [(LaneSlots, "claim_item", without_the_lane_slot)],
    ),
    "lane_release_keeps_slot": (
        "a release whose transaction leaves its lane's slot held (test_a_release_that_keeps_the_lane_slot_is_caught)",
        [(LaneSlots, "release_item", keeping_the_lane_slot)],
    ),
    "lane_limit_never_synced": (
        "a tick that writes each lane's pool once and never moves its MAX "
        "(test_a_tick_that_never_moves_a_lanes_limit_is_caught)",
        [(LaneAdmission, "sync_lanes", creating_the_lanes_pools_only)],
    ),
    "lane_requeue_home": (
        "a waiter sent back to the payload queue whatever its lane "
        "(test_a_requeue_that_ignores_the_messages_lane_is_caught)",
        [(sluice.adapters.aws.sqs.SqsQueue, "url_for", lambda self, attributes: self.home_url)],
    ),
    "lane_never_thawed": (
        "a lane lowered below its runs never thawed (test_a_lane_never_thawed_after_a_lowered_max_is_caught)",
        [(DynamoStore, "thaw_lane", lambda self, lane: None)],
    ),
    "hand_over_unchecked": (
        "a hand-over that skips the receipt check (test_a_hand_over_that_skips_the_receipt_check_is_caught)",
        [(sluice.launch.handover, "check_attributes", lambda message: None)],
    ),
}


def _create_without_merge(*args: Any, only_new: bool = False, **kwargs: Any) -> Any:
    """The launcher pool's ``Capacity`` as before explorer seed 1857508604's fix: a create that
    lost to another writer's overwrote that writer's count when its own number was higher."""
    return Capacity(*args, **kwargs)


VARIANTS["pool_create_unmerged"] = (
    "a first reconciliation's create of the launcher's pool, lost to another's, replaces that one's "
    "count instead of merging with it (the code before explorer seed 1857508604's fix)",
    [(sluice.adapters.dynamo.launch_slots, "Capacity", _create_without_merge)],
)


def _adoption_create_overwrites(self: Any, name: str, now: float) -> Any:
    """``LaunchSlots.adopt_items`` as before its fix: with no pool as read, it wrote one at limit 0
    whatever another writer had made meanwhile, dropping that pool's count."""
    self.ledger()
    if self.view is not None and self.view.version == 0:
        self.set_limit(LimitSource(0, None))
    return self.slots.adoption(sluice.adapters.dynamo.launch_slots.POOL, name, now, self.view)


VARIANTS["adoption_create_overwrites"] = (
    "an adoption that finds no pool writes one at limit 0 over a pool made meanwhile "
    "(tests/contract/test_pool_create_attacks.py, test_adoption_create_raced_by_reconciliation)",
    [(sluice.adapters.dynamo.launch_slots.LaunchSlots, "adopt_items", _adoption_create_overwrites)],
)

# Both guards of an adopted run's end off at once: each alone holds seed 1203230958 (the redrive
# date rules the unrecorded end out; the young adoption trusts no end in the window).
VARIANTS["adoption_unguarded"] = (
    "an adopted run's end judged as before either guard: its redrive date not consulted, and an end "
    "read within the window of its adoption believed (the code before seed 1203230958's fix)",
    VARIANTS["redrive_date_ignored"][1] + VARIANTS["young_adoption_trusted"][1],
)
# Since a key's mark moves at every sighting of its run, that guards seed 769800361 too.
VARIANTS["adoption_and_marks_unguarded"] = (
    "``adoption_unguarded`` with the marks as they were before: stamped at their first sighting only",
    VARIANTS["adoption_unguarded"][1] + VARIANTS["mark_stamp_kept"][1],
)


def _take_unversioned(self: Any, pool: str, version: int) -> Any:
    """``DynamoSlots._frozen_take`` before seed 997296974's fix: a check of the frozen pool that
    leaves its version as it was, so a thaw that read the pool before the take still lands."""
    check = {
        "TableName": self.table,
        "Key": {"pk": {"S": f"SLOTS#{pool}"}},
        "ConditionExpression": "version = :version AND frozen = :frozen",
        "ExpressionAttributeValues": {":version": {"N": str(version)}, ":frozen": {"BOOL": True}},
    }
    return {"ConditionCheck": check}


VARIANTS["take_unversioned"] = (
    "an adoption's take past a cap that checks the frozen pool without moving its version: a thaw "
    "that read the pool before it lands beside it (the code before seed 997296974's fix)",
    [(DynamoSlots, "_frozen_take", _take_unversioned)],
)


def _plan_with_the_pool_item_first(self: Any, pool: str, target: Any, *, freeze: bool = False) -> Any:
    """``DynamoSlots._plan`` before the fix of the multi-step plan: the pool item (the new limit)
    first, then the shards in transactions that only check the version it took; and once it has
    taken the version, a planner goes on whatever stamp came since."""
    m = sluice.adapters.dynamo.slots
    took_version = False
    for _ in range(m.PLAN_ROUNDS):
        current = self.occupancy(pool)
        if current.version == 0 and target is None:
            return None
        if took_version and (target is None or current.limit != target.limit):
            return None
        if target is not None and not took_version and target.refused_by(current):
            return None
        limit = current.limit if target is None else target.limit
        stamp = current.stamp if target is None else target.stamp
        per_shard = current.per_shard if current.version else self.per_shard
        plan = (m.plan_freeze if freeze else m.plan_caps)(limit, per_shard, current.loads())
        if current.version and not plan.moves and m._same(current, plan) and stamp == current.stamp:
            return plan
        existing = {s.index for s in current.shards}
        updates = [self._cap_item(pool, mv, mv.shard in existing, plan.frozen) for mv in plan.moves]
        meta = self._pool_item(pool, current.version, plan, per_shard, stamp)
        if len(updates) <= m.SHARDS_PER_TRANSACTION:
            if self._transact([meta, *updates]) is None:
                return self._done(pool, plan)
            continue
        if self._update(meta["Update"]) is not None:
            continue
        took_version = True
        check = {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": {"pk": {"S": m.pool_pk(pool)}},
                "ConditionExpression": "version = :version",
                "ExpressionAttributeValues": {":version": {"N": str(current.version + 1)}},
            }
        }
        step = m.SHARDS_PER_TRANSACTION
        chunks = [updates[i : i + step] for i in range(0, len(updates), step)]
        if all(self._transact([check, *chunk]) is None for chunk in chunks):
            return self._done(pool, plan)
    raise sluice.core.errors.TransientError("the shards kept changing", operation="TransactWriteItems")


VARIANTS["plan_steps_unversioned"] = (
    "a plan of several transactions that writes the new limit first and only checks the version "
    "after it: a planner that read between two of them lands its own plan over caps it never saw "
    "(the code before the fix of the multi-step plan)",
    [(DynamoSlots, "_plan", _plan_with_the_pool_item_first)],
)


def _complete_unconfirmed(**kwargs: Any) -> Any:
    """Reconciliation's release as before seed 1503073754's fix: no ``confirm``, so an adoption
    that lands between its read and its write is released on the end read before the redrive."""
    kwargs.pop("confirm", None)
    return sluice.launch.completion.complete(**kwargs)


VARIANTS["reconcile_release_unconfirmed"] = (
    "a reconciliation that releases an ended holder without judging the end again against the record "
    "its release reads: a run redriven and adopted meanwhile is released on its earlier end "
    "(the code before seed 1503073754's fix)",
    [(sluice.launch.reconcile, "complete", _complete_unconfirmed)],
)


def _record_condition_by_time_alone(record: Any, fence: Any, named: dict[str, Any]) -> str:
    """``release._record_condition`` holding the adoption it read by ``adopted_at`` alone."""
    r = sluice.adapters.dynamo.release
    uncounted = replace(record, adoptions=0)
    condition = _REAL_RECORD_CONDITION(uncounted, fence, named)
    return condition.replace(" AND " + r.adoptions_are(0), "")


VARIANTS["release_adoption_uncounted"] = (
    "a release that holds the adoption it read by its adoption time alone: a run released, redriven "
    "and adopted again by a clock reading the same instant is released on the end read before "
    "(tests/integration/test_stale_release_attacks.py)",
    [(sluice.adapters.dynamo.release, "_record_condition", _record_condition_by_time_alone)],
)


def _unpark_mark_then_remove(
    self: Any, holder: str, message_id: str, copy_id: str, remove: Any, now: float, expires: int
) -> bool:
    """``ParkingTable.unpark`` before seed 227091189's fix: the woken mark and the id's removal from
    ``parked`` in two writes, so a park of the same id behind the holder between them is taken out
    unwoken, and the index drops the holder."""
    self.db.update_if(
        park_pk(message_id),
        "SET woken_at = :now, expires_at = :expires",
        "holder = :holder AND attribute_not_exists(woken_at)",
        values(now=now, expires=expires, holder=holder),
        names={},
    )
    self.db.update_if(
        execution_pk(holder),
        "DELETE parked :ids",
        "attribute_exists(pk)",
        {":ids": {"SS": [message_id]}},
        names={},
    )
    return True


VARIANTS["unpark_mark_apart"] = (
    "a wake-up that marks a parked message woken and takes it off its holder's parked set in two "
    "writes: a copy parked behind the holder between them waits on no index (the code before seed "
    "227091189's fix)",
    [(ParkingTable, "_mark_woken", _unpark_mark_then_remove)],
)


_PARK = ParkingTable.park


VARIANTS["copies_by_origin"] = (
    "a deferred duplicate's copies told apart by their origin id alone: a copy a wake-up re-sent and "
    "parked again behind its holder's name claimed again is taken for the copy being woken, and its "
    "second wake-up reuses the first one's deduplication id (tests/integration/test_repark_copies_moto.py)",
    [(ParkingTable, "park", lambda self, parked: _PARK(self, replace(parked, copy_id=parked.message_id)))],
)


VARIANTS["parked_by_origin"] = (
    "a deferred duplicate parked under its origin id alone (the layout before the entry): a producer's "
    "message of another key carrying that id parks over the one waiting, which is never woken "
    "(tests/integration/test_repark_copies_moto.py)",
    [(ParkedMessage, "entry", property(lambda self: self.message_id))],
)


VARIANTS["waiters_by_origin"] = (
    "an awaits waiter always parked under its origin id: a producer's message of another key "
    "carrying that id is taken for the waiter's redelivery and deleted "
    "(tests/integration/test_awaits_moto.py)",
    [(Waiter, "entry", property(lambda self: self.message_id))],
)


_RECORD_ITEM = sluice.adapters.dynamo.claims.ClaimsTable._record_item


def _unmarked_record(self: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    put = _RECORD_ITEM(self, *args, **kwargs)
    put["Put"]["Item"].pop("starting_at", None)
    return put


VARIANTS["claim_unmarked"] = (
    "a fresh claim written without its start mark, and no mark written before its start: a "
    "reconciliation's block between the claim and the start lands, and the start goes ahead "
    "(tests/reliability/test_key_variants.py)",
    [(sluice.adapters.dynamo.claims.ClaimsTable, "_record_item", _unmarked_record)],
)


_RENEW = DynamoStore.renew


VARIANTS["copies_lift_marks"] = (
    "a resume's renewal that lifts the start mark whichever copy of the message wrote it: a copy in "
    "another group yields the claim to a redriven run while the launcher that marked it starts it "
    "(tests/integration/test_key_breaks_moto.py)",
    [(DynamoStore, "renew", lambda self, *, copy_id=None, **kwargs: _RENEW(self, **kwargs))],
)


_EXECUTION = DynamoStore.execution


VARIANTS["copies_unread"] = (
    "a record read without the copy that claimed or renewed it last: a resume yields a claim another "
    "copy renewed, marked and started since, and a copy finding another's mark looks again at once "
    "(tests/integration/test_key_breaks_moto.py)",
    [
        (
            DynamoStore,
            "execution",
            lambda self, name: None if (r := _EXECUTION(self, name)) is None else replace(r, copy_id=None),
        )
    ],
)


_CAPS_FOR = sluice.launch.reconcile._caps_for


def _caps_saved_anyway(store: Any, max_source: Any, counted: ExternalCount, logger: Any) -> bool:
    """``reconcile._caps_for`` before seed 1398629532's fix: a caps write that lost every round to
    other writers was taken as done, and the count saved."""
    try:
        return _CAPS_FOR(store, max_source, counted, logger)
    except sluice.core.errors.Contended:
        return True


VARIANTS["uncarried_count_saved"] = (
    "reconciliation saves an external count whose caps write lost every round to other writers: a "
    "later reconciliation whose older listing overlaps merges with the pool alone and writes MAX less "
    "fewer runs than the newest listing showed (tests/integration/test_contended_caps_moto.py)",
    [(sluice.launch.reconcile, "_caps_for", _caps_saved_anyway)],
)


def _caps_not_saved_tick_goes_on(store: Any, max_source: Any, counted: ExternalCount, logger: Any) -> bool:
    """``reconcile._caps_for`` at ced6958: a contended caps write saves nothing, and its tick admits."""
    try:
        return _CAPS_FOR(store, max_source, counted, logger)
    except sluice.core.errors.Contended:
        return False


VARIANTS["contended_tick_fills"] = (
    "a tick whose reconciliation could not bring its count to the caps goes on and fills them, beside "
    "the runs started by hand it listed (tests/integration/test_contended_caps_attacks.py)",
    [(sluice.launch.reconcile, "_caps_for", _caps_not_saved_tick_goes_on)],
)


VARIANTS["contention_unseen"] = (
    "a caps write that lost every round is taken as carried (the code before Contended): the tick "
    "admits under caps others left, past the MAX it read (tests/integration/test_contended_caps_attacks.py)",
    [(sluice.adapters.dynamo.launch_slots.LaunchSlots, "_carries", lambda self, source: True)],
)


def _hand_back_deleted(one: Any, messages: list[Any]) -> None:
    if messages:
        one.ctx.queue.delete(messages)


VARIANTS["in_hand_ticket_parsed"] = (
    "a fair lane's pass tells its newcomers in hand by parsing their ticket, so a forged "
    "``sluice-key-ticket`` raises there, before any message is processed: every tick fails on it",
    [(sluice.launch.lane_admission, "newcomer", lambda m: sluice.features.keys.ticket_of(m) is None)],
)

VARIANTS["in_hand_deleted"] = (
    "a fair lane's pass deletes the messages it kept in hand and did not begin (a full lane, AWS "
    "throttling, its time up) instead of handing them back: they are lost",
    [(LaneAdmission, "_hand_back", staticmethod(_hand_back_deleted))],
)


def patch(patches: list[Patch]) -> list[Patch]:
    """Apply ``patches``; the saved values, to ``patch`` back."""
    saved: list[Patch] = []
    for owner, attr, value in patches:
        if isinstance(owner, dict):
            saved.append((owner, attr, owner[attr]))
            owner[attr] = value
        else:
            saved.append((owner, attr, inspect.getattr_static(owner, attr)))
            setattr(owner, attr, value)
    return saved
