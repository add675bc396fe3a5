"""The promises the reliability world checks: after every step (``check``) and at rest (``settle``).

Mixed into ``World`` (tests/reliability/world.py): uses its clients, model, containers and clock.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from sluice.core.model import TERMINAL_STATUSES
from sluice.core.records import INFLIGHT_SECONDS
from sluice.features.fair import UNKEYED
from sluice.features.lanes import DEFAULT_LANE, by_priority
from sluice.features.rate_limits import NONE, STACK, key_scope, lane_scope
from sluice.launch.settings import OTHER_CLOCK_WINDOWS
from tests.support.model import AWAIT_REASON, awaited_keys

if TYPE_CHECKING:
    from tests.reliability.world import World

VISIBILITY = 180  # the queue's visibility timeout: launcher timeout (120 s) + 60 s, as deployed
CLAIM_TIMEOUT = 900
WINDOW = 60  # reconciliation's consistency window
SETTLE_ROUNDS = 40


class PromiseBroken(AssertionError):
    """A promise of Sluice does not hold."""


def pool_ceilings(items: dict[str, dict[str, Any]]) -> list[str]:
    """Promise 1 on the table itself: no pool is left, at any step, where claims alone could take it
    past its limit, whatever ends come next and whoever dies now. A claim on shard s needs room under
    its cap; every other shard t can hold max(held, cap) meanwhile (a holder taken past a cap stays
    until it ends). So for each shard s with a cap: cap(s) + sum over t != s of max(held, cap) <= limit.
    A frozen pool's caps are 0 (nothing admitted), whatever it holds."""
    pools: dict[str, dict[str, Any]] = {}
    shards: dict[str, list[tuple[int, int]]] = {}
    for pk, item in items.items():
        parts = pk.split("#")
        if parts[0] != "SLOTS" or len(parts) not in (2, 3):
            continue
        if len(parts) == 2:
            pools[parts[1]] = item
        elif parts[2].isdigit():
            held = len(item.get("holders", {}).get("M", {}))
            shards.setdefault(parts[1], []).append((int(item.get("cap", {}).get("N", "0")), held))
    problems = []
    for pool, meta in sorted(pools.items()):
        if "limit" not in meta:
            continue
        limit = int(meta["limit"]["N"])
        room = shards.get(pool, [])
        reach = sum(max(cap, held) for cap, held in room)
        worst = max((cap - max(cap, held) for cap, held in room if cap > 0), default=None)
        if worst is not None and reach + worst > limit:
            problems.append(
                f"promise 1 (never more than MAX): pool {pool!r} admits past its limit {limit} without a re-plan: "
                f"its shards (cap, held) {room}{' (frozen)' if meta.get('frozen', {}).get('BOOL') else ''}"
            )
    return problems


