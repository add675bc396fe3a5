"""The explorer: Sluice's real code on in-process moto, every AWS call a switch point.

A run builds a small world (tests/reliability/world.py: the stack, launcher containers with their
own Runtime and caches, the Model observing every call) and then takes ``steps`` steps. At each step
the seeded scheduler (``Choices``) picks one thing to happen: an invocation waiting at a switch point
proceeds to its next AWS call, a new invocation starts (a scheduled tick in an idle launcher
container; a completion for a status event, in one of several completion containers), or an actor
of the world acts at once (a producer sends, an execution ends, EventBridge loses or repeats an
event, the operator changes a limit or redrives, someone starts an execution by hand, time passes,
DynamoDB's TTL sweeps). Invocations are greenlets: a botocore hook on every container client
(``Switch``) hands control back to the scheduler before each call, and, when the scheduler resumes
it, may crash the container before the call or after it took effect, throttle it, or lose its
response after it took effect. Step Functions' reads answer from a view up to a minute old
(tests/explorer/view.py). After every step the world's promises are checked (the Model's record,
the ledger against the leases, the keys' caps); at the end every invocation runs to its end with no
fault, and the world settles and checks what holds at rest.

Everything is deterministic given the list of draws, so a failure replays from it (``replay``).
"""

from __future__ import annotations

import random
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from botocore import xform_name
from botocore.exceptions import ClientError, ReadTimeoutError
from greenlet import greenlet
from moto.moto_api._internal import mock_random

import sluice.adapters.dynamo.slots as slots_adapter
from sluice.core.errors import TransientError
from sluice.features import rate_limits
from sluice.features.rate_limits import STACK, Rate, RateDefaults, lane_scope
from tests.explorer.actors import LANE, PAYLOADS, Actors
from tests.explorer.choices import Choices
from tests.explorer.fast_moto import faster_moto, lighter
from tests.explorer.switch import MachineSwitch
from tests.explorer.view import History, StaleView
from tests.explorer.world import ExplorerWorld
from tests.reliability.actors import pool
from tests.reliability.world import Container, Event
from tests.support.faults import Call, Crash, Fault, Injector, count, throttled
from tests.support.moto_patches import dead_letter_source, redrive_filter

