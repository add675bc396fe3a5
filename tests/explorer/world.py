"""The reliability world, its own reads made straight from moto's backends.

The checks after every step read the whole table (the ledger against the leases) and Step
Functions' RUNNING executions; swarm runs' actors read the queue's depth. Through boto3 each read is a request that moto parses, runs and
serialises; here the same items and names are read from moto's backends, in the wire format the
checks expect. Sluice's calls are unchanged: only the suite's own observation is cheaper.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import moto.sqs.models
from moto.core import DEFAULT_ACCOUNT_ID
from moto.dynamodb.models import dynamodb_backends
from moto.moto_api._internal import mock_random
from moto.sqs.models import sqs_backends
from moto.stepfunctions.models import stepfunctions_backends

from sluice.core.records import INFLIGHT_SECONDS, sent_at
from sluice.features.keys import TICKET_ATTRIBUTE
from sluice.features.rate_limits import KEY_PREFIX, Rate, key_scope
from tests.reliability.actors import pool
from tests.reliability.world import END_ERRORS, Event, World
from tests.support.aws import REGION, status_change_event
from tests.support.faults import Call, count
from tests.support.model import Model
from tests.support.sqs_rules import sqs_rules
from tests.support.steps import slot_names

CONTAINERS = ("A", "B", "C", "completion", "completion2", "completion3")  # tests/explorer/actors.py


def _wire(value: Any) -> dict[str, Any]:
    kind, raw = value.type, value.value
    if kind == "M":
        return {"M": {k: _wire(v) for k, v in raw.items()}}
    if kind == "L":
        return {"L": [_wire(v) for v in raw]}
    return {kind: list(raw) if isinstance(raw, list) else raw}


class ExplorerWorld(World):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stopped_at: dict[
            str, datetime
        ] = {}  # each execution's latest stop date, as Step Functions gave it
        self.redriven_on: dict[str, datetime] = {}  # each execution's latest redrive date
        self.stamped = 0.0  # Step Functions' latest date (a stop or a redrive), by the world's clock
        # SQS refuses what moto takes (a deduplication id of any characters, ...): as SQS does, on
        # every client of the process's pool (the containers' clients are made once per process).
        clients = pool()
        for name in CONTAINERS:
            clients.container(name)
        sqs = [c for (service, _), c in clients._plain.items() if service == "sqs"]
        sqs += [made["sqs"] for _, made in clients._containers.values()]
        self.sqs_rules = self._exit.enter_context(sqs_rules(None, *sqs))
        self.model.__class__ = ExplorerModel
        self.machines = [self.settings.state_machine_arn]  # every state machine the stack has driven

    def table(self, *attributes: str) -> dict[str, dict[str, Any]]:
        table = dynamodb_backends[DEFAULT_ACCOUNT_ID][REGION].get_table(self.settings.table_name)
        wanted = {"pk", *attributes} if attributes else None
        items: dict[str, dict[str, Any]] = {}
        for item in list(table.items.values()):
            attrs = {k: _wire(v) for k, v in item.attrs.items() if wanted is None or k in wanted}
            items[attrs["pk"]["S"]] = attrs
        return items

    def end(self, name: str, status: str = "SUCCEEDED", effects: list[dict[str, Any]] | None = None) -> Event:
        """``World.end``, for the RUNNING execution of that name on whichever machine the stack has
        driven (the stack's ``finish`` goes by the claim's recorded ARN, which a resume after a switch
        of the state machine no longer matches)."""
        output = None
        if effects is not None and status == "SUCCEEDED":
            output = json.dumps({"sluiceEffects": effects})
            self.model.expect_effects(name, len(effects))
            self.count("ended:with_effects")
            self.count("effects:named", len(effects))
        execution = self._execution(name)
        execution.status = status
        execution.stop_date = self.stamp()
        self.stopped_at[name] = execution.stop_date
        execution.output = output
        error = END_ERRORS.get(status)
        if error:
            execution.error, execution.cause = error, f"{error} cause"
        body = status_change_event(
            execution.state_machine_arn, name, status, error=error, stop=execution.stop_date, output=output
        )
        self.model.ended(name, status)
        self.ended_as[name] = status
        self.ended_when[name] = self.clock.now()
        self.count(f"ended:{status}")
        return self.owe_event(name, status, body)

    def redrive(self, name: str) -> None:
        super().redrive(name)
        self.redriven_on[name] = self.stamp()
        self.model.redrive_dates[name] = self.redriven_on[name].timestamp()

    def stamp(self) -> datetime:
        """A date as Step Functions gives it: by the world's clock, which Sluice's clocks keep
        within their skew (moto's wall clock is weeks away from it), and each after the one before
        (a run's end and its redrive are never at the same instant)."""
        self.stamped = max(self.clock.now(), self.stamped + 0.001)
        return datetime.fromtimestamp(self.stamped, UTC)

    def _execution(self, name: str) -> Any:
        machine = self._machine_of(name) or self.settings.state_machine_arn
        arn = machine.replace(":stateMachine:", ":execution:") + f":{name}"
        return stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION].describe_execution(arn)

    def redrivable(self) -> list[str]:
        """What RedriveExecution accepts, of the machines not deleted."""
        return [n for n in super().redrivable() if self._machine_of(n) is not None]

    def _machine_of(self, name: str) -> str | None:
        """The machine that has an execution of that name: the one where it runs, if one does."""
        backend = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION]
        found = [
            (e.status == "RUNNING", m.arn)
            for m in backend.state_machines
            for e in m.executions
            if e.name == name
        ]
        return max(found)[1] if found else None

    def dlq_sources(self) -> dict[str, str]:
        """Every DLQ message's id -> the message it came from (``sluice-source-message-id``), read
        from moto's backend: a listing by receives stops at the first batch of each FIFO group."""
        queue = sqs_backends[DEFAULT_ACCOUNT_ID][REGION].get_queue(self.settings.dlq_url.rsplit("/", 1)[-1])
        return {
            m.id: m.message_attributes.get("sluice-source-message-id", {}).get("StringValue", m.id)
            for m in queue._messages
        }

    def kept_for_nobody(self) -> list[str]:
        """Slots a concurrency key keeps for woken waiters (``inflight``, not ``landed``, younger than
        ``INFLIGHT_SECONDS``) whose copy is on its way no more: in no queue (visible, in flight or
        delayed) and not dead-lettered. A copy claims, parks again, gives its slot back or stays in
        a queue; a slot kept for none holds its key's line for nobody (``sluice.features.keys``).
        An entry dated further ahead than ``INFLIGHT_SECONDS`` (stamped by a clock that far ahead) is
        not one: the key's next wake drops it (``KeyState.stale``), as that of a forged ticket (seed
        1205115161: launcher B, an hour ahead, noted its entry after another launcher had dropped
        the landed note of its copy's claim as too far ahead)."""
        backend = sqs_backends[DEFAULT_ACCOUNT_ID][REGION]
        carried: set[str] = set()
        for url in [*self.queue_urls().values(), self.settings.dlq_url]:
            for m in backend.get_queue(url.rsplit("/", 1)[-1])._messages:
                carried.add(m.message_attributes.get(TICKET_ATTRIBUTE, {}).get("StringValue", ""))
        now, out = self.clock.now(), []
        for pk, item in self.table("inflight", "landed").items():
            if not pk.startswith("CKEY#"):
                continue
            kept = set(item.get("inflight", {}).get("SS", ())) - set(item.get("landed", {}).get("SS", ()))
            out += [
                f"{pk}: {e}"
                for e in sorted(kept)
                if now - INFLIGHT_SECONDS < sent_at(e) <= now + INFLIGHT_SECONDS and e not in carried
            ]
        return out

    def queue_depth(self, lane: str | None = None) -> int:
        """Messages in ``lane``'s queue (visible, in flight or delayed; None: in every lane's), the
        sum GetQueueAttributes gives, read from moto's backend: swarm runs ask at every step. Each
        request moto answers draws its request id from moto's seeded random (52 characters); the
        same draw is made here, so moto's later ids, and with them the runs pinned seeds replay,
        are the ones the request would have left."""
        backend = sqs_backends[DEFAULT_ACCOUNT_ID][REGION]
        urls = self.queue_urls()
        total = 0
        for url in [urls[lane]] if lane is not None else list(urls.values()):
            queue = backend.get_queue(url.rsplit("/", 1)[-1])
            # moto's three counts in one pass, its clock read once: visible and not delayed, not
            # visible, delayed (a message in flight and delayed counts twice, as in moto).
            now = moto.sqs.models.unix_time_millis()
            for m in queue._messages:
                visible, delayed = now > m.visible_at, now < m.delayed_until
                total += (visible and not delayed) + (not visible) + delayed
            mock_random.get_random_string(length=52)  # gen_amzn_requestid_long's draw
        return total

    def running_in_step_functions(self) -> set[str]:
        backend = stepfunctions_backends[DEFAULT_ACCOUNT_ID][REGION]
        names: set[str] = set()
        for arn in self.machines:
            machine = next((m for m in backend.state_machines if m.arn == arn), None)
            if machine is not None:
                names.update(e.name for e in machine.executions if e.status == "RUNNING")
        return names