class Promises:
    def parked_in_table(self: World) -> list[str]:
        """Messages parked (deferred duplicates in the table) and not yet sent back to the queue."""
        return sorted(
            item["message_id"]["S"]
            for pk, item in self.table("message_id", "woken_at").items()
            if pk.startswith("PARK#") and "woken_at" not in item
        )

    def suspected_claims(self: World) -> list[str]:
        """Unstarted claims a reconciler has marked suspect (sighting 1) and not yet released."""
        return sorted(
            pk
            for pk, item in self.table("state", "suspect_since").items()
            if pk.startswith("EXEC#")
            and "suspect_since" in item
            and item.get("state", {}).get("S") == "CLAIMED"
        )

    def waiters_in_table(self: World) -> dict[str, list[str]]:
        """Waiters still parked (``WAIT#`` items not released): message id -> the keys it awaits."""
        return {
            self.model.logical_for(item["message_id"]["S"], item.get("key", {}).get("S")): [
                k["S"] for k in item.get("awaits", {}).get("L", [])
            ]
            for pk, item in self.table("message_id", "key", "released_at", "awaits").items()
            if pk.startswith("WAIT#") and "released_at" not in item and "message_id" in item
        }

    def check_waiters_settled(self: World) -> None:
        """At rest, every event delivered or lost and reconciliation run: no waiter is still parked
        whose awaited keys have all ended (judged from the ends the test made, not from the table's
        records), unless DynamoDB's TTL deleted one of their records since (then it is unseen)."""
        for message_id, awaits in sorted(self.waiters_in_table().items()):
            if awaits and all(k in self.model.ended_keys for k in awaits):
                raise PromiseBroken(
                    f"awaits (no waiter left behind): message {message_id} is still parked, though every key "
                    f"it awaits has ended: {awaits}"
                )

    def key_waiters_in_table(self: World) -> list[str]:
        """Messages waiting in a concurrency key's line (``KWAIT#`` items: a wake deletes them)."""
        return sorted(
            item["message_id"]["S"]
            for pk, item in self.table("message_id").items()
            if pk.startswith("KWAIT#") and "message_id" in item
        )

    def key_holders_in_table(self: World) -> dict[str, list[str]]:
        """Concurrency keys whose ``CKEY#`` item names runs holding a slot: key -> those runs."""
        return {
            pk.removeprefix("CKEY#"): sorted(item["holders"]["SS"])
            for pk, item in self.table("holders").items()
            if pk.startswith("CKEY#") and item.get("holders", {}).get("SS")
        }

    def check_lanes(self: World, items: dict[str, dict[str, Any]], slots: set[str]) -> list[str]:
        """On a stack with lanes, after every step: every global slot's holder holds a slot of its
        own lane (the lane on its ``EXEC#`` record) and no other, every lane's slot is held by a
        holder of a global slot, and the lanes' pools changed only by the claims, releases and
        adoptions the model saw (``sluice.features.lanes``: one transaction takes or gives both)."""
        held = self.lane_holders(items)
        lanes: dict[str, str] = {}
        problems = []
        for lane, name in held:
            if name in lanes:
                problems.append(f"lanes: {name} holds slots of lanes {lanes[name]!r} and {lane!r}")
            lanes[name] = lane
        for name in sorted(slots):
            lane = items.get(f"EXEC#{name}", {}).get("lane", {}).get("S")
            if lanes.get(name) != lane or lane is None:
                problems.append(
                    f"lanes: {name} holds a global slot, its record names lane {lane!r}, and it holds "
                    + (f"a slot of lane {lanes[name]!r}" if name in lanes else "no lane's slot")
                )
        for name, lane in sorted(lanes.items()):
            if name not in slots:
                problems.append(
                    f"lanes (nothing leaks): {name} holds a slot of lane {lane!r} and no global slot"
                )
        if lanes != self.model.lane_holders:
            problems.append(
                f"the lanes' pools changed outside a claim, release or adoption: pools {sorted(lanes.items())}, "
                f"claimed and not released {sorted(self.model.lane_holders.items())}"
            )
        return problems

    def lane_limits_at_rest(self: World) -> dict[str, int]:
        """How many fresh payloads each lane must start at once at rest: MAX's slots given to the
        lanes by priority (then in their declared order), none past its lane's limit; without lanes,
        MAX to the one queue."""
        if not self.settings.lanes:
            return {DEFAULT_LANE: self.model.max}
        room, out = self.model.max, {}
        for group in by_priority(self.settings.lanes):
            for lane in group:
                out[lane.name] = min(room, self.model.lane_limit(lane.name))
                room -= out[lane.name]
        return out

    def adopted_holders(self: World) -> set[str]:
        """Runs whose record holds a slot by an adoption: only those wait for a reconciler's second
        pass (it judges an adoption two windows after its own first sighting)."""
        items = self.table("state", "adoptions")
        return {
            pk.removeprefix("EXEC#")
            for pk, item in items.items()
            if pk.startswith("EXEC#")
            and item.get("state", {}).get("S") in ("CLAIMED", "RUNNING")
            and int(item.get("adoptions", {}).get("N", "0"))
        }

    def backlog(self: World) -> int:
        """Messages still to handle: in the queue, or parked in the table (a deferred duplicate, a
        concurrency key's waiter)."""
        return self.queue_depth() + len(self.parked_in_table()) + len(self.key_waiters_in_table())

    def check_key_caps(self: World) -> None:
        """Promise 6 after every step, judged by Step Functions itself (ListExecutions, RUNNING) and
        the concurrency key each run's message was sent with: a key's runs never exceed the cap in
        force when the last of them was claimed (so a cap lowered while runs hold slots is no break:
        they keep them, and nothing new is claimed). A run redriven behind Sluice's back breaks
        nothing, whatever the cap; once adopted it counts against every claim of its key after that."""
        model = self.model
        by_key: dict[str, list[str]] = {}
        for name in self.running_in_step_functions():
            ckey = model.ckey_of(name)
            if ckey is not None:
                by_key.setdefault(ckey, []).append(name)
        problems = []
        for ckey, names in sorted(by_key.items()):
            ours = [
                n
                for n in names
                if n in model.claimed_key_cap and n not in model.adopted_at and n not in model.outside
            ]
            if not ours:
                continue
            last = max(ours, key=lambda n: model.claim_seq[n])
            adopted = [
                n for n in names if model.adopted_at.get(n, model.claim_seq[last]) < model.claim_seq[last]
            ]
            cap = model.claimed_key_cap[last]
            if len(ours) + len(adopted) > cap:
                problems.append(
                    f"key cap: concurrency key {ckey!r} has {len(ours)} runs RUNNING"
                    + (f" and {len(adopted)} adopted before the last claim" if adopted else "")
                    + f", over its cap {cap} in force when {last} was claimed: {sorted(ours + adopted)}"
                )
        if problems:
            raise PromiseBroken("\n".join(problems))

    # The ledger-against-leases check finds a broken release one step after it happens; switched
    # off, the promises alone must still catch it (tests/reliability/test_broken_variants.py).
    check_ledger = True

    def check(self: World) -> None:
        """After every step: no promise broken so far, and the ledger agrees with the leases."""
        if self.model.violations:
            raise PromiseBroken("\n".join(self.model.violations))
        if self.model.claimed_key_cap:  # a keyed claim was made
            self.check_key_caps()
        items = self.table(
            "holders",
            "holder",
            "state",
            "lane",
            "once_by",
            "expires_at",
            "cap",
            "limit",
            "frozen",
            "starting_at",
            "blocked_by",
        )
        problems = pool_ceilings(items)
        if problems:
            raise PromiseBroken("\n".join(problems))
        # One run per key, where the state is written: a block (a redriven run of the key holds it)
        # lands before the claim's start mark, its commit point, or not at all. A claim both marked
        # and blocked starts beside that run as soon as its claimer, past its commit point, goes on.
        both = sorted(
            pk
            for pk, item in items.items()
            if pk.startswith("EXEC#")
            and "starting_at" in item
            and "blocked_by" in item
            and item.get("state", {}).get("S") == "CLAIMED"
        )
        if both:
            raise PromiseBroken(
                f"promise 2 (one per key): {both} blocked for a redriven run of its key after its start mark: "
                "its claimer, past its commit point, starts it beside that run"
            )
        # Run once, at every step rather than a retention period later: a key whose run-once
        # success (or unknown outcome) is recorded is never under TTL (docs/protocol.md, PAYLOAD#).
        rearmed = sorted(pk for pk, item in items.items() if "once_by" in item and "expires_at" in item)
        if rearmed:
            raise PromiseBroken(
                f"run once: {rearmed} keep a run-once success (once_by) under TTL (expires_at): "
                "a retention period later, a run-once message of the key would run again"
            )
        if not self.check_ledger:
            return
        slots = self.holders(items)
        leases = {
            item["holder"]["S"]
            for pk, item in items.items()
            if pk.startswith("PAYLOAD#") and "holder" in item
        }
        problems = []
        if slots != leases:
            problems.append(
                f"slot without lease or lease without slot: slots {sorted(slots)}, leases {sorted(leases)}"
            )
        if slots != self.model.holders:
            problems.append(
                f"the ledger changed outside a claim or release: ledger {sorted(slots)}, "
                f"claimed and not released {sorted(self.model.holders)}"
            )
        for name in slots:
            state = items.get(f"EXEC#{name}", {}).get("state", {}).get("S")
            if state not in ("CLAIMED", "RUNNING"):
                problems.append(f"slot held by {name}, whose record is {state}")
        if self.settings.lanes:
            problems.extend(self.check_lanes(items, slots))
        if problems:
            raise PromiseBroken("\n".join(problems))

    def settle(self: World) -> None:
        """Quiescence, then the promises that hold at rest: nothing leaks (4, and 7 in every lane),
        nothing lost (3, from every lane's queue)."""
        self.settling = True
        for container in self.containers.values():
            container.restart()
        for lane in sorted(self.lanes_set):
            self.set_lane_max(lane, None)  # back to its configured MAX: a paused lane keeps its queue
        if self.model.max < 2:
            self.set_max(2)
        for ckey in sorted(self.model.key_caps):
            self.set_key_cap(ckey, None)  # a paused key (cap 0) would keep its line for good
        self.lift_rates()
        while self.pending:
            self.deliver(0)

        # Drain: the queue empties once executions end and their slots come back. Copies of one
        # payload run one after another (its lease admits one at a time; deferred ones wait parked
        # behind it), a round each: the bound grows with the messages sent.
        rounds = SETTLE_ROUNDS + len(self.model.sent)
        for round_ in range(rounds):
            self.advance(CLAIM_TIMEOUT + VISIBILITY + WINDOW)
            self.tick("A")
            self.check()
            # Done once nothing is queued or parked, and nothing runs that a waiter awaits.
            if self.backlog() == 0 and not (self.model.running and self.waiters_in_table()):
                break
            for name in sorted(self.model.running):
                self.end(name, "SUCCEEDED")
            if round_ % 2:
                self.pending.clear()  # lost: reconciliation frees those slots
            while self.pending:
                self.deliver(0)
        else:
            depths = self.queue_depths() if self.settings.lanes else {}
            raise PromiseBroken(
                f"promise 4 (nothing leaks): the queue did not drain in {rounds} ticks: {self.queue_depth()} left"
                + (f" (by lane: {depths})" if depths else "")
                + f", {len(self.parked_in_table())} parked, {len(self.key_waiters_in_table())} in a key's line"
            )

        # Once reconciliation has had its window, the ledger counts exactly the RUNNING executions.
        # A claim written by a launcher whose clock runs ahead looks younger than the window to a
        # reconciler by that much (docs/protocol.md, "Clocks": skew delays a release, never decides one).
        # An adoption is judged two windows after the reconciler's own first sighting of it
        # (sluice.launch.reconcile._sight_adoption): a second pass while a run holds a slot by one.
        # An unstarted claim another reconciler marked suspect is taken over once the mark is a claim
        # timeout old by this clock (a skew later when the marker ran ahead), and released a claim
        # timeout after that (explorer seed 1599889280): a pass per sighting.
        for _ in range(3):
            suspected = self.suspected_claims()
            self.advance(
                OTHER_CLOCK_WINDOWS * WINDOW + 1 + max(0.0, self.skew) + (CLAIM_TIMEOUT if suspected else 0)
            )
            self.tick("A")
            self.check()
            if not self.adopted_holders() and not self.suspected_claims():
                break  # nothing left to judge: another pass changes nothing
        lost = self.model.effects_never_sent()
        if lost:
            raise PromiseBroken(f"effects (nothing lost): never sent: {lost}")
        running = self.running_in_step_functions()
        if running != set(self.model.running):
            raise PromiseBroken(
                f"Step Functions runs {sorted(running)}, the suite saw {sorted(self.model.running)} start and not end"
            )
        holders = self.holders(self.table("holders"))
        ours = running - self.model.outside  # what Sluice holds: not started by hand, not redriven
        if holders != ours:
            raise PromiseBroken(
                f"promise 4 (nothing leaks): ledger holds {len(holders)} slots for {len(ours)} RUNNING executions: "
                f"{sorted(holders ^ ours)}"
            )
        for lane in self.lane_names():
            pool = {n for held_in, n in self.lane_holders(self.table("holders")) if held_in == lane}
            runs = {n for n in ours if self.model.lane_of.get(n) == lane}
            if pool != runs:
                raise PromiseBroken(
                    f"promise 7 (nothing leaks): lane {lane!r}'s pool holds {len(pool)} slots for its {len(runs)} "
                    f"RUNNING executions: {sorted(pool ^ runs)}"
                )

        # Everything ends and every event is lost: reconciliation alone must free every slot. An
        # adopted run is judged two windows after the reconciler's own first sighting of its
        # adoption, which comes once the run is missing from the listing: a second pass.
        statuses = sorted(TERMINAL_STATUSES)
        for i, name in enumerate(sorted(running)):
            self.end(name, statuses[i % len(statuses)])
        self.pending.clear()
        for wait in (WINDOW + 1, OTHER_CLOCK_WINDOWS * WINDOW + 1):
            self.advance(wait)
            self.tick("A")
            self.check()
            if not self.adopted_holders():
                break
        items = self.table("holders", "state")
        if self.holders(items):
            raise PromiseBroken(
                f"promise 4 (nothing leaks): slots held after every execution ended: {sorted(self.holders(items))}"
            )
        if self.key_holders_in_table():
            raise PromiseBroken(
                f"key cap (nothing leaks): concurrency keys' slots held after every execution ended: "
                f"{self.key_holders_in_table()}"
            )
        if self.settings.lanes:
            rooms = self.operator.store().lane_rooms(self.lane_names())
            held = {lane: room.running for lane, room in rooms.items() if room.running}
            if held:
                raise PromiseBroken(
                    f"promise 7 (nothing leaks): lanes' slots held after every execution ended: {held} "
                    f"({self.lane_holders(self.table('holders'))})"
                )
        started = {s.key for s in self.model.starts if s.key is not None}
        dead_waiters = {
            self.model.sent[m].key
            for m, reason in self.model.dead_lettered.items()
            if m in self.model.sent and reason.startswith(AWAIT_REASON)
        }
        for key in sorted({s.key for s in self.model.sent.values() if s.key is not None}):
            if key not in started and all(awaited_keys(s) for s in self.model.sent.values() if s.key == key):
                continue  # only waiters: still parked, or dead-lettered (checked below)
            item = items.get(f"PAYLOAD#{key}")
            if (item is None or "state" not in item) and f"PAYLOAD#{key}" in self.expired:
                # Settled, kept for the retention period, and deleted by TTL since; a waiter that
                # parked on the key afterwards flags it (``awaited``), a flag-only item that the
                # store reads as no record.
                continue
            state = item.get("state", {}).get("S") if item else None
            if state == "INVALID" and key in dead_waiters:
                continue  # a waiter of this key was dead-lettered after its last run
            if state in ("INVALID", "RELEASED") and key in self.model.vanished_keys:
                continue  # its claim on a deleted state machine: outcome unknown (model_machines)
            if state == "RELEASED" and self.model.machines.unknown_outcome(key):
                continue  # held on a state machine deleted before its release: outcome unknown (idem)
            if state not in TERMINAL_STATUSES:
                raise PromiseBroken(
                    f"promise 4 (nothing leaks): payload {key!r} has no final record: state {state}"
                )

        # Every one of the MAX slots can be used again (with lanes: as many as the lanes' limits let
        # start, each lane given its share by priority).
        fresh: dict[str, list[str | None]] = {}
        for lane, n in self.lane_limits_at_rest().items():
            fresh[lane] = [
                self.send(
                    json.dumps({"id": f"settle-{lane}-{self._seq}-{i}"}),
                    group=f"settle-{lane}-{i}",
                    lane=lane,
                )
                for i in range(n)
            ]
        self.tick("A")
        self.check()
        idle = {
            lane: [m for m in sent if m not in self.model.started_by_message] for lane, sent in fresh.items()
        }
        if any(idle.values()):
            total = sum(len(sent) for sent in fresh.values())
            used = total - sum(len(m) for m in idle.values())
            raise PromiseBroken(
                f"promise 4 (nothing leaks): only {used} of MAX={self.model.max} slots could be used"
                + (
                    f" ({total} within the lanes' limits; idle by lane: "
                    f"{ {lane: len(m) for lane, m in idle.items() if m} })"
                    if self.settings.lanes
                    else ""
                )
            )
        for name in sorted(self.model.running):
            self.end(name)
        while self.pending:
            self.deliver(0)
        self.check()
        self.check_keys_usable()

        # Nothing lost: every message that left the queue started, was a duplicate, or has a reason.
        if self.queue_depth():
            raise PromiseBroken(
                f"promise 3 (nothing lost): {self.queue_depth()} messages left in the queue"
                + (f" (by lane: {self.queue_depths()})" if self.settings.lanes else "")
            )
        if self.parked_in_table():
            raise PromiseBroken(f"promise 3 (nothing lost): parked and never woken: {self.parked_in_table()}")
        if self.key_waiters_in_table():
            raise PromiseBroken(
                f"key line (nothing lost): in a concurrency key's line and never woken: {self.key_waiters_in_table()}"
            )
        dlq: dict[str, str] = {}
        for message in self.drain_dlq():
            attributes = message.get("MessageAttributes", {})
            reason = attributes.get("sluice-error", {}).get("StringValue", "")
            source = attributes.get("sluice-source-message-id", {}).get("StringValue", message["MessageId"])
            if not reason:
                raise PromiseBroken(
                    f"promise 3 (nothing lost): message {source} reached the DLQ without a reason"
                )
            # A re-sent copy's id: the message it stands for; by its key too (another key's message
            # under the same origin id is another message).
            body = {"MessageBody": message.get("Body", ""), "MessageAttributes": attributes}
            dlq[self.model._logical_sent(body, source)] = reason
        self.check_waiters_settled()
        waiting = self.waiters_in_table()
        for sent in self.model.sent.values():
            if sent.valid:
                message_id = self.model.logical(sent.message_id)  # a forgery sent again: the first
                accounted = (
                    message_id in self.model.started_by_message
                    or message_id in self.model.duplicates
                    or message_id in self.model.already_done
                    or (bool(awaited_keys(sent)) and message_id in waiting)
                    or (bool(awaited_keys(sent)) and dlq.get(message_id, "").startswith(AWAIT_REASON))
                    or (message_id in self.model.vanished_messages and message_id in dlq)
                )
                if not accounted:
                    raise PromiseBroken(
                        f"promise 3 (nothing lost): message {sent.message_id} (key {sent.key!r}) never started, is no "
                        "duplicate, not already done, not a waiter still parked nor one dead-lettered with its reason"
                    )
            elif sent.message_id not in dlq:
                raise PromiseBroken(
                    f"promise 5 (bad input): unusable message {sent.message_id} is not in the DLQ with a reason"
                )
        self.check()

    def check_keys_usable(self: World) -> None:
        """At rest, every concurrency key used admits a new payload at once (its slots all came back,
        and nothing on its line or kept for a woken waiter past ``INFLIGHT_SECONDS`` holds it)."""
        ckeys = sorted(
            {
                s.attributes["sluice-concurrency-key"]
                for s in self.model.sent.values()
                if s.valid and "sluice-concurrency-key" in s.attributes
            }
        )
        if not ckeys:
            return
        self.advance(INFLIGHT_SECONDS + 1)
        # With lanes, each to a lane with room for it (a lane admits no more than its MAX at once).
        lanes = [lane for lane, n in self.lane_limits_at_rest().items() for _ in range(n)]
        fresh = {
            ckey: self.send(
                json.dumps({"id": f"settle-{ckey}-{self._seq}"}),
                group=f"settle-{ckey}",
                attributes={"sluice-concurrency-key": ckey},
                lane=lanes[i % len(lanes)],
            )
            for i, ckey in enumerate(ckeys)
        }
        self.tick("A")
        self.check()
        idle = sorted(ckey for ckey, m in fresh.items() if m not in self.model.started_by_message)
        if idle:
            raise PromiseBroken(
                f"key cap (nothing leaks): concurrency keys {idle} admit no new payload at rest"
            )
        for name in sorted(self.model.running):
            self.end(name)
        while self.pending:
            self.deliver(0)
        self.check()

    def lift_rates(self: Any) -> None:
        """The stack's rate lifted (``sluice set-rate none``) for the drain and the fills at rest: a
        rate holds starts back by design, not a leak. A key's rate of a period the drain's rounds
        outlast stays in force (promise 8 is checked there too); one of an hour is lifted."""
        rates = self.operator.rates()
        overrides = rates.persistence.load().overrides
        in_force = getattr(self.model, "rates_in_force", {})  # the explorer's model follows each scope's

        def lift(scope: str) -> None:
            rates.set(scope, NONE)
            in_force[scope] = None

        if self.settings.rates.stack is not None or overrides:
            rates.set(STACK, NONE)
        scopes = set(rates.keys_set())
        if self.settings.rates.key is not None:  # every key a message named (its CKEY# may be gone)
            scopes |= {
                key_scope(s.attributes["sluice-concurrency-key"])
                for s in self.model.sent.values()
                if s.valid and "sluice-concurrency-key" in s.attributes
            }
            # A fair lane's messages without a key are its tenant ``lane:<name>``, a key too: the fills
            # at rest are such messages, which its rate, of any period, would hold back by design.
            for lane in self.settings.lanes:
                if lane.fair:
                    lift(key_scope(UNKEYED + lane.name))
        for lane in self.lane_names():  # a lane's rate, as the stack's: lifted
            if self.settings.rates.lanes.get(lane) is not None or lane_scope(lane) in overrides:
                lift(lane_scope(lane))
        for status in rates.status(sorted(scopes), self.clock.now()):
            if status.rate is not None and status.rate.period > WINDOW:
                lift(status.scope)
