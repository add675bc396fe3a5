"""Attacks on reconciliation's save of the external count in LEDGER
(``RecordsTable.save_reconciliation``), since a save whose merged count is the one saved, with a
count numbered higher than its own already saved, returns False without writing
(``records.adds_nothing``; the merge is ``sluice.core.external.ExternalCount.merged``).

The promises attacked:

1. LEDGER's external count never drops what an overlapping listing saw: overlapping listings keep
   the larger count; a count replaces another only when its listing began after the other's was
   numbered.
2. ``drift`` and ``reconciled_at`` are written only by the save whose count is numbered highest.
3. No TransientError without an injected fault, however many save at once, as long as the save's
   writes stop being overtaken; never a loop without end: overtaken in each of its five rounds
   and still adding to what is saved, it gives up with a TransientError (six reconcilers on one
   save), and it reads once more after its last refused write.
4. True only when the save's count is the latest numbered.

The real ``DynamoStore`` on moto, each reconciler with its own client. A reconciler numbers its
listing on both sides (``next_count`` before, ``next_count`` after) and saves. Interleavings are
chosen by the test: another reconciler's steps run from a botocore ``before-parameter-build`` hook
just before one of the save's requests is sent (the kind of request named by ``kind``); lost
responses are a ``before-send`` hook, registered after moto's, that raises ``ReadTimeoutError``
once moto has made the write (botocore's standard retry sends it again, as deployed). The last
part drives three or four reconcilers on threads, one request at a time in an order drawn from a seed,
and checks LEDGER and every answer against the same saves made one after another
(``MemoryTable.save_reconciliation``'s rule) in an order that keeps real time.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from botocore.exceptions import ReadTimeoutError

from sluice.adapters.dynamo.store import DynamoStore, create_table
from sluice.core.errors import TransientError
from sluice.core.external import ExternalCount
from sluice.runtime import CLIENT_CONFIG

TABLE = "sluice-overtaken"


# -- helpers ----------------------------------------------------------------------------------------


def kind(operation: str, params: dict[str, Any]) -> str:
    """The reconciliation step a DynamoDB request belongs to."""
    if operation == "GetItem":
        return "read"
    if operation != "UpdateItem":
        return operation
    condition = params.get("ConditionExpression", "")
    if not condition:
        return "number"  # next_count: ADD counts
    if condition.startswith("attribute_not_exists(external_count) OR"):
        return "first"  # the one write of a listing taken after the saved count was numbered
    return "cas"  # the read-merge-write round's write


class Steps:
    """A store's requests as sent (``sent``), and actions run just before the n-th request of a kind
    is sent (``before``); ``fired`` counts the actions run."""

    def __init__(self, store: DynamoStore) -> None:
        self.sent: list[str] = []
        self.plans: dict[str, list[Callable[[], None] | None]] = {}
        self.fired = 0
        store.client.meta.events.register("before-parameter-build.dynamodb", self._hook)

    def before(self, step: str, *actions: Callable[[], None] | None) -> Steps:
        """``actions[i]`` runs just before the (i+1)-th ``step`` request (None: nothing then)."""
        self.plans[step] = list(actions)
        return self

    def _hook(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        step = kind(model.name, params)
        seen = self.sent.count(step)
        self.sent.append(step)
        plan = self.plans.get(step, [])
        if seen < len(plan) and plan[seen] is not None:
            self.fired += 1
            plan[seen]()  # type: ignore[misc]

    def count(self, step: str) -> int:
        return self.sent.count(step)


class LostResponse:
    """The n-th ``step`` UpdateItem of a store takes effect in moto, then its answer is lost
    (``ReadTimeoutError``); ``then`` runs after the loss, before botocore's retry is built.
    ``attempts`` counts the sends of that request, ``lost`` the answers lost."""

    def __init__(
        self, store: DynamoStore, step: str, nth: int = 1, then: Callable[[], None] | None = None
    ) -> None:
        self.step, self.nth, self.then = step, nth, then
        self.seen = self.lost = 0
        self.current = ""
        self.attempts = 0
        events = store.client.meta.events
        events.register("before-parameter-build.dynamodb.UpdateItem", self._which)
        # On "before-send" itself, after moto's handler there (a handler of a more specific event
        # name would run before it: before the write).
        events.register_last("before-send", self._after_moto)

    def _which(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.current = kind(model.name, params)
        if self.current == self.step:
            self.seen += 1

    def _after_moto(self, event_name: str, **_: Any) -> None:
        if event_name != "before-send.dynamodb.UpdateItem":
            return
        if self.current != self.step or self.seen != self.nth:
            return
        self.attempts += 1
        if not self.lost:
            self.lost += 1
            if self.then is not None:
                self.then()
            raise ReadTimeoutError(endpoint_url="https://dynamodb.us-east-1.amazonaws.com")


@dataclass
class Reconciler:
    """One reconciliation's listing: numbered before it (``begin``) and after it (``number``)."""

    store: DynamoStore
    external: int
    drift: int
    now: float
    listed_after: int = 0
    count: int = 0
    answer: bool | None = field(default=None, init=False)

    def begin(self) -> Reconciler:
        self.listed_after = self.store.next_count()
        return self

    def number(self) -> Reconciler:
        self.count = self.store.next_count()
        return self

    def save(self) -> bool:
        self.answer = self.store.save_reconciliation(
            external=self.external,
            drift=self.drift,
            now=self.now,
            count=self.count,
            listed_after=self.listed_after,
        )
        return self.answer