RATES = (None, None, None, Rate(1, 60), Rate(2, 60), Rate(3, 3600), Rate(2, 1))  # the stack's, in swarm runs
KEY_RATES = (None, None, Rate(1, 60), Rate(2, 1), Rate(1, 3600))  # every concurrency key's, in swarm runs
SKEWS = (0.0, 30.0, -30.0, 3600.0, -3600.0)  # launcher B's clock; docs/protocol.md, "Clocks": any skew
# What may happen at a switch point once the invocation is resumed (weights of a fresh draw).
NOTHING, CRASH_BEFORE, THROTTLE, CRASH_AFTER, LOST = range(5)
# A lost answer of one of these, in a run with ``retried_writes``, is retried as Sluice's SDK does.
CONDITIONAL_WRITES = ("UpdateItem", "PutItem", "DeleteItem")
AT_CALL = (60, 1, 1, 1, 1)
FAULT_NAMES = ("", "crash before", "throttle", "crash after", "lost response")
# Swarm testing (Groce et al., "Swarm Testing", ISSTA 2012): a run may draw a profile that leaves
# some actors and faults out and makes others four to eight times as frequent, so that rare
# situations (two reconciliations in a row, a redrive right after a release) arise in some runs.
# Draw 0 of each is the plain weight, so a shrunk schedule falls back to the plain profile.
SWARM_ACTORS = (
    "tick",
    "deliver",
    "end",
    "send",
    "advance",
    "lose",
    "redeliver",
    "running_event",
    "operator",
    "redrive",
    "by_hand",
    "ttl",
    "dlq_redrive",
    "switch_machine",
    "console",
    "quiet_month",
    "enqueue",
    "semaphore_cold_start",
    "semaphore_set",
)
SWARM_SCALES = (1.0, 0.0, 4.0)
# At Lambda's pace, the chance that the scheduled tick fires right after an execution ends, while
# its status event is on the way: EventBridge delivers within about a second and the tick fires
# every minute, so on a busy stack a tick meets an end whose event is not yet delivered many times
# a day (at a slower pace the tick would not reach its admission before the event anyway).
LAMBDA_PACE, TICK_ON_END = 10.0, 0.5
# How fast invocations move against the world: slower widens every race window (more happens
# between one call of an invocation and its next); ten times faster is Lambda's own pace, an
# invocation's calls milliseconds apart against the seconds between the world's moves, so that a
# tick reaches its admission before the world has moved on (an end's status event still on the way).
RESUME_SCALES = (1.0, 0.1, 0.3, LAMBDA_PACE)
FAULT_SCALES = (1.0, 0.0, 8.0)
# All faults at once: at the plain density about one call in sixteen faults, and an invocation of
# twenty calls rarely gets through its admission; a calm run lets the protocol's own races play out.
FAULT_DENSITIES = (1.0, 0.1)
# A swarm run may count only the actors' actions as its steps, not the invocations' calls: at 120
# steps a plain run makes about 2 claims before it winds down (measured over 20 runs: 35 claims
# against 221 in the wind-down, where no fault fires), so races among claims rarely meet a fault.
RESUMES_PER_ACTION = 10  # the bound on all steps, as a multiple of the run's steps
# The weight of a producer re-submitting the payload whose run ended last (a retry of a run that
# just failed, the next day's job of the same id), its status event maybe still on the way.
RESUBMIT_CHANCES = (0.0, 1.0, 4.0)
# How often a read of Step Functions answers from an older view (weights of view.LAGS: fresh, 1 s,
# 15 s, 45 s, 60 s old): the plain weights, or mostly stale.
LAG_WEIGHTS = ((6, 1, 1, 1, 1), (1, 1, 1, 1, 4))
# How many payload ids a swarm run's producers draw from: fewer ids, more invocations on one key at
# once (a redrive beside a new message of its key, two reconciliations over one holder). Drawn from
# the seed, not the schedule, so schedules printed before it replay draw for draw.
SWARM_PAYLOADS = (6, 2, 3)
# A swarm run may have one slow container (a Lambda container starved of CPU at its memory size, a
# long garbage collection, a slow network path): while its invocation waits at a switch point
# beside others, it proceeds SLOW_PACE times as often as they do, so that another invocation runs a
# whole pass (a reconciliation, a claim and its start) inside one of its windows; waiting alone, it
# proceeds SLOW_PACE times as often as it would, so the world moves meanwhile (a start by hand, an
# end, a redrive). Drawn from the seed, not the schedule (None in half the runs), as rates are.
SLOW_CONTAINERS = (None, None, None, "A", "B", "completion")
SLOW_PACE = 0.05
# A swarm run's operator may redrive the failure Sluice handled last (a retry automation on the
# failure's event, or the console's Redrive once the cause is fixed), with weight 1 or 4 beside the
# plain redrive of any run ended in the last 14 days, whose pick among many rarely meets the key's
# next message or a full pool. Drawn from the seed, not the schedule.
REDRIVE_LAST = (0.0, 0.0, 1.0, 4.0)
REDRIVE_LAST_SALT = 36  # as SLOW_SALT
SLOW_SALT = 27  # the pinned swarm seeds (tests/explorer/test_explore.py) draw none: their runs unchanged
# A swarm run may give each execution a least life: virtual seconds from its start (or redrive)
# before it may end. With one flat weight, a run ends a few steps after it starts, before a
# reconciliation lists it beside a claim of its key or a full pool. Drawn from the seed, not the
# schedule (none in half the runs).
RUN_LIFE = (0.0, 0.0, 61.0, 300.0)
RUN_LIFE_SALT = 70  # as SLOW_SALT
# A swarm run may race on one key: the ingredients above drawn together rather than apart (each
# alone comes in one run in two or three, all of them in about one in eighteen). Two payload ids, a
# slow container, the operator's redrive of the last failure, a least life, re-submissions, and
# nothing that hands keys or ends runs left out, so that a redrive, a run started by hand or a
# re-submission of one key meets a claim, a reconciliation and a full pool of that key while one of
# them waits inside a window. Not written for any one break: every promise is checked as ever.
FOCUS = (None, None, "one key")
FOCUS_SALT = 5  # as SLOW_SALT
# A swarm run that does not race on one key may race on a busy one: the same ingredients, with two
# or three payload ids (three: two keys fill a pool of two while the third's run is redriven), the
# slow switch point after each decision (AFTER_DECISION), the redrive beside the completion
# (RETRY_ON_EVENT) and a drained backlog (DRAINS). Drawn from the seed, in half those runs.
BUSY = (None, "busy key")
BUSY_PAYLOADS = (2, 3)
BUSY_SALT = 263122  # as SLOW_SALT: no pinned swarm seed, nor 1, 2, 3 or 13, draws it
# A busy run may fill its pool: MAX + 1 payload ids (every slot taken by a key of its own, one key
# left waiting: a full pool with a backlog behind it, where an adoption, a hand-over and a block
# meet) on shards of one holder each (a large MAX's sharded pool, at the world's size). Drawn from
# the seed, in half the busy runs...
FILL = (False, True)
# ... and leaves the settings alone, as a stack at work does: no MAX or cap changed, no start by hand
# (each moves the caps, which re-plans the pool), no machine switch; redrives and ends go on, and
# Step Functions answers mostly from fresh views (LAG_WEIGHTS[0]: a stale listing moves the count).
FILL_QUIET = ("operator", "console", "by_hand", "switch_machine", "semaphore_set", "quiet_month")
FILL_SALT = 36402  # as SLOW_SALT: no pinned swarm seed, nor 1, 2, 3, 13, 50, 60, 100 to 115, 182, 302 or 303, draws it
FOCUS_KEPT = ("tick", "deliver", "end", "redrive", "by_hand", "advance")  # weight at least plain
# A swarm run may weight the switch point right after a decision: the call that follows a conditional
# write or a transaction that took effect (a claim, an adoption, a block, a caps write) is where a
# protocol's two steps come apart (an adoption before its re-plan, a claim before its start, a
# listing's count before its save). There the invocation proceeds DECISION_PACE times as often as
# the others, so that another invocation or the world acts inside the window, and crashes
# DECISION_CRASH times as often. Drawn from the seed (in a third of the swarm runs), as slow containers.
AFTER_DECISION = (False, False, True)
DECISION_SALT = 8  # as SLOW_SALT
DECISION_PACE = 0.05
DECISION_CRASH = 8.0
# A swarm run may crash rare decisions more: the call right after a decision of a kind (its protocol
# step: a claim, a hand-over, an adoption, a block, a caps write) the run has made n times before
# crashes with chance 1 / (n + 2). A step that comes once a run (an adoption, a block) dies right
# after one time in two, where a uniform chance spends its crashes on the steps every invocation
# makes (BUGGIFY's rare paths, by count). Drawn from the seed, in an eighth of the swarm runs and in
# every run that fills its pool (FILL).
RARE_CRASH = (True, False, False, False, False, False, False, False)
RARE_SALT = (
    14327  # as SLOW_SALT: no pinned swarm seed, nor 1 to 13, 50, 60, 100 to 115, 182, 302 or 303, draws it
)
# A swarm run's producer may wake the launcher (``sluice enqueue``): a launcher container runs a tick
# that neither reconciles nor lingers, beside the scheduled ones and the completions. Drawn from the
# seed (in a third of the swarm runs), its option last, so that a run without it draws as before.
WAKES = (0.0, 0.0, 2.0)
WAKE_SALT = 16  # as SLOW_SALT; seed 60 (the widenings' loop) draws none either
# A swarm run may plan its pools one cap move to a transaction (``SHARDS_PER_TRANSACTION`` 1): a plan
# of n moves then takes n transactions, as a plan of more than 99 moves does on a large pool (MAX
# above about 800 at 8 holders a shard), so that planners, claims and adoptions act between a plan's
# transactions at the world's size. Drawn from the seed (in a quarter of the swarm runs).
SMALL_PLANS = (False, False, False, True)
SMALL_PLANS_SALT = 1007552  # as SLOW_SALT: no pinned swarm seed, nor the small seeds, draws it
# A swarm run may keep its rate books short (``KEPT_PAST`` 2): entries past their period are dropped
# after two, not 32, so that a write drops what another clock's window still holds within a run's
# few dozen grants, as a long busy run does with 32. Drawn from the seed, in a quarter of the swarm
# runs with a rate of 1 second.
SHORT_BOOKS = (True, False, False, False)
SHORT_BOOKS_SALT = 29669  # as SLOW_SALT: no pinned swarm seed, nor the small seeds, draws it
# A swarm run may deploy lanes (none four times in seven; drawn from the seed): a lane ``gpu`` with a
# MAX of 1 beside the implied default, the same with the default lane's MAX set too, or a fair lane of
# 2; and under those, in half the runs, a rate on ``gpu``. The producers then send to a lane (a draw
# only those runs make), and the operator sets a lane's MAX at run time (0 pauses) and its rate.
LANES = ("", "", "", "", "gpu:1:1", "gpu:1:1,default:2", "gpu:2:1:1:fair")
LANE_RATES = (None, None, Rate(1, 60), Rate(2, 1))
LANES_SALT = 419  # as SLOW_SALT: no pinned swarm seed, nor 1, 3, 60, 302 or 303, draws lanes
# A swarm run may keep its faults to some invocations: each invocation is drawn faulty (1 in
# FAULTY_ONE_IN) when it begins, and only a faulty one meets a fault; the others run clean. With
# every call as likely to fault (one in sixteen, up to one in three), a tick's twenty calls of
# reconciliation before its first receive rarely got through: over 30 swarm runs, 235 ticks died
# or were refused before receiving and 44 received, so the claims (12, against 431 in the fault-free
# wind-down) and the runs Sluice started, ended and saw redriven came almost only where nothing
# faults. Failures come to some invocations, not to every call alike. Drawn from the seed (in half
# the swarm runs), as slow containers; the draw at each invocation's start is made only then.
FAULTY_ONE_IN = (0, 0, 3, 5)
FAULTY_SALT = 125571  # as SLOW_SALT: no pinned swarm seed, nor 1 to 12, 60, 302 or 303, draws it
# A swarm run may go on once its steps are taken: the producers stop, the operator leaves the
# settings alone, and the stack works its backlog off (actors.DRAIN_ACTORS: ticks, completions,
# ends, lost and repeated events, runs redriven and started by hand; faults kept to some
# invocations, none carried past its Lambda timeout by the clock) until the backlog is drained, for
# at most DRAINS times the run's steps. A stack spends its days draining a backlog; a run that stops
# at its steps leaves that to the fault-free, one-tick-at-a-time settling (over 30 swarm runs: 431
# claims there, 12 while faults fired), where no claim, end or redrive meets another invocation.
# Drawn from the seed (in half the swarm runs), as slow containers.
DRAINS = (0.0, 0.0, 2.0, 5.0)
DRAIN_FAULTY_ONE_IN = 3  # while draining, faults come to some invocations (FAULTY_ONE_IN) at least
DRAIN_SALT = 97485  # as SLOW_SALT: no pinned swarm seed, nor 1, 2, 3 or 13, draws it
# A swarm run may redrive a failure while Sluice's completion handles its event (a retry automation
# is another target of the rule that delivers the event: both run at once), not only once the
# completion has returned. Drawn from the seed (in half the swarm runs), as slow containers.
RETRY_ON_EVENT = (False, False, True, True)
RETRY_SALT = 55188  # as SLOW_SALT: no pinned swarm seed, nor 1, 2, 3 or 13, draws it