def _limit_stamp(params: dict[str, Any]) -> list[dict[str, str]]:
    """The ``:stamp`` a write of the slot pool (``SLOTS#launcher``) sets: its limit's source."""
    updates = [i["Update"] for i in params.get("TransactItems", []) if "Update" in i] or [params]
    for update in updates:
        if update.get("Key", {}).get("pk", {}).get("S") == "SLOTS#launcher":
            return list(update.get("ExpressionAttributeValues", {}).get(":stamp", {}).get("L", []))
    return []


class ExplorerModel(Model):
    """The suite's model, with the external count ordered by when its listing was taken.

    Promise 1 counts an execution outside Sluice once a reconciliation whose listing showed it has
    completed. Two reconciliations may complete in the other order than they listed: the count in
    force is the newest listing's, whichever saved last (an older listing saved later would hide
    an execution the newer one saw, and admit past MAX), from the caps write that carries its
    number (``_on_limit``)."""

    known_at = 0  # the event count at which the listing now in force was taken

    def running_again(self, name: str) -> None:
        """A redrive while Sluice still holds the run (its end's event not yet applied): Sluice
        holds it still, until it releases it (``_on_release``)."""
        with self.lock:
            if name in self.holders:
                self.redriven_held.add(name)
                self.unadopted_redrive.add(name)
        super().running_again(name)

    def _on_adopt(self, call: Call, parsed: dict[str, Any]) -> None:
        super()._on_adopt(call, parsed)
        taken = set(slot_names(call.params, "take"))
        stale = {name for name in taken if self._adopts_an_earlier_redrive(call, name)}
        self.unadopted_redrive.difference_update(taken - stale)
        for name in stale:
            # Explorer seed 1209700796: an adoption read from an answer that showed the run of
            # redrive k lands after that run ended and the operator redrove it again. Sluice holds
            # it, by an adoption of a run that has ended; the release that follows (on that end)
            # leaves the new run outside, as a redrive behind Sluice's back.
            self.redriven_held.add(name)
            self.unadopted_redrive.add(name)

    def _adopts_an_earlier_redrive(self, call: Call, name: str) -> bool:
        """The adoption names the redrive date of the run it took back (``redriven_at``): one
        before the execution's latest redrive is of a run that has ended since."""
        latest = self.redrive_dates.get(name)
        for entry in call.params["TransactItems"]:
            update = entry.get("Update", {})
            if update.get("Key", {}).get("pk", {}).get("S") != f"EXEC#{name}":
                continue
            adopted = update.get("ExpressionAttributeValues", {}).get(":redriven")
            if adopted is not None and latest is not None:
                return float(adopted["N"]) < latest - 0.0005
        return False

    @property
    def redrive_dates(self) -> dict[str, float]:
        """name -> the date of its latest redrive, as Step Functions reports it (``World.redrive``)."""
        return self.__dict__.setdefault("_redrive_dates", {})

    def _on_release(self, call: Call, parsed: dict[str, Any]) -> None:
        """A release, on the word of the end before a redrive Sluice was never told of: the
        operator redrove the run after it ended and before its end's event was applied, and the
        event (or a reconciliation's stale DescribeExecution) released it. Sluice's ledger is then
        as if the redrive came just after the release: a run redriven behind Sluice's back, which
        counts once a reconciliation has listed it (docs/protocol.md, "What counts against MAX":
        until then Sluice may start up to MAX of its own beside it), and is adopted then."""
        before = set(self.holders)
        super()._on_release(call, parsed)
        for name in sorted(before - self.holders):
            if name in self.unadopted_redrive and name in self.running:
                # Its adoption from before the redrive ends with this release (explorer seed
                # 1206201057: still counted as adopted, it was blamed on the key's next claim).
                self.adopted_at.pop(name, None)
                self._went_outside(name)
            elif name in self.redriven_held and any(name in runs for runs in self.succeeded_runs.values()):
                # Redriven while held and SUCCEEDED before this release, which wrote the earlier end
                # (its check came before the redrive): Sluice hears of the success from its event
                # or the next listing of redriven runs, as of one redriven after the release.
                self.unheard_success.add(name)
            self.redriven_held.discard(name)
            self.unadopted_redrive.discard(name)

    @property
    def redriven_held(self) -> set[str]:
        return self.__dict__.setdefault("_redriven_held", set())

    @property
    def unadopted_redrive(self) -> set[str]:
        """Of ``redriven_held``, those not adopted since that redrive (an adoption held before it
        goes on: ``Model.running_again``)."""
        return self.__dict__.setdefault("_unadopted_redrive", set())

    def _on_save_reconciliation(self, call: Call, parsed: dict[str, Any]) -> None:
        at, _ = self.listing.get(call.container, (0, set()))
        if at < self.known_at:
            self.listing.pop(call.container, None)
            return
        super()._on_save_reconciliation(call, parsed)
        self.known_at = at

    @property
    def numbered(self) -> dict[str, int]:
        """container -> the number its last listing took (``LEDGER.counts``)."""
        return self.__dict__.setdefault("_numbered", {})

    def _on_update(self, call: Call, parsed: dict[str, Any]) -> None:
        counts = parsed.get("Attributes", {}).get("counts", {}).get("N")
        if call.params.get("Key", {}).get("pk", {}).get("S") == "LEDGER" and counts is not None:
            self.numbered[call.container] = int(counts)

    def _on_limit(self, call: Call, parsed: dict[str, Any]) -> None:
        """A reconciliation's caps write puts its listing's count in force before its save (the
        pool's stamp carries the listing's number; ``LimitSource``): a newer listing, which may
        come from a staler view and miss executions started outside Sluice less than S ago
        (docs/protocol.md, "Staleness"; seed 1326082451), is then the count admission obeys."""
        at, names = self.listing.get(call.container, (0, set()))
        stamp = _limit_stamp(call.params)
        if len(stamp) != 5:
            return
        number = self.numbered.get(call.container)
        if number is not None and int(float(stamp[3]["N"])) == number and at >= self.known_at:
            self.known_outside = {
                n for n in names if n in self.outside and self.outside_since.get(n, self.events + 1) < at
            }
            self.known_at = at
        # The count this write puts in force covers every run started by hand that the newest
        # listing (by when it was taken) showed and that still runs: a claim now would count it.
        known = sorted(
            n for n in self.known_outside & self.by_hand if n in self.running and n in self.outside
        )
        if int(float(stamp[4]["N"])) < len(known):
            self.violations.append(
                f"promise 1 (never more than MAX): the launcher's limit written from an external count of "
                f"{int(float(stamp[4]['N']))}, below the runs started by hand that the newest listing showed "
                f"and that still run: {known}"
            )

    @property
    def by_hand(self) -> set[str]:
        """Executions started by hand on the stack's machine (``started_outside``)."""
        return self.__dict__.setdefault("_by_hand", set())

    def started_outside(self, name: str, key: str | None = None) -> None:
        self.by_hand.add(name)
        super().started_outside(name, key)

    def answer_lost(self, call: Call) -> None:
        super().answer_lost(call)
        if call.step == "limit":  # it took effect
            with self.lock:
                self._on_limit(call, {})

    # -- lane settings (promise 7) -------------------------------------------------------------------

    @property
    def lane_settings(self) -> int:
        """How many lane settings the operator has written (``set_lane_limit``)."""
        return self.__dict__.get("_lane_settings", 0)

    def set_lane_limit(self, lane: str, limit: int | None, *, caps_moved: bool = True) -> None:
        with self.lock:
            self.__dict__["_lane_settings"] = self.lane_settings + 1
            self.__dict__.setdefault("_lowered_at", {})[lane] = self.lane_settings
            super().set_lane_limit(lane, limit, caps_moved=caps_moved)

    def tick_returned(self, settings_read: int | None = None) -> None:
        """A tick puts in force the lane settings it read last (``settings_read``: how many had been
        written then), so its return binds only a lowering written before that read: ticks overlap
        here, and one that read the settings before the lowering, returning after it, put the older
        limit in force (seed 1730532616: a lane paused by a command that died after its setting,
        claimed in by a tick that began before it; seed 1083332218: a wake that left its fill to the
        launcher holding the turn read nothing, and a tick that read before the setting claimed)."""
        if settings_read is None:
            return super().tick_returned()
        lowered_at: dict[str, int] = self.__dict__.setdefault("_lowered_at", {})
        with self.lock:
            for lane in [lane for lane in self.lane_lowered if lowered_at.get(lane, 0) <= settings_read]:
                self.lane_limits[lane] = self.lane_lowered.pop(lane)

    # -- rate limits (promise 8) ---------------------------------------------------------------------

    @property
    def rates_in_force(self) -> dict[str, Rate | None]:
        """Each scope's rate in force as the test set it (the stack's; a key's set at run time)."""
        return self.__dict__.setdefault("_rates_in_force", {})

    @property
    def key_rate(self) -> Rate | None:
        """Every concurrency key's rate by the stack's parameter (``keyRateLimit``)."""
        return self.__dict__.get("_key_rate")

    @key_rate.setter
    def key_rate(self, value: Rate | None) -> None:
        self.__dict__["_key_rate"] = value

    def rate_of(self, scope: str) -> Rate | None:
        if scope in self.rates_in_force:
            return self.rates_in_force[scope]
        return self.key_rate if scope.startswith(KEY_PREFIX) else None

    @property
    def grants(self) -> dict[str, dict[int, int]]:
        """Every grant of each scope, by the granting clock's ms, net of those given back."""
        return self.__dict__.setdefault("_grants", {})

    def saw(self, call: Call, status: int, parsed: dict[str, Any]) -> None:
        super().saw(call, status, parsed)
        item = call.params.get("Item", {})
        pk = item.get("pk", {}).get("S", "")
        if status < 300 and call.operation == "PutItem" and (pk == "RATES" or pk.startswith("RATES#")):
            with self.lock:
                self._on_rates(pk, item)

    def _on_rates(self, pk: str, item: dict[str, Any]) -> None:
        """A write of a rate book: what it granted (an entry that grew) and gave back (one that
        shrank, or went though still inside its period), read against the book as last written."""
        windows = item.get("windows", {}).get("M", {})
        books: dict[tuple[str, str], dict[int, int]] = self.__dict__.setdefault("_books", {})
        for scope in sorted(set(windows) | {s for p, s in books if p == pk}):
            text = windows.get(scope, {}).get("S", "")
            new = {int(at): int(n) for at, n in (pair.split(":") for pair in text.split())}
            old = books.get((pk, scope), {})
            books[(pk, scope)] = new
            self._on_window(scope, old, new)

    def _on_window(self, scope: str, old: dict[int, int], new: dict[int, int]) -> None:
        """A give-back takes from the one entry it granted and adds nothing; a grant adds and drops
        only entries past their period. Anything else a window lost (a rate change's write, which
        the model does not see, emptying it) is no give-back: those grants still count."""
        rate = self.rate_of(scope)
        grants = self.grants.setdefault(scope, {})
        grown = {at: n - old.get(at, 0) for at, n in new.items() if n > old.get(at, 0)}
        period = rate.period * 1000 if rate else 0
        pruned_before = max(grown, default=None)
        shrunk = {
            at: n - new.get(at, 0)
            for at, n in old.items()
            if n > new.get(at, 0)
            and not (pruned_before is not None and at not in new and at <= pruned_before - period)
        }
        if not grown and len(shrunk) == 1:
            for at, gone in shrunk.items():
                grants[at] = grants.get(at, 0) - gone
        for at, n in grown.items():
            count("rate:granted", n)
            grants[at] = grants.get(at, 0) + n
            if rate is not None:
                self._check_window(scope, at, rate.count, rate.period * 1000)

    def _on_start(self, call: Call, parsed: dict[str, Any]) -> None:
        new = call.params["name"] not in self.started
        super()._on_start(call, parsed)
        if new:
            self._on_rated_start(call.params["name"])

    def _on_rated_start(self, name: str) -> None:
        """A key's rate counts grants; a start that bypasses them is caught here: each new start of
        a key with the stack's ``keyRateLimit`` in force (none set for it at run time) has a grant of
        that key's, net of those given back, taken before it."""
        sent = self.sent.get(self.claims.get(name) or "")
        ckey = sent.attributes.get("sluice-concurrency-key") if sent else None
        scope = key_scope(ckey) if ckey else None
        if scope is None or self.key_rate is None or scope in self.rates_in_force:
            return
        starts: dict[str, int] = self.__dict__.setdefault("_key_starts", {})
        starts[scope] = starts.get(scope, 0) + 1
        granted = sum(self.grants.get(scope, {}).values())
        if starts[scope] > granted:
            self.violations.append(
                f"promise 8 (rate of {scope}): {name} is its start {starts[scope]}, with {granted} grants taken"
            )

    def _check_window(self, scope: str, at: int, count: int, period: int) -> None:
        """No window [x, x + period) of ``scope`` that holds the grant at ``at`` holds more than ``count``."""
        grants = self.grants[scope]
        near = [t for t in grants if abs(t - at) < period]
        # The count in [x, x + period) changes only where a grant enters it: x = t - period + 1.
        for x in sorted({at - period + 1, *(min(max(t - period + 1, at - period + 1), at) for t in near)}):
            held = sum(grants[t] for t in near if x <= t < x + period)
            if held > count:
                self.violations.append(
                    f"promise 8 (rate of {scope}): {held} grants in the window [{x}, {x + period}) ms, rate "
                    f"{count} per {period // 1000} s"
                )
                return