def new_store(session: Any) -> DynamoStore:
    return DynamoStore(session.client("dynamodb", config=CLIENT_CONFIG), TABLE, retention_seconds=3600)


@pytest.fixture
def stores(session):
    """Two stores on one table, each with its own client (two reconcilers' containers)."""
    create_table(session.client("dynamodb"), TABLE)
    return new_store(session), new_store(session)


def figures(store: DynamoStore) -> tuple[int, int, int | None, int, float | None]:
    """LEDGER's external, its count and listing's start, drift, reconciled_at."""
    ledger = store.ledger()
    return ledger.external, ledger.count, ledger.listed_after, ledger.drift, ledger.reconciled_at


def raw_ledger(store: DynamoStore) -> dict[str, Any]:
    return store.client.get_item(TableName=TABLE, Key={"pk": {"S": "LEDGER"}}, ConsistentRead=True)["Item"]


def put_ledger(store: DynamoStore, **attributes: int | float) -> None:
    item: dict[str, Any] = {"pk": {"S": "LEDGER"}}
    item.update({name: {"N": str(value)} for name, value in attributes.items()})
    store.client.put_item(TableName=TABLE, Item=item)


# -- 1. the two timelines of ExternalCount's docstring, and plain tick after tick ------------------


def test_docstring_numbered_after_listing_older_zero_does_not_win(stores):
    """A lists 0; X by hand; B lists 1, numbered and saved; A numbered after B, saves its 0: X stays."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=0, drift=0, now=10.0).begin()
    b = Reconciler(b_store, external=1, drift=1, now=11.0).begin().number()
    assert b.save() is True
    a.number()  # A's count numbered after B's: it is the latest, its listing older
    assert a.save() is True
    assert figures(a_store) == (1, a.count, a.listed_after, 0, 10.0)


def test_docstring_numbered_before_listing_older_zero_does_not_win(stores):
    """A numbers 1; B numbers 2; B lists 0; X by hand; A lists 1, saves; B saves 0 numbered last: X stays."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=1, drift=5, now=10.0).begin()
    b = Reconciler(b_store, external=0, drift=6, now=11.0).begin()
    a.number()
    b.number()
    assert a.save() is True
    assert b.save() is True  # the latest numbered: its drift and time, the larger count kept
    assert figures(a_store) == (1, b.count, a.listed_after, 6, 11.0)


def test_tick_after_tick_counts_go_down_and_up(stores):
    """Ticks one after another, 3, 0, 2, 0 outside: each listing replaces the last (none overlaps)."""
    store, _ = stores
    for i, external in enumerate([3, 0, 2, 0]):
        tick = Reconciler(store, external=external, drift=i, now=float(i)).begin().number()
        steps = Steps(store)
        assert tick.save() is True
        assert steps.sent == ["first"]  # one write, no read
        assert figures(store) == (external, tick.count, tick.listed_after, i, float(i))


def test_listed_after_equal_to_anothers_count_is_an_overlap(stores):
    """As reconcile numbers: A reads the counter (1), listed_after 2; B's count numbered 2 after that read
    (saw 5), saved; A counted 3 (saw 0): 2 is not past B's 2, they overlap, B's 5 kept, A's drift."""
    a_store, b_store = stores
    b = Reconciler(b_store, external=5, drift=8, now=11.0).begin()  # 1
    a = Reconciler(a_store, external=0, drift=7, now=10.0)
    a.listed_after = a_store.ledger().numbered + 1  # 2, as sluice.launch.reconcile takes it
    b.number()  # 2: numbered after A's read, maybe after A's listing began
    a.number()  # 3
    assert (a.listed_after, b.count) == (2, 2)
    assert b.save() is True
    steps = Steps(a_store)
    assert a.save() is True
    assert steps.sent == ["first", "read", "cas"]
    assert figures(a_store) == (5, a.count, b.listed_after, 7, 10.0)