# A swarm run may upgrade its workflow (docs/operations.md, replacing the workflow): the operator
# switches the state machine UPGRADE_PACE times as often, and deletes the old one as soon as the
# procedure allows (none of its runs left) as often again, while the backlog drains too. At the
# plain weights 17 of 40 swarm runs switched, 6 deleted the old machine and none described a holder
# of it once deleted (seeds 9100 to 9139): an end on the old machine whose status event is lost or
# late rarely met the deletion. Drawn from the seed (in a quarter of the swarm runs; not in a full
# pool's, which leaves the settings alone).
UPGRADES = (False, False, False, True)
UPGRADE_PACE = 8.0
UPGRADE_SALT = 125550  # as SLOW_SALT: no pinned swarm seed, nor the small seeds, draws it

# A swarm run may defer duplicates (``duplicatePolicy: defer``, a deployment setting): a message of
# a key whose run holds its lease is parked in the table and sent back by that run's release, or
# by reconciliation's sweep of the waiting room if the release's wake-up is lost. Under the plain
# setting (suppress) a message parks only behind an end that may be stale: two hunts of 207 and 194
# swarm runs with the sweep skipped broke nothing. With defer, 12 runs from seed 9300 parked 675
# messages and the sweep woke 3 whose wake-up a crash had lost. Drawn from the seed (in a quarter
# of the swarm runs).
DEFERS = (False, False, False, True)
DEFER_SALT = 3261270  # as SLOW_SALT: no pinned swarm seed, nor the small seeds, draws it
# A swarm run may add semaphores to the deployment (``SLUICE_SEMAPHORES`` gains a name, a deployment
# of the semaphore function): the function's first invocation after it is a cold start that finds
# the new semaphore absent and creates it, while the operator may set its limit. Without it the one
# semaphore is absent only at a run's start, before the first cold start returns. Drawn from the
# seed (in a quarter of the swarm runs).
SEMAPHORE_ADDS = (False, False, False, True)
SEMAPHORE_ADDS_SALT = 5626568  # as SLOW_SALT: no pinned swarm seed, nor the small seeds, draws it
# A quarter of swarm runs: some producers' messages carry the id of an earlier message of another
# payload as their ``sluice-origin-message-id`` (another message: its own name), parked or not.
FORGES_ORIGINS = (False, False, False, True)
FORGES_ORIGINS_SALT = 8591926  # as SLOW_SALT: no pinned swarm seed, nor the small seeds, draws it
FORGES_PACE = 4.0  # those runs send forged attributes this many times as often, half of them origins


class Failure(AssertionError):
    """A promise broken, or an invocation that raised what a tick must never raise."""


@dataclass
class Invocation:
    kind: str  # tick or completion
    container: Container
    label: str
    event: Event | None = None
    glet: Any = None
    at: str = ""  # the call it waits to make
    faulted: bool = False  # a throttle or a lost response reached it: it may fail with a TransientError
    clean: bool = False  # meets no fault (FAULTY_ONE_IN)
    after: int = NOTHING  # what happens once the call it is making took effect
    born: float = 0.0  # when it began, by the world's clock
    decided: bool = False  # its last call was a write that took effect (AFTER_DECISION)
    rare: float = 0.0  # the chance it dies before its next call, its last a rare decision (RARE_CRASH)


LAMBDA_TIMEOUT = {"tick": 120, "completion": 60, "semaphore": 30}  # seconds, as serverless.yml deploys them


class Switch(Fault):
    """Every call of a container: a switch point, then maybe a fault drawn by the scheduler."""

    def __init__(self, explorer: Explorer, inv: Invocation) -> None:
        self.explorer = explorer
        self.inv = inv

    def before(self, injector: Injector, call: Call) -> tuple[Any, dict[str, Any]] | None:
        ex = self.explorer
        self.inv.after = NOTHING
        self.inv.at = f"{call.operation}/{call.step}"
        if ex.faulty:
            ex.waiting.append(self.inv)
            ex.main.switch()  # the scheduler resumes this invocation when it draws it
        self._die_past_the_timeout(injector, call.operation)
        answer = ex.switch.answer(call)  # IAM, or a deleted state machine
        if answer is not None or not ex.faulty or self.inv.clean:
            return answer
        rare, self.inv.rare = self.inv.rare, 0.0
        if rare and ex.choices.chance(rare):
            count("explorer:rare_decision_crash")
            ex.note(f"{self.inv.label} at {self.inv.at}: crash before, right after a rare decision")
            injector.dead = True
            raise Crash(f"{injector.name} died right after a rare decision, before {call.operation}")
        decided, self.inv.decided = self.inv.decided, False
        if decided:
            count("explorer:after_decision")
        what = ex.choices.draw(len(AT_CALL), ex.decision_at_call if decided else ex.at_call)
        if what:
            ex.note(f"{self.inv.label} at {self.inv.at}: {FAULT_NAMES[what]}")
        if what == CRASH_BEFORE:
            count("explorer:crash_before")
            injector.dead = True
            raise Crash(f"{injector.name} died before {call.operation}")
        if what == THROTTLE:
            count("explorer:throttle")
            self.inv.faulted = True
            return throttled(call.service)
        self.inv.after = what
        return None

    def after(self, injector: Injector, call: Call, status: int, parsed: dict[str, Any]) -> None:
        what, self.inv.after = self.inv.after, NOTHING
        if status >= 300:
            return
        if self.explorer.after_decision and _decision(call):
            self.inv.decided = True
        if self.explorer.rare_crash and _decision(call):
            made = self.explorer.decisions[call.step]
            self.explorer.decisions[call.step] += 1
            self.inv.rare = 1.0 / (made + 2)
        if what == CRASH_AFTER:
            count("explorer:crash_after")
            injector.dead = True
            raise Crash(f"{injector.name} died after {call.operation}")
        if what == LOST and self.explorer.retried_writes and _conditional_write(call):
            count("explorer:lost_then_retried")
            self.inv.faulted = True
            _sdk_retry(injector, call)
            return
        if what == LOST and self.explorer.retried_writes and call.operation == "StartExecution":
            count("explorer:start_lost_then_retried")
            self.inv.faulted = True
            self._retry_start(injector, call)
            return
        if what == LOST:
            count("explorer:lost_response")
            self.inv.faulted = True
            self.explorer.world.model.answer_lost(call)
            raise ReadTimeoutError(endpoint_url=f"https://{call.service}.invalid/")

    def _die_past_the_timeout(self, injector: Injector, what: str) -> None:
        """Lambda ends an invocation at its timeout (serverless.yml), before the visibility timeout
        of the messages it received runs out: none of its calls is made after that."""
        if self.explorer.world.clock.now() - self.inv.born > LAMBDA_TIMEOUT[self.inv.kind]:
            count("explorer:lambda_timeout")
            injector.dead = True
            raise Crash(f"{injector.name} killed at its Lambda timeout before {what}")

    def _retry_start(self, injector: Injector, call: Call) -> None:
        """The SDK's second attempt at a StartExecution whose first attempt started the run and
        whose answer was lost. The SDK backs off first: a switch point, where the world moves on
        (the run may end meanwhile). Then the second attempt is carried out (Step Functions gives
        the same ARN while the run runs with the same input, ``ExecutionAlreadyExists`` once it has
        ended), throttled (a 4xx after a retry: the run started all the same) or its answer lost
        too, one of the three drawn alike; the last attempt's answer is the caller's."""
        ex = self.explorer
        self.inv.at = f"{call.operation}/{call.step} (retry)"
        ex.waiting.append(self.inv)
        ex.main.switch()
        self._die_past_the_timeout(injector, f"retrying {call.operation}")
        answer = ex.choices.draw(3) if ex.faulty else 0
        ex.note(f"{self.inv.label} retries {call.operation}: {('carried out', 'throttled', 'lost')[answer]}")
        if answer == 1:
            count("explorer:start_retry_throttled")
            _, parsed = throttled(call.service)
            parsed["ResponseMetadata"]["RetryAttempts"] = 1
            raise ClientError(parsed, call.operation)  # type: ignore[arg-type]
        if answer == 2:
            count("explorer:start_retry_lost")
            raise ReadTimeoutError(endpoint_url=f"https://{call.service}.invalid/")
        count("explorer:start_retry_carried_out")
        _sdk_retry(injector, call)


def _decision(call: Call) -> bool:
    """A write that decides something (AFTER_DECISION): a conditional write or a transaction."""
    return _conditional_write(call) or (call.service == "dynamodb" and call.operation == "TransactWriteItems")


def _conditional_write(call: Call) -> bool:
    return (
        call.service == "dynamodb"
        and call.operation in CONDITIONAL_WRITES
        and "ConditionExpression" in call.params
    )