# -- 2. an older-numbered save lands after a newer one (the change) --------------------------------


def test_overlapping_older_count_with_larger_external_saved_last_is_kept(stores):
    """A numbers 1, B numbers 2, A counted 3, B 4; B saves 0; A (older, saw 2) saves last: 2 kept, B's drift."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=2, drift=7, now=10.0).begin()
    b = Reconciler(b_store, external=0, drift=8, now=11.0).begin()
    a.number()
    b.number()
    assert b.save() is True
    steps = Steps(a_store)
    assert a.save() is False  # not the latest: drift and time stay B's
    assert steps.sent == ["first", "read", "cas"]
    assert figures(a_store) == (2, b.count, a.listed_after, 8, 11.0)


def test_overlapping_older_count_with_smaller_external_adds_nothing(stores):
    """A numbers 1, B 2, A counted 3, B 4; B saves 2; A (older, saw 1) saves last: only its earlier start
    written, False; saved again it adds nothing: no write."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=1, drift=7, now=10.0).begin()
    b = Reconciler(b_store, external=2, drift=8, now=11.0).begin()
    a.number()
    b.number()
    b_listed = b.listed_after
    assert b.save() is True
    # B's listing began after A's: the saved one begins at B's number; A's earlier start is merged in.
    assert figures(a_store) == (2, b.count, b_listed, 8, 11.0)
    steps = Steps(a_store)
    assert a.save() is False
    # A's merge gives (2, 4, 1), not what is saved (2, 4, 2): it writes its earlier start, no drift.
    assert steps.sent == ["first", "read", "cas"]
    assert figures(a_store) == (2, b.count, a.listed_after, 8, 11.0)
    # Saved again (a caller's retry of the same figures): now it adds nothing, and writes nothing.
    again = Steps(a_store)
    assert a.save() is False
    assert again.sent == ["first", "read"]
    assert figures(a_store) == (2, b.count, a.listed_after, 8, 11.0)