def _sdk_retry(injector: Injector, call: Call) -> None:
    """The SDK's second attempt at a conditional write (or a StartExecution) whose first attempt
    took effect and whose answer was lost (Sluice's clients retry a read timeout: botocore's
    standard mode). It is carried out as any call, and its answer is the caller's: the write's own
    condition, which the first attempt's effect may no longer meet, refuses it
    (``ConditionalCheckFailedException``, after one retry). The model sees both attempts."""
    client = pool().client(call.service)  # no injector: this attempt draws no fault
    try:
        parsed, status = getattr(client, xform_name(call.operation))(**call.params), 200
    except ClientError as exc:
        parsed, status = exc.response, int(exc.response["ResponseMetadata"]["HTTPStatusCode"])
    if injector.observer is not None:
        injector.observer.saw(
            Call(call.container, call.service, call.operation, call.step, call.params), status, parsed
        )
    if status >= 300:
        count(
            "explorer:start_retry_refused" if call.operation == "StartExecution" else "explorer:retry_refused"
        )
        parsed["ResponseMetadata"]["RetryAttempts"] = 1
        raise ClientError(parsed, call.operation)  # type: ignore[arg-type]


@contextmanager
def swapped(owner: Any, name: str, value: Any, when: bool = True) -> Iterator[None]:
    """``owner.name`` is ``value`` while the run lasts (``when``): a widening's constant."""
    saved = getattr(owner, name)
    setattr(owner, name, value if when else saved)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def plans_in_steps(small: bool) -> AbstractContextManager[None]:
    """SMALL_PLANS: one cap move to a transaction while the run lasts."""
    return swapped(slots_adapter, "SHARDS_PER_TRANSACTION", 1, small)


def books_short(short: bool) -> AbstractContextManager[None]:
    """SHORT_BOOKS: two entries kept past their period while the run lasts."""
    return swapped(rate_limits, "KEPT_PAST", 2, short)


@contextmanager
def deterministic(seed: int) -> Iterator[None]:
    """moto's ids, uuid4 and every ``random.Random()`` made without a seed (Sluice's shard and lane
    orders, a launcher's identity) drawn from ``seed``, so that a run is a function of its draws."""
    mock_random.seed(seed)
    rng = random.Random(seed)
    original_random, original_uuid4 = random.Random, uuid.uuid4

    class Seeded(original_random):  # type: ignore[misc, valid-type]
        def __init__(self, x: Any = None) -> None:
            super().__init__(rng.getrandbits(64) if x is None else x)

    random.Random = Seeded  # type: ignore[misc]
    uuid.uuid4 = lambda: uuid.UUID(int=rng.getrandbits(128), version=4)  # type: ignore[assignment]
    try:
        yield
    finally:
        random.Random = original_random  # type: ignore[misc]
        uuid.uuid4 = original_uuid4


@dataclass
class Outcome:
    failure: str | None
    draws: list[int]
    steps: int
    calls: int
    cpu: float
    trace: list[str] = field(default_factory=list)


class Explorer:
    def __init__(
        self, choices: Choices, steps: int, *, without: frozenset[str] = frozenset(), swarm: bool = False
    ) -> None:
        self.choices = choices
        self.steps = steps
        self.without = without  # producers left out
        self.trace: list[str] = []
        self.calls = 0
        self.faulty = True  # switch points yield and may fault (off while the run winds down)
        self.waiting: list[Invocation] = []
        self.running: list[Invocation] = []
        self.failure: str | None = None
        self.main = greenlet.getcurrent()
        self.actors = Actors(self)
        self.switch = MachineSwitch(self)
        draw = choices.draw
        self.config = {
            "max_concurrency": 2 + draw(3),
            "skew": SKEWS[draw(len(SKEWS))],
            "slots_per_shard": (8, 2, 1)[draw(3)],
            "key_concurrency": 1 + draw(2),
        }
        self.scale: dict[str, float] = {}  # an actor's or a producer's weight multiplied (swarm)
        self.at_call = AT_CALL
        self.lag_weights = LAG_WEIGHTS[0]
        self.free_resumes = False  # plain runs: a step is any action, an invocation's next call too
        self.payloads = PAYLOADS
        if swarm:
            self.payloads = SWARM_PAYLOADS[
                random.Random(choices.seed * 31 + 7).randrange(len(SWARM_PAYLOADS))
            ]
            from tests.explorer.actors import PRODUCERS

            for name in (*SWARM_ACTORS, *(f"send:{p}" for p, _ in PRODUCERS)):
                self.scale[name] = SWARM_SCALES[draw(len(SWARM_SCALES))]
            self.scale["resume"] = RESUME_SCALES[draw(len(RESUME_SCALES))]
            self.scale["resubmit"] = RESUBMIT_CHANCES[draw(len(RESUBMIT_CHANCES))]
            self.lag_weights = LAG_WEIGHTS[draw(len(LAG_WEIGHTS))]
            self.at_call = (AT_CALL[0], *(w * FAULT_SCALES[draw(len(FAULT_SCALES))] for w in AT_CALL[1:]))
            calm = FAULT_DENSITIES[draw(len(FAULT_DENSITIES))]
            self.free_resumes = draw(2) == 1
            self.at_call = (self.at_call[0], *(w * calm for w in self.at_call[1:]))
            self.scale["tick_on_end"] = TICK_ON_END if self.scale["resume"] == LAMBDA_PACE else 0.0
            self.config["swarm"] = {k: v for k, v in self.scale.items() if v != 1.0} | {
                "faults": self.at_call[1:],
                "lags": self.lag_weights,
                "free_resumes": self.free_resumes,
                "payloads": self.payloads,
            }
        # Half the runs, plain or swarm, answer a lost conditional write as Sluice's SDK does: with its
        # retry's answer (``_sdk_retry``). Drawn from the seed, not the draws, as rates are below.
        self.retried_writes = random.Random(choices.seed * 149 + 41).random() < 0.5
        # A swarm run may run under a rate limit (promise 8), drawn from the seed, not the draws, so
        # that schedules printed before rates were drawn replay draw for draw.
        self.rate, self.key_rate = self.drawn_rates(choices.seed)[:2] if swarm else (None, None)
        self.slow = (
            SLOW_CONTAINERS[random.Random(choices.seed * 167 + SLOW_SALT).randrange(len(SLOW_CONTAINERS))]
            if swarm
            else None
        )
        if self.slow is not None:
            self.config.setdefault("swarm", {})["slow"] = self.slow
        self.redrive_last = (
            REDRIVE_LAST[random.Random(choices.seed * 173 + REDRIVE_LAST_SALT).randrange(len(REDRIVE_LAST))]
            if swarm
            else 0.0
        )
        if self.redrive_last:
            self.config.setdefault("swarm", {})["redrive_last"] = self.redrive_last
        self.run_life = (
            RUN_LIFE[random.Random(choices.seed * 179 + RUN_LIFE_SALT).randrange(len(RUN_LIFE))]
            if swarm
            else 0.0
        )
        self.focus = self.draws_focus(choices.seed) if swarm else None
        self.fill = False  # a busy run's pool filled (FILL)
        if self.focus is not None:
            seeded = random.Random(choices.seed * 191 + FOCUS_SALT)
            self.payloads = 2 if self.focus == "one key" else seeded.choice(BUSY_PAYLOADS)
            self.fill = self.focus == "busy key" and self.draws_fill(choices.seed)
            if self.fill:
                self.payloads = self.config["max_concurrency"] + 1
                self.config["slots_per_shard"] = 1
                self.config.setdefault("swarm", {})["fill"] = True
            self.slow = self.slow or seeded.choice([c for c in SLOW_CONTAINERS if c is not None])
            self.redrive_last = max(self.redrive_last, REDRIVE_LAST[-1])
            self.run_life = self.run_life or seeded.choice([life for life in RUN_LIFE if life])
            self.scale["resubmit"] = RESUBMIT_CHANCES[-1]
            for name in FOCUS_KEPT:
                self.scale[name] = max(self.scale[name], 1.0)
            if self.fill:
                for name in FILL_QUIET:
                    self.scale[name] = 0.0
                self.lag_weights = LAG_WEIGHTS[0]
            self.config.setdefault("swarm", {}).update(
                focus=self.focus,
                slow=self.slow,
                redrive_last=self.redrive_last,
                payloads=self.payloads,
                resubmit=self.scale["resubmit"],
            )
        if self.run_life:
            self.config.setdefault("swarm", {})["run_life"] = self.run_life
        self.after_decision = (
            AFTER_DECISION[random.Random(choices.seed * 193 + DECISION_SALT).randrange(len(AFTER_DECISION))]
            if swarm
            else False
        )
        crash = (CRASH_BEFORE, CRASH_AFTER)
        self.decision_at_call = tuple(
            w * DECISION_CRASH if i in crash else w for i, w in enumerate(self.at_call)
        )
        if self.after_decision:
            self.config.setdefault("swarm", {})["after_decision"] = True
        self.rare_crash = self.fill or (swarm and self.draws_rare_crash(choices.seed))
        self.decisions: Counter[str] = Counter()  # decisions made in this run, by step (RARE_CRASH)
        if self.rare_crash:
            self.config.setdefault("swarm", {})["rare_crash"] = True
        self.wake = (
            WAKES[random.Random(choices.seed * 197 + WAKE_SALT).randrange(len(WAKES))] if swarm else 0.0
        )
        if self.wake:
            self.config.setdefault("swarm", {})["wake"] = self.wake
        if swarm and self.draws_small_plans(choices.seed):
            self.config.setdefault("swarm", {})["small_plans"] = True
        if swarm and self.draws_short_books(choices.seed):
            self.config.setdefault("swarm", {})["short_books"] = True
        self.lanes = (
            LANES[random.Random(choices.seed * 211 + LANES_SALT).randrange(len(LANES))] if swarm else ""
        )
        self.lane_rate = self.drawn_rates(choices.seed)[2] if self.lanes else None
        if self.lanes:
            self.config["lanes"] = self.lanes
            self.config.setdefault("swarm", {}).update(lanes=self.lanes, lane_rate=str(self.lane_rate))
        lane_rates = {LANE: self.lane_rate} if self.lane_rate is not None else {}
        if self.rate is not None or self.key_rate is not None or lane_rates:
            self.config["rates"] = RateDefaults(stack=self.rate, key=self.key_rate, lanes=lane_rates)
        if self.key_rate is not None:  # a key's rate is drawn: many keyed messages (no draw moves)
            self.scale["send"] = max(1.0, self.scale.get("send", 1.0))
            self.scale["send:keyed"] = 4.0 * max(1.0, self.scale.get("send:keyed", 1.0))
        self.faulty_one_in = (
            FAULTY_ONE_IN[random.Random(choices.seed * 227 + FAULTY_SALT).randrange(len(FAULTY_ONE_IN))]
            if swarm
            else 0
        )
        if self.faulty_one_in:
            self.config.setdefault("swarm", {})["faulty_one_in"] = self.faulty_one_in
        self.drain = (
            DRAINS[random.Random(choices.seed * 233 + DRAIN_SALT).randrange(len(DRAINS))] if swarm else 0.0
        )
        self.draining = False  # the producers are done (DRAINS)
        self.retry_on_event = (
            RETRY_ON_EVENT[random.Random(choices.seed * 239 + RETRY_SALT).randrange(len(RETRY_ON_EVENT))]
            if swarm
            else False
        )
        if self.focus == "busy key":
            self.after_decision = self.retry_on_event = True
            self.drain = self.drain or DRAINS[-1]
            self.config["swarm"].update(after_decision=True, drain=self.drain)
        self.upgrade = swarm and self.draws_upgrade(choices.seed)
        if self.upgrade:
            self.scale["switch_machine"] = UPGRADE_PACE * max(1.0, self.scale["switch_machine"])
            self.scale["delete_old_machine"] = UPGRADE_PACE
            self.config.setdefault("swarm", {})["upgrade"] = True
        if swarm and self.draws_defer(choices.seed):
            self.config["duplicate_policy"] = "defer"
            self.config.setdefault("swarm", {})["defer"] = True
        self.semaphore_adds = swarm and self.draws_semaphore_adds(choices.seed)
        if self.semaphore_adds:
            self.config.setdefault("swarm", {})["semaphore_adds"] = True
        self.forges_origins = swarm and self.draws_forged_origins(choices.seed)
        if self.forges_origins:
            self.scale["send:forged"] = FORGES_PACE * max(1.0, self.scale.get("send:forged", 1.0))
            self.config.setdefault("swarm", {})["forges_origins"] = True
        if self.retry_on_event:
            self.config.setdefault("swarm", {})["retry_on_event"] = True
        if self.drain:
            self.config.setdefault("swarm", {})["drain"] = self.drain
        self.world = ExplorerWorld(**{k: v for k, v in self.config.items() if k != "swarm"})
        self.world.model.rates_in_force[STACK] = self.rate
        if self.lane_rate is not None:
            self.world.model.rates_in_force[lane_scope(LANE)] = self.lane_rate
        self.world.model.key_rate = self.key_rate
        observe = self.world.model.saw

        def saw(call: Call, status: int, parsed: dict[str, Any]) -> None:
            self.calls += 1  # every call of Sluice's code that reached AWS or a fault: the rate's numerator
            if status < 300 and _reads_lane_settings(call):
                self.settings_read[call.container] = self.world.model.lane_settings
            observe(call, status, parsed)

        self.world.model.saw = saw  # type: ignore[method-assign]
        # container -> the lane settings written before its latest read of them (``LANE#``)
        self.settings_read: dict[str, int] = {}
        self.history = History(self.world.clock)

    @staticmethod
    def draws_focus(seed: int) -> str | None:
        """A swarm run's focus (FOCUS), else whether it is busy (BUSY), from its seed."""
        focus = FOCUS[random.Random(seed * 181 + FOCUS_SALT).randrange(len(FOCUS))]
        return BUSY[random.Random(seed * 241 + BUSY_SALT).randrange(len(BUSY))] if focus is None else focus

    @staticmethod
    def draws_fill(seed: int) -> bool:
        """A swarm run of ``seed`` fills its pool (FILL): a busy run that draws it."""
        busy = Explorer.draws_focus(seed) == "busy key"
        return busy and FILL[random.Random(seed * 251 + FILL_SALT).randrange(len(FILL))]

    @staticmethod
    def draws_small_plans(seed: int) -> bool:
        """A swarm run of ``seed`` plans its pools one cap move to a transaction (SMALL_PLANS)."""
        return SMALL_PLANS[random.Random(seed * 263 + SMALL_PLANS_SALT).randrange(len(SMALL_PLANS))]

    @staticmethod
    def drawn_rates(seed: int) -> tuple[Rate | None, Rate | None, Rate | None]:
        """A swarm run's rates by the parameters: the stack's, every key's, and its lane's (if it
        deploys lanes)."""
        lanes = LANES[random.Random(seed * 211 + LANES_SALT).randrange(len(LANES))]
        return (
            RATES[random.Random(seed * 131 + 17).randrange(len(RATES))],
            KEY_RATES[random.Random(seed * 137 + 29).randrange(len(KEY_RATES))],
            LANE_RATES[random.Random(seed * 223 + LANES_SALT).randrange(len(LANE_RATES))] if lanes else None,
        )

    @staticmethod
    def draws_short_books(seed: int) -> bool:
        """A swarm run of ``seed`` keeps two rate entries past their period (SHORT_BOOKS): one in
        four of the runs with a rate of 1 second."""
        per_second = any(r is not None and r.period == 1 for r in Explorer.drawn_rates(seed))
        return (
            per_second
            and SHORT_BOOKS[random.Random(seed * 271 + SHORT_BOOKS_SALT).randrange(len(SHORT_BOOKS))]
        )

    @staticmethod
    def draws_upgrade(seed: int) -> bool:
        """A swarm run of ``seed`` upgrades its workflow (UPGRADES) unless it fills its pool."""
        drawn = UPGRADES[random.Random(seed * 269 + UPGRADE_SALT).randrange(len(UPGRADES))]
        return drawn and not Explorer.draws_fill(seed)

    @staticmethod
    def draws_defer(seed: int) -> bool:
        """A swarm run of ``seed`` defers duplicates (DEFERS)."""
        return DEFERS[random.Random(seed * 271 + DEFER_SALT).randrange(len(DEFERS))]

    @staticmethod
    def draws_semaphore_adds(seed: int) -> bool:
        """A swarm run of ``seed`` adds semaphores to the deployment (SEMAPHORE_ADDS)."""
        return SEMAPHORE_ADDS[random.Random(seed * 283 + SEMAPHORE_ADDS_SALT).randrange(len(SEMAPHORE_ADDS))]

    @staticmethod
    def draws_forged_origins(seed: int) -> bool:
        """A swarm run of ``seed`` forges origin ids of other payloads' messages (FORGES_ORIGINS)."""
        return FORGES_ORIGINS[random.Random(seed * 293 + FORGES_ORIGINS_SALT).randrange(len(FORGES_ORIGINS))]

    @staticmethod
    def draws_rare_crash(seed: int) -> bool:
        """A swarm run of ``seed`` draws RARE_CRASH from its seed (a full pool crashes them too)."""
        return RARE_CRASH[random.Random(seed * 257 + RARE_SALT).randrange(len(RARE_CRASH))]

    def note(self, text: str) -> None:
        self.trace.append(f"[{len(self.choices.made)}] {text}")

    # -- invocations ---------------------------------------------------------------------------------

    def container(self, name: str) -> Container:
        if name not in self.world.containers:
            self.world.add_container(name)
        return self.world.containers[name]

    def busy(self) -> set[str]:
        return {inv.container.name for inv in self.running}

    def spawn(
        self, kind: str, name: str, work: Callable[[Container], Any], event: Event | None = None
    ) -> None:
        inv = Invocation(kind, self.container(name), f"{kind}@{name}", event)
        inv.born = self.world.clock.now()
        if self.faulty_one_in:
            inv.clean = self.choices.draw(self.faulty_one_in) != 0
            count("explorer:clean_invocation" if inv.clean else "explorer:faulty_invocation")
        self.note(
            f"start {inv.label}"
            + (f" for {event.status} of {event.name[:12]}" if event else "")
            + (" (faulty)" if self.faulty_one_in and not inv.clean else "")
        )

        def body() -> None:
            c = inv.container
            c.injector.faults[:] = [Switch(self, inv), StaleView(self)]
            outcome = "ok"
            try:
                work(c)
            except Crash:
                outcome = "crashed"
            except TransientError as exc:
                outcome = "refused"
                if not inv.faulted:
                    self.failure = f"{inv.label} failed with no fault injected: {exc!r}"
            except Exception as exc:
                outcome = "raised"
                self.failure = (
                    f"bad input or a race crashed an invocation: {inv.label} raised {exc!r}\n"
                    + "".join(traceback.format_exception(exc)[-6:])
                )
            finally:
                c.injector.faults.clear()
            self.world.model.invocation_ended(c.name, "crashed" if c.injector.dead else outcome)
            if outcome == "crashed" or c.injector.dead:
                c.restart()
            if c.name in self.switch.redeploy:
                self.switch.restart(c.name)
            read = self.settings_read.pop(c.name, None)
            if kind == "tick" and outcome == "ok":
                # A tick puts in force the settings it read last; a wake that left its fill to the
                # launcher holding the turn read none (seed 1083332218), and binds nothing.
                self.world.model.tick_returned(-1 if read is None else read)
            if event is not None:
                (self.world.delivered if outcome == "ok" else self.world.pending).append(event)
            self.running.remove(inv)
            self.note(f"end {inv.label}: {outcome}")

        inv.glet = greenlet(body, parent=self.main)
        self.running.append(inv)
        self.resume(inv)

    def _pace(self, inv: Invocation) -> float:
        """How often one waiting invocation proceeds: slower in the slow container, or right after
        a decision (AFTER_DECISION)."""
        return min(
            SLOW_PACE if inv.container.name == self.slow else 1.0,
            DECISION_PACE if inv.decided else 1.0,
        )

    def clean_time_left(self) -> float | None:
        """The virtual seconds until the first clean invocation waiting reaches its Lambda timeout
        (None: no clean one waits)."""
        now = self.world.clock.now()
        left = [inv.born + LAMBDA_TIMEOUT[inv.kind] - now for inv in self.waiting if inv.clean]
        return min(left, default=None)

    def time_left(self) -> float | None:
        """The virtual seconds until the first invocation waiting reaches its Lambda timeout, of
        those that have not (None: none)."""
        now = self.world.clock.now()
        left = [inv.born + LAMBDA_TIMEOUT[inv.kind] - now for inv in self.waiting]
        return min((x for x in left if x > 0), default=None)

    def resume_pace(self) -> float:
        """How often an invocation proceeds against the world's moves: slower when only slow
        invocations wait."""
        return max((self._pace(inv) for inv in self.waiting), default=1.0)

    def resume_weights(self) -> list[float] | None:
        """The weights of the invocations waiting, to draw the one that proceeds (None: alike)."""
        weights = [self._pace(inv) for inv in self.waiting]
        if all(w == 1.0 for w in weights):
            return None
        if len(self.waiting) > 1 and any(inv.container.name == self.slow for inv in self.waiting):
            count("explorer:slow_beside_others")
        return weights

    def resume(self, inv: Invocation) -> None:
        if inv in self.waiting:
            self.waiting.remove(inv)
        inv.glet.switch()
        if self.failure:
            raise Failure(self.failure)

    # -- the step ------------------------------------------------------------------------------------

    def check(self, when: str) -> None:
        try:
            self.world.check()
        except AssertionError as exc:
            raise Failure(f"{exc} ({when})") from exc
        broken = self.actors.check()
        if broken:
            raise Failure(f"{broken} ({when})")

    def wind_down(self) -> None:
        """Every invocation runs to its end with no fault."""
        self.faulty = False
        while self.waiting:
            self.resume(self.waiting[0])
        self.check("winding down")
        kept = self.world.kept_for_nobody()
        if kept:
            raise Failure(
                f"keys (nothing kept for nobody): a slot kept for a woken waiter gone: {kept} (at rest)"
            )

    def take_steps(self, steps: int, label: str) -> None:
        i = actions = 0
        while actions < steps and i < steps * RESUMES_PER_ACTION:
            if self.draining and not self.waiting and not self.world.backlog():
                return
            done = self.actors.step()
            self.check(f"{label} {i}")
            i += 1
            actions += done != "resume" or not self.free_resumes

    def run(self) -> None:
        self.take_steps(self.steps, "step")
        if self.drain:
            self.draining = True
            self.faulty_one_in = self.faulty_one_in or DRAIN_FAULTY_ONE_IN
            count("explorer:drain")
            self.note("the producers stop: draining")
            self.take_steps(int(self.steps * self.drain), "draining, step")
        self.wind_down()
        try:
            self.world.settle()
        except AssertionError as exc:
            raise Failure(f"{exc} (at rest)") from exc
        except Exception as exc:
            # moto's own exception out of the suite's settling (not through a client): the harness.
            who = "the harness" if type(exc).__module__.startswith("moto") else "bad input or a race"
            raise Failure(
                f"{who} crashed an invocation: settling raised {exc!r} (at rest)\n"
                + "".join(traceback.format_exception(exc)[-6:])
            ) from exc

    def close(self) -> None:
        self.faulty = False
        for inv in list(self.running):
            if not inv.glet.dead:
                inv.glet.throw(greenlet.GreenletExit)
        self.world.close()