def test_dominated_by_wider_overlapping_count_writes_nothing(stores):
    """A numbers 1 and saves 3 (counted 4); B numbers 2, counted 3, saw 1, saves last: nothing written, False."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=3, drift=7, now=10.0).begin()
    b = Reconciler(b_store, external=1, drift=8, now=11.0).begin().number()
    a.number()
    assert a.save() is True
    before = raw_ledger(a_store)
    steps = Steps(b_store)
    assert b.save() is False
    assert steps.sent == ["first", "read"]
    assert raw_ledger(a_store) == before
    assert figures(a_store) == (3, a.count, a.listed_after, 7, 10.0)


def test_older_listing_superseded_by_one_begun_after_its_count_is_replaced(stores):
    """A lists 5, counted 2; B begins 3 (after A's count), lists 0, saves; A saves last: B's 0 stands."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=5, drift=7, now=10.0).begin().number()
    b = Reconciler(b_store, external=0, drift=8, now=11.0).begin().number()
    assert b.save() is True
    steps = Steps(a_store)
    assert a.save() is False
    assert steps.sent == ["first", "read"]  # adds nothing: B saw everything A did, and later
    assert figures(a_store) == (0, b.count, b.listed_after, 8, 11.0)


def test_slow_reconciler_overtaken_by_a_newer_tick_returns_false(stores):
    """A begins 1, counted 3 (saw 5); O begins 2, counted 4 (saw 1), saves; A reads O's, B's tick (begun
    after A's count) lands before A's write: A's next read finds it adds nothing, False, no error."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=5, drift=7, now=10.0).begin()
    older = Reconciler(b_store, external=1, drift=1, now=1.0).begin()
    a.number()
    older.number()
    assert older.save() is True  # overlaps A, smaller: A must write its 5 in
    tick = Reconciler(b_store, external=0, drift=20, now=20.0)
    steps = Steps(a_store).before("cas", lambda: (tick.begin().number().save(), None)[1])
    assert a.save() is False
    assert steps.fired == 1 and tick.answer is True
    assert steps.sent == ["first", "read", "cas", "read"]
    assert figures(a_store) == (0, tick.count, tick.listed_after, 20, 20.0)


def test_save_overtaken_between_its_read_and_write_merges_again(stores):
    """A numbers 1, B 2, A counted 3, B 4 (saw 0); A reads B's, C (older, saw 3) lands before A's write:
    A merges again, the 3 kept, A's count never written as latest."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=2, drift=7, now=10.0).begin()
    c = Reconciler(b_store, external=3, drift=9, now=12.0).begin()
    b = Reconciler(b_store, external=0, drift=8, now=11.0).begin()
    c.number()
    a.number()
    b.number()
    assert b.save() is True
    steps = Steps(a_store).before("cas", lambda: (c.save(), None)[1])
    assert a.save() is False
    assert steps.fired == 1 and c.answer is False
    assert steps.sent == ["first", "read", "cas", "read", "cas"]
    assert figures(a_store) == (3, b.count, a.listed_after, 8, 11.0)


def test_latest_save_overtaken_by_older_ones_writes_its_drift_last(stores):
    """M numbers 1; R1, R2 number 2, 3 and counts 4, 5; M counted 6 (latest); R1 saves; R2 lands before
    M's write: M merges again, writes its drift, True; the largest external kept."""
    m_store, r_store = stores
    m = Reconciler(m_store, external=1, drift=7, now=10.0).begin()
    r1 = Reconciler(r_store, external=4, drift=1, now=1.0).begin()
    r2 = Reconciler(r_store, external=2, drift=2, now=2.0).begin()
    r1.number()
    r2.number()
    m.number()
    assert r1.save() is True
    steps = Steps(m_store).before("cas", lambda: (r2.save(), None)[1])
    assert m.save() is True
    assert steps.fired == 1 and r2.answer is True
    assert steps.sent == ["first", "read", "cas", "read", "cas"]
    assert figures(m_store) == (4, m.count, m.listed_after, 7, 10.0)


def test_newer_save_lands_before_first_write_keeps_its_drift(stores):
    """A numbers 1, B 2, A counted 3 (saw 4), B 4 (saw 0); B saves just before A's first write: A writes
    its 4 in without drift, False; B's drift and time stand."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=4, drift=7, now=10.0).begin()
    b = Reconciler(b_store, external=0, drift=8, now=11.0).begin()
    a.number()
    b.number()
    steps = Steps(a_store).before("first", lambda: (b.save(), None)[1])
    assert a.save() is False
    assert steps.fired == 1 and b.answer is True
    assert steps.sent == ["first", "read", "cas"]
    assert figures(a_store) == (4, b.count, a.listed_after, 8, 11.0)


def test_three_reconcilers_nested_between_reads_and_writes(session, stores):
    """A, B, C number 1, 2, 3, count 4, 5, 6 (saw 3, 1, 2); C saves; B lands inside A's round, and a
    later D (begun after all) lands inside B's: D's 0 stands, only D's drift, every answer right."""
    a_store, b_store = stores
    c_store = new_store(session)
    a = Reconciler(a_store, external=3, drift=1, now=1.0).begin()
    b = Reconciler(b_store, external=1, drift=2, now=2.0).begin()
    c = Reconciler(c_store, external=2, drift=3, now=3.0).begin()
    a.number()
    b.number()
    c.number()
    assert c.save() is True
    d = Reconciler(c_store, external=0, drift=4, now=4.0)
    b_steps = Steps(b_store).before("cas", lambda: (d.begin().number().save(), None)[1])
    a_steps = Steps(a_store).before("cas", lambda: (b.save(), None)[1])
    assert a.save() is False
    assert a_steps.fired == 1 and b_steps.fired == 1
    assert (b.answer, d.answer) == (False, True)
    assert a_steps.sent == ["first", "read", "cas", "read"]  # D's listing replaced all: nothing to add
    assert figures(a_store) == (0, d.count, d.listed_after, 4, 4.0)


# -- 3. lost responses ---------------------------------------------------------------------------------


def test_first_write_lost_and_retried_answers_true(stores):
    """A's first write lands, its answer is lost; botocore sends it again (refused: LEDGER holds A's now):
    A reads its own figures, writes them again, True."""
    a_store, _ = stores
    a = Reconciler(a_store, external=2, drift=7, now=10.0).begin().number()
    lost = LostResponse(a_store, "first")
    steps = Steps(a_store)
    assert a.save() is True
    assert lost.lost == 1 and lost.attempts == 2
    assert steps.sent == ["first", "read", "cas"]
    assert figures(a_store) == (2, a.count, a.listed_after, 7, 10.0)


def test_first_write_lost_then_newer_save_before_retry(stores):
    """A's first write lands, answer lost; B (numbered after, begun after A's count) saves before the
    retry: A's retry refused, A adds nothing, False; B's figures stand."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=5, drift=7, now=10.0).begin().number()
    b = Reconciler(b_store, external=0, drift=8, now=11.0).begin().number()
    lost = LostResponse(a_store, "first", then=lambda: (b.save(), None)[1])
    steps = Steps(a_store)
    assert a.save() is False
    assert lost.lost == 1 and lost.attempts == 2 and b.answer is True
    assert steps.sent == ["first", "read"]
    assert figures(a_store) == (0, b.count, b.listed_after, 8, 11.0)


def test_first_write_lost_then_newer_overlapping_save_keeps_larger(stores):
    """A numbers 1, B 2, A counted 3 (saw 5), B 4 (saw 0); A's first write lands, answer lost; B saves
    before the retry (merging A's 5 in): A adds nothing, False; 5 kept, B's drift."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=5, drift=7, now=10.0).begin()
    b = Reconciler(b_store, external=0, drift=8, now=11.0).begin()
    a.number()
    b.number()
    lost = LostResponse(a_store, "first", then=lambda: (b.save(), None)[1])
    assert a.save() is False
    assert lost.lost == 1 and lost.attempts == 2 and b.answer is True
    assert figures(a_store) == (5, b.count, a.listed_after, 8, 11.0)


@pytest.mark.parametrize("latest", [True, False])
def test_round_write_lost_and_retried(stores, latest):
    """A's round write lands, answer lost, retry refused: A's next read finds its own merge; True only
    when A's count is the latest (writes its figures again), else False without another write."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=4, drift=7, now=10.0).begin()
    b = Reconciler(b_store, external=1, drift=8, now=11.0).begin()
    (b if latest else a).number()
    (a if latest else b).number()
    assert b.save() is True
    lost = LostResponse(a_store, "cas")
    steps = Steps(a_store)
    assert a.save() is latest
    assert lost.lost == 1 and lost.attempts == 2
    assert steps.sent == ["first", "read", "cas", "read"] + (["cas"] if latest else [])
    newest = a if latest else b
    assert figures(a_store) == (4, newest.count, a.listed_after, newest.drift, newest.now)


def test_round_write_lost_not_retried_raises_but_the_write_stands(stores):
    """A's round write lands and its answer is lost past botocore's retries (raised from after-call):
    A raises TransientError (a fault); LEDGER holds A's merge; A's next save of the same: True."""
    a_store, b_store = stores
    a = Reconciler(a_store, external=4, drift=7, now=10.0).begin()
    b = Reconciler(b_store, external=1, drift=8, now=11.0).begin()
    b.number()
    a.number()
    assert b.save() is True
    raised: list[int] = []

    def lose(model: Any, **_: Any) -> None:
        if model.name == "UpdateItem" and steps.sent[-1] == "cas" and not raised:
            raised.append(1)
            raise ReadTimeoutError(endpoint_url="x")

    steps = Steps(a_store)
    a_store.client.meta.events.register("after-call.dynamodb.UpdateItem", lose)
    with pytest.raises(TransientError):
        a.save()
    assert raised == [1]
    assert figures(a_store) == (4, a.count, a.listed_after, 7, 10.0)
    assert a.save() is True
    assert figures(a_store) == (4, a.count, a.listed_after, 7, 10.0)


def test_lost_numbering_skips_a_number_and_keeps_order(stores):
    """A's ADD counts lands, answer lost, botocore adds again: A's listing numbered 2 (1 skipped); B
    begins 3, A counted 4 (saw 3), B 5 (saw 0): they overlap, A's 3 kept, B's drift."""
    a_store, b_store = stores
    lost = LostResponse(a_store, "number")
    a = Reconciler(a_store, external=3, drift=7, now=10.0).begin()
    assert lost.lost == 1 and a.listed_after == 2
    b = Reconciler(b_store, external=0, drift=8, now=11.0).begin()
    a.number()
    b.number()
    assert a.save() is True
    assert b.save() is True
    assert figures(a_store) == (3, b.count, a.listed_after, 8, 11.0)


# -- 4. legacy LEDGER items and equal counts --------------------------------------------------------


def test_legacy_ledger_without_counts_is_replaced(stores):
    """LEDGER from before numbering (external 4, drift, time, no external_count): a numbered save replaces it."""
    a_store, _ = stores
    put_ledger(a_store, external=4, drift=3, reconciled_at=1.0)
    a = Reconciler(a_store, external=1, drift=7, now=10.0).begin().number()
    assert a.save() is True
    assert figures(a_store) == (1, a.count, a.listed_after, 7, 10.0)


@pytest.mark.parametrize(
    ("external", "numbered_after", "answer", "saved"),
    [
        (1, False, False, None),  # smaller, older: adds nothing, nothing written
        (6, False, False, 6),  # larger, older: written in, no drift
        (1, True, True, 4),  # smaller, latest: the legacy 4 kept, A's drift
    ],
)
def test_legacy_ledger_without_external_from_is_an_overlap(stores, external, numbered_after, answer, saved):
    """LEDGER with external 4 and external_count 5 but no external_from (listing start unknown); A begun
    at 1: overlaps it whatever its count; the larger external kept, drift only if A is the latest."""
    a_store, _ = stores
    a = Reconciler(a_store, external=external, drift=7, now=10.0).begin()  # counts = 1
    put_ledger(a_store, counts=5, external=4, external_count=5, drift=3, reconciled_at=1.0)
    if numbered_after:
        a.number()  # 6
    else:
        a.count = 3  # numbered before the legacy count was saved
    steps = Steps(a_store)
    assert a.save() is answer
    if saved is None:
        assert steps.sent == ["first", "read"]
        assert "external_from" not in raw_ledger(a_store)
        assert figures(a_store) == (4, 5, 0, 3, 1.0)
    else:
        assert steps.sent == ["first", "read", "cas"]
        count, drift, now = (a.count, 7, 10.0) if answer else (5, 3, 1.0)
        assert figures(a_store) == (saved, count, 0, drift, now)


def test_ledger_with_only_the_counter_takes_the_first_save(stores):
    """LEDGER holds only ``counts`` (numbered, nothing saved yet): the first save writes once, True."""
    a_store, _ = stores
    a = Reconciler(a_store, external=2, drift=7, now=10.0).begin().number()
    assert set(raw_ledger(a_store)) == {"pk", "counts"}
    steps = Steps(a_store)
    assert a.save() is True
    assert steps.sent == ["first"]
    assert figures(a_store) == (2, a.count, a.listed_after, 7, 10.0)


def test_unnumbered_saves_with_equal_counts_keep_the_larger(stores):
    """Two saves without numbers (count 0, a caller from before numbering): the larger external kept,
    the later save's drift (equal counts: both are the latest)."""
    a_store, b_store = stores
    assert a_store.save_reconciliation(external=3, drift=1, now=1.0) is True
    assert b_store.save_reconciliation(external=1, drift=2, now=2.0) is True
    assert figures(a_store) == (3, 0, 0, 2, 2.0)


def test_same_save_twice_answers_true_and_changes_nothing(stores):
    """A saves, then saves the same figures again (a caller's retry): True, the same figures."""
    a_store, _ = stores
    a = Reconciler(a_store, external=2, drift=7, now=10.0).begin().number()
    assert a.save() is True
    assert a.save() is True
    assert figures(a_store) == (2, a.count, a.listed_after, 7, 10.0)


# -- 5. five rounds overtaken: the bound -------------------------------------------------------------


ROUNDS = 5  # records.SAVE_ROUNDS: a save's read-merge-write rounds before it gives up


def overtakers(store: DynamoStore, n: int, first: int = 0) -> list[Reconciler]:
    return [Reconciler(store, external=0, drift=100 + i, now=100.0 + i) for i in range(first, first + n)]


def saving(r: Reconciler) -> Callable[[], None]:
    return lambda: (r.save(), None)[1]


def test_latest_save_overtaken_every_round_by_older_overlapping_saves_gives_up(stores):
    """M begins 1; N1..N6 begin 2..7, count 8..13 (saw 0); M counted 14 (saw 5); N1 saves; N2..N6 each land
    between one of M's reads and its write: M (the latest) gives up after five rounds with a transient
    error (the tick is retried; its listing's starts count from the next listing, docs/protocol.md).
    Six reconcilers overlapping one save: a stack's schedule runs one tick a minute."""
    m_store, n_store = stores
    m = Reconciler(m_store, external=5, drift=7, now=10.0).begin()
    others = overtakers(n_store, 6)
    for other in others:
        other.begin()
    for other in others:
        other.number()
    m.number()
    assert others[0].save() is True
    steps = Steps(m_store).before("cas", *map(saving, others[1:]))
    with pytest.raises(TransientError, match="kept changing"):
        m.save()
    assert steps.fired == ROUNDS
    assert [o.answer for o in others] == [True] * 6  # each the latest so far
    assert figures(m_store)[:2] == (0, others[-1].count)  # nothing of M's written


def test_slow_save_with_larger_count_overtaken_every_round_by_newer_overlapping_saves_gives_up(stores):
    """M begins 1, counted 8 (saw 5); N1..N6 begin 2..7 (before M's count), count 9..14 (saw 0); N1
    saves; N2..N6 each land between one of M's reads and its write: M gives up after five rounds
    (a transient error), its larger count not written, the newer ones' figures standing."""
    m_store, n_store = stores
    m = Reconciler(m_store, external=5, drift=7, now=10.0).begin()
    others = overtakers(n_store, 6)
    for other in others:
        other.begin()
    m.number()
    for other in others:
        other.number()
    assert others[0].save() is True
    steps = Steps(m_store).before("cas", *map(saving, others[1:]))
    with pytest.raises(TransientError, match="kept changing"):
        m.save()
    assert steps.fired == ROUNDS
    assert [o.answer for o in others] == [True] * 6
    assert figures(m_store)[:2] == (0, others[-1].count)


def test_slow_save_overtaken_last_by_a_superseding_listing_answers_false(stores):
    """M begins 1, counted 6 (saw 5); N1..N5 begin 2..6, count 7..11 (saw 0); N1 saves; N2..N5 land in
    rounds 1-4; D (begun after all) lands in round 5: the read after M's last refused write finds its
    count obsolete, and M answers False (it raised before that read was made)."""
    m_store, n_store = stores
    m = Reconciler(m_store, external=5, drift=7, now=10.0).begin()
    others = overtakers(n_store, 5)
    for other in others:
        other.begin()
    m.number()
    for other in others:
        other.number()
    d = Reconciler(n_store, external=0, drift=200, now=200.0)
    assert others[0].save() is True
    steps = Steps(m_store).before(
        "cas", *map(saving, others[1:]), lambda: (d.begin().number().save(), None)[1]
    )
    try:
        answer = m.save()
    finally:
        assert steps.fired == ROUNDS
        assert d.answer is True
    assert answer is False
    assert figures(m_store) == (0, d.count, d.listed_after, 200, 200.0)


def test_four_overtaken_rounds_then_a_free_one_saves(stores):
    """As above with four overlapping overtakers only: M's fifth round is not overtaken; its 5 written."""
    m_store, n_store = stores
    m = Reconciler(m_store, external=5, drift=7, now=10.0).begin()
    others = overtakers(n_store, 5)
    for other in others:
        other.begin()
    m.number()
    for other in others:
        other.number()
    assert others[0].save() is True
    steps = Steps(m_store).before("cas", *map(saving, others[1:]))
    assert m.save() is False
    assert steps.fired == 4 and steps.count("cas") == 5
    assert figures(m_store) == (5, others[-1].count, m.listed_after, 104, 104.0)


# -- 6. three reconcilers on threads, interleaved by a seed --------------------------------------------


class Turns:
    """One DynamoDB request at a time: each reconciler's thread waits before each send (every botocore
    attempt) until the driver, drawing from a seeded RNG, lets it go."""

    def __init__(self, rng: random.Random, names: list[str]) -> None:
        self.rng = rng
        self.cv = threading.Condition()
        self.busy = set(names)
        self.waiting: set[str] = set()
        self.granted: str | None = None
        self.steps = 0

    def hook(self, name: str) -> Callable[..., None]:
        def before_send(**_: Any) -> None:
            with self.cv:
                self.busy.discard(name)
                self.waiting.add(name)
                self.cv.notify_all()
                assert self.cv.wait_for(lambda: self.granted == name, timeout=30)
                self.granted = None
                self.waiting.discard(name)
                self.busy.add(name)
                self.steps += 1

        return before_send

    def clock(self) -> int:
        with self.cv:
            return self.steps

    def done(self, name: str) -> None:
        with self.cv:
            self.busy.discard(name)
            self.cv.notify_all()

    def drive(self) -> None:
        while True:
            with self.cv:
                assert self.cv.wait_for(lambda: not self.busy and self.granted is None, timeout=30)
                if not self.waiting:
                    return
                self.granted = self.rng.choice(sorted(self.waiting))
                self.cv.notify_all()


class Faults:
    """Lost answers: the ``chosen`` calls (by their order among the run's UpdateItem calls) are made in
    moto, then their answer is lost on the first attempt (botocore sends them again)."""

    def __init__(self, chosen: set[int]) -> None:
        self.chosen, self.calls, self.lost = chosen, 0, 0
        self.fresh: dict[str, bool] = {}
        self.losers: set[str] = set()  # the reconcilers an answer was lost to

    def attach(self, client: Any, name: str) -> None:
        def new_call(model: Any, **_: Any) -> None:
            self.fresh[name] = model.name == "UpdateItem"

        def after_moto(event_name: str, **_: Any) -> None:
            if event_name != "before-send.dynamodb.UpdateItem" or not self.fresh.get(name):
                return
            self.fresh[name] = False
            self.calls += 1
            if self.calls in self.chosen:
                self.lost += 1
                self.losers.add(name)
                raise ReadTimeoutError(endpoint_url="x")

        client.meta.events.register("before-call.dynamodb", new_call)
        client.meta.events.register_last("before-send", after_moto)  # after moto's (LostResponse)


@dataclass
class Run:
    name: str
    reconciler: Reconciler
    began: int = 0
    ended: int = 0
    error: BaseException | None = None


def one_after_another(runs: list[Run], order: tuple[Run, ...]) -> tuple[tuple, dict[str, bool]]:
    """LEDGER's figures and each answer when the saves are made one after another in ``order``
    (the merge, as ``MemoryTable.save_reconciliation`` makes it)."""
    saved = ExternalCount(0, 0, 0)
    drift: int | None = None
    now: float | None = None
    answers: dict[str, bool] = {}
    for run in order:
        r = run.reconciler
        merged = ExternalCount(r.external, r.count, r.listed_after).merged(saved)
        latest = r.count >= saved.count
        saved = ExternalCount(merged.external, merged.count, merged.began)
        if latest:
            drift, now = r.drift, r.now
        answers[run.name] = latest
    return (saved.external, saved.count, saved.listed_after, drift, now), answers


@pytest.mark.parametrize("seed", range(60))
def test_reconcilers_on_threads_match_some_serial_order(session, seed):
    """Three or four reconcilers number, list and save on threads, requests interleaved by the seed,
    none, one or two lost answers: no error; LEDGER and each answer as some real-time order gives."""
    create_table(session.client("dynamodb"), TABLE)
    rng = random.Random(seed)
    names = ["A", "B", "C", "D"][: 3 + seed % 2]
    # Each overtaking save and each lost answer of its own costs a save one round: fewer than five.
    budget = 0 if seed % 3 == 0 else 5 - len(names)
    turns = Turns(rng, names)
    faults = Faults(set(rng.sample(range(1, 3 * len(names) + 1), budget)))
    runs: list[Run] = []
    for i, name in enumerate(names):
        store = new_store(session)
        store.client.meta.events.register_first("before-send.dynamodb", turns.hook(name))
        faults.attach(store.client, name)
        runs.append(Run(name, Reconciler(store, external=rng.randrange(4), drift=i + 1, now=float(i + 1))))

    def work(run: Run) -> None:
        try:
            run.reconciler.begin()
            run.reconciler.number()
            run.began = turns.clock()
            run.reconciler.save()
            run.ended = turns.clock()
        except BaseException as exc:
            run.error = exc
        finally:
            turns.done(run.name)

    threads = [threading.Thread(target=work, args=(run,), daemon=True) for run in runs]
    for thread in threads:
        thread.start()
    turns.drive()
    for thread in threads:
        thread.join(timeout=30)
    assert [run.error for run in runs] == [None] * len(runs)
    assert faults.lost == budget
    observed = figures(new_store(session))  # a client without the turns' hook
    answers = {run.name: run.reconciler.answer for run in runs}
    orders = [
        order
        for order in itertools.permutations(runs)
        if all(not (b.ended <= a.began) for i, a in enumerate(order) for b in order[i + 1 :])
    ]

    # A save whose own write's answer was lost may answer False where it wrote as the latest: a newer
    # count was saved before its retry (its drift already overwritten); the answer says so.
    def matches(outcome: tuple[tuple, dict[str, bool]]) -> bool:
        serial, said = outcome
        return serial == observed and all(
            answers[n] == said[n] or (n in faults.losers and said[n] and not answers[n]) for n in said
        )

    assert any(map(matches, map(lambda order: one_after_another(runs, order), orders))), (
        [(r.name, r.reconciler.external, r.reconciler.listed_after, r.reconciler.count) for r in runs],
        answers,
        observed,
        [(r.name, r.began, r.ended) for r in runs],
        faults.losers,
    )
    # Promise 1 directly: no saved listing that none began after its count is dropped.
    standing = [
        r.reconciler.external
        for r in runs
        if not any(o.reconciler.listed_after > r.reconciler.count for o in runs)
    ]
    assert observed[0] >= max(standing)
    # Promise 2: drift and time are the highest-numbered save's.
    top = max(runs, key=lambda r: r.reconciler.count).reconciler
    assert observed[1:] == (top.count, observed[2], top.drift, top.now)
    assert top.answer is True