def _reads_lane_settings(call: Call) -> bool:
    """A read of the lanes' run-time settings (``LANE#<name>``), as a tick makes when its rounds begin."""
    if call.operation == "GetItem":
        keys = [call.params.get("Key", {})]
    elif call.operation == "BatchGetItem":
        keys = [k for table in call.params.get("RequestItems", {}).values() for k in table.get("Keys", [])]
    else:
        return False
    return any(k.get("pk", {}).get("S", "").startswith("LANE#") for k in keys)


def explore(
    seed: int,
    steps: int,
    replay: list[int] | None = None,
    *,
    without: frozenset[str] = frozenset(),
    swarm: bool = False,
) -> Outcome:
    """One run: seed ``seed`` (the world's own randomness, and the draws unless ``replay`` gives them)."""
    redrive_filter()  # moto answers ListExecutions' redriveFilter as AWS does (tests.support.moto_patches)
    dead_letter_source()  # a message SQS moved to the DLQ says from where, as in AWS (tests.support.moto_patches)
    choices = Choices(seed, replay)
    started = time.process_time()
    failure = None
    explorer = None
    with (
        deterministic(seed),
        faster_moto(),
        lighter(),
        plans_in_steps(swarm and Explorer.draws_small_plans(seed)),
        books_short(swarm and Explorer.draws_short_books(seed)),
    ):
        try:
            explorer = Explorer(choices, steps, without=without, swarm=swarm)
            explorer.run()
        except Failure as exc:
            failure = str(exc)
        finally:
            if explorer is not None:
                explorer.close()
    return Outcome(
        failure,
        list(choices.made),
        steps,
        explorer.calls if explorer else 0,
        time.process_time() - started,
        explorer.trace if explorer else [],
    )
